"""The CPU harness runs megatron-core's real 1F1B and interleaved schedules on a real GPTModel."""

from __future__ import annotations

import math

import pytest
from megatron_harness import PipelineWorld, spawn_world

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

NUM_MICROBATCHES = 4


def _train_one_step(rank: int, world_size: int, payload: None) -> dict:
    results = {}
    for name, virtual_size in (("1f1b", None), ("interleaved", 2)):
        world = PipelineWorld(pipeline_size=world_size, virtual_size=virtual_size)
        losses = world.run(NUM_MICROBATCHES)
        results[name] = {
            "losses": losses,
            "is_last_stage": world.is_last_stage,
            "grad_norms": world.grad_norms(),
            "num_chunks": len(world.chunks),
        }
    return results


@pytest.fixture(scope="module")
def two_stage_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return spawn_world(_train_one_step, world_size=2, result_dir=tmp_path_factory.mktemp("harness"))


@pytest.mark.parametrize(("name", "num_chunks"), [("1f1b", 1), ("interleaved", 2)])
def test_two_stage_step_gives_finite_loss_and_gradients_on_every_rank(
    two_stage_results: list[dict], name: str, num_chunks: int
) -> None:
    for rank, results in enumerate(two_stage_results):
        result = results[name]
        assert result["num_chunks"] == num_chunks
        assert result["is_last_stage"] == (rank == 1)
        if result["is_last_stage"]:
            assert len(result["losses"]) == NUM_MICROBATCHES
            # untrained GPT over a 64-token vocabulary: cross-entropy near ln(64) = 4.16
            assert all(math.isfinite(loss) and 3.0 < loss < 6.0 for loss in result["losses"])
        else:
            assert result["losses"] == []
        assert all(norm > 0.0 and math.isfinite(norm) for norm in result["grad_norms"])
