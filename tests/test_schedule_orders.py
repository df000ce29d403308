from collections import Counter

import pytest

from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.schedule_tables import check_schedule_arguments


def _orders(*args, **kwargs) -> list[list[tuple[str, int, int]]]:
    """Every rank's order as ``(kind, microbatch, chunk)``, the way megatron-core's tables read."""
    orders = pipeline_orders(*args, **kwargs)
    assert all(i.stage == stage for stage in range(orders.num_stages) for i in orders.stage(stage))
    return [
        [(i.kind, i.microbatch, i.chunk) for i in orders.stage(stage)] for stage in range(orders.num_stages)
    ]


def _short(order):
    return " ".join(f"{kind[0].upper()}{microbatch}c{chunk}" for kind, microbatch, chunk in order)


def test_1f1b_matches_megatron_run_pp2_m4():
    rank0, rank1 = _orders(2, 4)
    assert _short(rank0) == "F0c0 F1c0 B0c0 F2c0 B1c0 F3c0 B2c0 B3c0"
    assert _short(rank1) == "F0c0 B0c0 F1c0 B1c0 F2c0 B2c0 F3c0 B3c0"


def test_interleaved_matches_megatron_run_pp2_vpp2_m4():
    rank0, rank1 = _orders(2, 4, num_chunks=2)
    assert _short(rank0).startswith("F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 B")
    assert "".join(kind[0].upper() for kind, _, _ in rank0) == "FFFFFBFBFBFBBBBB"
    assert "".join(kind[0].upper() for kind, _, _ in rank1) == "FFFBFBFBFBFBFBBB"


def test_interleaved_backward_visits_chunks_from_the_last_down():
    for order in _orders(4, 8, num_chunks=3):
        for microbatch in range(8):
            chunks = [chunk for kind, m, chunk in order if kind == "backward" and m == microbatch]
            assert chunks == [2, 1, 0]


@pytest.mark.parametrize(
    ("stages", "microbatches", "chunks"), [(1, 3, 1), (2, 1, 1), (3, 5, 1), (4, 8, 1), (4, 8, 2), (3, 9, 3)]
)
def test_every_rank_runs_one_forward_and_one_backward_per_microbatch_and_chunk(stages, microbatches, chunks):
    orders = _orders(stages, microbatches, chunks)
    assert len(orders) == stages
    expected = Counter(
        (kind, m, c) for kind in ("forward", "backward") for m in range(microbatches) for c in range(chunks)
    )
    for order in orders:
        assert Counter(order) == expected
        for m in range(microbatches):
            for c in range(chunks):
                assert order.index(("forward", m, c)) < order.index(("backward", m, c))


@pytest.mark.parametrize(("stages", "microbatches"), [(4, 8), (4, 2), (8, 3)])
def test_1f1b_is_warmup_forwards_then_steady_pairs_then_cooldown_backwards(stages, microbatches):
    for rank, order in enumerate(_orders(stages, microbatches)):
        leading = min(
            stages - rank, microbatches
        )  # warm-up (stages - rank - 1) plus the first steady forward
        kinds = "".join(kind[0].upper() for kind, _, _ in order)
        assert kinds == "F" * leading + "BF" * (microbatches - leading) + "B" * leading


def test_chunk_sequence_agrees_with_megatron_convert_schedule_table_to_order():
    from megatron.core.pipeline_parallel.schedules import get_schedule_table
    from megatron.core.transformer.cuda_graphs import convert_schedule_table_to_order

    stages, microbatches, chunks = 4, 12, 2
    table = get_schedule_table(microbatches, chunks, stages)
    for order in _orders(stages, microbatches, chunks):
        warmup = next(i for i, (kind, _, _) in enumerate(order) if kind == "backward") - 1
        # TransformerEngine's order format: +k forward of chunk k (1-based), -k its backward.
        signed = [chunk + 1 if kind == "forward" else -(chunk + 1) for kind, _, chunk in order]
        assert signed == convert_schedule_table_to_order(warmup, chunks, table)


@pytest.mark.parametrize(
    ("stages", "microbatches", "chunks", "message"),
    [
        (4, 6, 2, "multiple of 4"),
        (4, 2, 2, "at least 4 microbatches"),
        (1, 4, 2, "at least 2 pipeline stages"),
        (0, 4, 1, "must all be >= 1"),
        (2, 0, 1, "must all be >= 1"),
    ],
)
def test_invalid_combinations_are_refused_clearly(stages, microbatches, chunks, message):
    with pytest.raises(ValueError, match=message):
        check_schedule_arguments(stages, microbatches, chunks)
    with pytest.raises(ValueError, match=message):
        _orders(stages, microbatches, chunks)


def test_a_large_interleaved_schedule_lists_every_instruction_once():
    orders = _orders(16, 256, 2)
    assert (
        sum(map(len, orders))
        == len({(r, *i) for r, order in enumerate(orders) for i in order})
        == 16 * 256 * 2 * 2
    )
