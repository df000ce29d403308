"""The pure schedule tables (``pipeline.schedule_tables``) equal megatron-core's own, over a grid of shapes.

``megatron.schedule.megatron_schedule_tables`` asks megatron-core's ``get_schedule_table`` and
``get_pp_rank_microbatches``; ``pipeline.schedule_tables.schedule_tables`` computes the same without
megatron, so offline planning imports neither torch nor megatron-core. Both are replayed into orders by the
same ``pipeline_orders``; the grid covers 1F1B (fewer microbatches than stages included), interleaved
(2 to 4 chunks, several microbatch group sizes, a shorter last group) and combined 1F1B.
"""

from __future__ import annotations

import pytest

from megatron_energy.megatron.schedule import megatron_schedule_tables
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.schedule_tables import ScheduleShape, schedule_tables


def _valid(shape: dict) -> bool:
    try:
        ScheduleShape(**shape)
    except ValueError:
        return False
    return True


def _shapes() -> list[dict]:
    one_f_one_b = [
        {"num_stages": stages, "num_microbatches": microbatches}
        for stages in (1, 2, 3, 4, 8)
        for microbatches in (1, 2, 3, 5, 8, 13, 32)
    ]
    interleaved = [
        {
            "num_stages": stages,
            "num_microbatches": microbatches,
            "num_chunks": chunks,
            "microbatch_group_size": group,
            "combined": combined,
        }
        for stages in (2, 3, 4, 8)
        for chunks in (2, 3, 4)
        for group in (None, stages + 1, 2 * stages)
        for microbatches in (stages, 2 * stages, 3 * stages, 2 * stages + stages // 2 + 1, 32)
        for combined in (False, True)
    ]
    combined_without_pipelining = [
        {"num_stages": 1, "num_microbatches": microbatches, "combined": True} for microbatches in (1, 2, 3, 8)
    ]
    return [shape for shape in one_f_one_b + interleaved + combined_without_pipelining if _valid(shape)]


SHAPES = _shapes()


def _shape_id(shape: dict) -> str:
    return "pp{}-m{}-vpp{}-g{}{}".format(
        shape["num_stages"],
        shape["num_microbatches"],
        shape.get("num_chunks", 1),
        shape.get("microbatch_group_size"),
        "-combined" if shape.get("combined") else "",
    )


def test_the_grid_covers_every_schedule_and_group_sizes_other_than_the_pipeline_size() -> None:
    kinds = {(shape.get("num_chunks", 1) > 1, shape.get("combined", False)) for shape in SHAPES}
    assert kinds == {(False, False), (True, False), (True, True), (False, True)}
    assert any(shape["num_microbatches"] < shape["num_stages"] for shape in SHAPES)
    assert any(shape.get("microbatch_group_size") not in (None, shape["num_stages"]) for shape in SHAPES)
    # a last microbatch group shorter than the others (megatron-core takes it when it is >= the stages)
    assert any(
        shape["num_microbatches"] % ScheduleShape(**shape).group_size and shape.get("num_chunks", 1) > 1
        for shape in SHAPES
    )


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
def test_the_pure_tables_and_orders_equal_megatron_cores(shape: dict) -> None:
    schedule = ScheduleShape(**shape)
    assert schedule_tables(schedule) == megatron_schedule_tables(schedule)
    assert pipeline_orders(**shape) == pipeline_orders(**shape, tables=megatron_schedule_tables)
