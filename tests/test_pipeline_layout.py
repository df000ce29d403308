"""Uneven model chunks (``--pipeline-model-parallel-layout``, Megatron's uneven-split flags), planned and run.

A layout places the decoder layers (and the embedding and loss) over the pipeline's model chunks, unevenly;
its number of stages over the pipeline size is the virtual size. The instruction orders do not depend on the
layer counts (megatron-core's schedule only sees pipeline size, chunks, microbatches and group size); the work
of each (stage, chunk) does, and so does where the collective scheduler would launch a bucket.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from launcher_world import run_launcher, traced_plan_argv

from megatron_energy.dvfs.model import GpuPowerModel
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.errors import EnergyValueError
from megatron_energy.events import read_trace
from megatron_energy.megatron.pipeline_layout import job_layers, layout_layers
from megatron_energy.pipeline.chunk_layers import ChunkLayers
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.profile import Profile
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import TransformerShape, instruction_work
from megatron_energy.plan_file import load_plan
from megatron_energy.runtime.assembly import require_even_layers
from megatron_energy.runtime.context import JobContext

LAYOUT = "E|t*3|t|tL"
"""With PP=2, 2 virtual stages: rank 0 holds the embedding alone, then 1 layer; rank 1: 3, then 1 + loss."""
LAYOUT_LAYERS = ((0, 1), (3, 1))
NUM_MICROBATCHES = 4
TRAIN_ITERS = 9  # 8 profiling steps (as in test_megatron_launch), then the plan runs
MEGATRON_ARGS = [
    "--num-layers", "5", "--hidden-size", "16", "--num-attention-heads", "2",
    "--seq-length", "8", "--max-position-embeddings", "8", "--vocab-size", "64",
    "--micro-batch-size", "2", "--global-batch-size", str(2 * NUM_MICROBATCHES),
    "--train-iters", str(TRAIN_ITERS), "--lr", "1e-4",
    "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", LAYOUT,
    "--mock-data", "--tokenizer-type", "NullTokenizer",
]  # fmt: skip
SHAPE = TransformerShape(5, 16, 64, 2, 8, 2, 64)


def test_megatron_cores_parser_gives_the_layers_of_every_chunk() -> None:
    assert layout_layers(LAYOUT, 2, 5) == ChunkLayers(LAYOUT_LAYERS)
    assert layout_layers("Et*3|tL", 2, 4).counts == ((3,), (1,))  # no interleaving: one chunk per stage
    assert layout_layers("Et|tL", 2, 2).is_even


@pytest.mark.parametrize(
    ("flags", "counts"),
    [
        ({"num_layers": 5, "decoder_first_pipeline_num_layers": 1}, ((1,), (4,))),
        ({"num_layers": 5, "account_for_embedding_in_pipeline_split": True}, ((2,), (3,))),
        (
            {
                "num_layers": 6,
                "virtual_pipeline_model_parallel_size": 2,
                "account_for_embedding_in_pipeline_split": True,
                "account_for_loss_in_pipeline_split": True,
            },
            ((1, 2), (2, 1)),
        ),
    ],
)
def test_megatrons_other_uneven_split_flags_give_the_chunks_megatron_core_builds(
    flags: dict[str, Any], counts: tuple[tuple[int, ...], ...]
) -> None:
    args = SimpleNamespace(
        **{"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": None} | flags
    )
    assert job_layers(args) == ChunkLayers(counts)


def test_without_layout_or_split_flags_the_split_is_even() -> None:
    assert job_layers(SimpleNamespace(num_layers=4, pipeline_model_parallel_size=2)) is None
    layout_args = SimpleNamespace(
        num_layers=5, pipeline_model_parallel_size=2, pipeline_model_parallel_layout=LAYOUT
    )
    assert job_layers(layout_args) == ChunkLayers(LAYOUT_LAYERS)


def test_a_layout_with_another_layer_count_than_num_layers_is_refused() -> None:
    with pytest.raises(EnergyValueError, match="places 5 decoder layers but --num-layers is 6"):
        layout_layers(LAYOUT, 2, 6)


def test_chunk_layers_refuse_ragged_or_negative_counts() -> None:
    with pytest.raises(ValueError, match="same number of chunks"):
        ChunkLayers(((1, 1), (2,)))
    with pytest.raises(ValueError, match="cannot be negative"):
        ChunkLayers(((1,), (-1,)))
    with pytest.raises(ValueError, match="do not split evenly over 2 stages x 2 chunks"):
        ChunkLayers.even(5, 2, 2)


def test_the_work_of_each_chunk_follows_the_layout() -> None:
    spec = load_gpu_spec("h100-sxm")
    work = instruction_work(SHAPE, spec, 2, 2, ChunkLayers(LAYOUT_LAYERS))
    model = GpuPowerModel(spec)

    def time_s(key: Work) -> float:
        return model.time_s(work[key], spec.max_sm_clock_mhz)

    for kind in ("forward", "backward"):
        assert time_s(Work(1, 0, kind)) == pytest.approx(3 * time_s(Work(0, 1, kind)))
        assert 0 < time_s(Work(0, 0, kind)) < time_s(Work(0, 1, kind))  # the embedding alone
    with pytest.raises(ValueError, match="does not fit 2 stages x 1 chunks"):
        instruction_work(SHAPE, spec, 2, 1, ChunkLayers(LAYOUT_LAYERS))


def test_collective_planning_refuses_uneven_chunks_and_names_the_way_out() -> None:
    with pytest.raises(EnergyValueError) as refused:
        require_even_layers("kareus", True, ChunkLayers(LAYOUT_LAYERS))
    message = str(refused.value)
    assert "--energy-mode kareus" in message and "stage 0: 0+1, stage 1: 3+1" in message
    assert "use --energy-mode perseus or kernel" in message
    require_even_layers("perseus", False, ChunkLayers(LAYOUT_LAYERS))  # the clock planners take it
    require_even_layers("kareus", True, ChunkLayers.even(4, 2, 2))
    require_even_layers("kareus", True, None)


def test_two_layouts_of_one_model_have_different_fingerprints() -> None:
    orders = pipeline_orders(2, NUM_MICROBATCHES, 2)
    contexts = [
        JobContext(0, orders, 0, 1, shape=SHAPE, layers=layers)
        for layers in (None, ChunkLayers(LAYOUT_LAYERS), ChunkLayers(((1, 1), (2, 1))))
    ]
    parts = [context.job_facts("h100-sxm").to_parts() for context in contexts]
    assert parts[0] != parts[1] != parts[2]
    assert "layers" not in parts[0]  # jobs without a layout keep their fingerprints


@pytest.mark.world
def test_a_layout_job_profiles_plans_and_runs_megatrons_order_through_the_launcher(tmp_path: Path) -> None:
    """Two gloo ranks run the layout (an embedding-only chunk, 3 layers in another) through the launcher.

    Regression: the session failed to start ("5 layers do not split evenly over 2 stages x 2 chunks") and the
    job trained at stock clocks; a layout whose layers did split evenly was modelled as evenly split.
    """
    run = run_launcher(traced_plan_argv(MEGATRON_ARGS, tmp_path), 2, tmp_path)
    assert run.statuses == (0, 0), run.output[-4000:]
    assert "not optimising" not in run.output, run.output[-4000:]
    expected = pipeline_orders(2, NUM_MICROBATCHES, 2)
    for rank in (0, 1):
        events = read_trace(tmp_path / f"trace.jsonl.rank{rank}")
        for step in range(TRAIN_ITERS):
            executed = [
                (e["kind"], e["microbatch"], e["chunk"])
                for e in events
                if e["step"] == step and e["event"] == "instruction_begin"
            ]
            assert executed == [(i.kind, i.microbatch, i.chunk) for i in expected.stage(rank)]
    (plan_file,) = (tmp_path / "energy").glob("*/plan.json")
    plan = load_plan(plan_file)
    for rank in (0, 1):
        for point in plan.points:
            assert [action.at.instruction for action in point.ranks[rank].actions] == list(
                expected.stage(rank)
            )
    profile = Profile.from_csv(plan_file.with_name("profile.csv"), gpu_name="h100-sxm")
    for kind in ("forward", "backward"):  # 3 layers on stage 1's chunk 0, 1 on stage 0's chunk 1
        ratio = profile.fastest(Work(1, 0, kind)).time_s / profile.fastest(Work(0, 1, kind)).time_s
        assert ratio == pytest.approx(3, rel=0.05)
