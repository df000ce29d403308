"""The session's collectives under an NCCL job run over gloo groups of the same ranks (never on the GPU).

A real 4-rank gloo world with two 2-stage pipelines plays the job; ``torch.distributed.get_backend`` as the
session reads it answers ``nccl`` (torch's own internals still see gloo), so ``control_plane_comms`` takes
the path of a GPU job: new gloo groups, every rank creating them in the same order. The job's device is
given as ``cuda``: a collective that still put its tensor there would fail on this CPU-only machine.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist
from megatron_harness import spawn_world

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

PIPELINES = ([0, 1], [2, 3])


def _control_plane_worker(rank: int, world_size: int, gloo_available: bool) -> dict[str, Any]:
    from torch.distributed import distributed_c10d

    from megatron_energy.runtime.comms import control_plane_comms

    job_groups = [dist.new_group(ranks) for ranks in PIPELINES]  # Megatron's pipeline groups, every rank
    job_pipeline = job_groups[rank // 2]
    dist.get_backend = lambda group=None: "nccl"  # type: ignore[assignment]  # the job as the session sees it
    if not gloo_available:
        dist.is_gloo_available = lambda: False  # type: ignore[assignment]
    lines: list[str] = []
    comms = control_plane_comms(job_pipeline, "cuda", lines.append)
    report: dict[str, Any] = {
        "lines": lines,
        "own_pipeline_group": comms.pipeline_group is not job_pipeline,
        "pipeline_ranks": dist.get_process_group_ranks(comms.pipeline_group),
        "pipeline_backend": distributed_c10d.get_backend(comms.pipeline_group),
    }
    if gloo_available:
        report["world_backend"] = distributed_c10d.get_backend(comms.world_group)
        report["stage_ends"] = comms.all_gather_pipeline(10 * rank)
        report["max"] = comms.all_reduce_max([float(rank), -float(rank)])
        report["gathered"] = comms.gather_to_root(rank)
        report["broadcast"] = comms.broadcast_from_root(f"plan of rank {rank}")
    return report


def test_the_session_talks_over_new_gloo_groups_of_the_same_ranks_in_an_nccl_job(tmp_path):
    reports = spawn_world(_control_plane_worker, 4, tmp_path, payload=True)
    for rank, report in enumerate(reports):
        assert report["lines"] == []
        assert report["own_pipeline_group"]
        assert report["pipeline_ranks"] == PIPELINES[rank // 2]
        assert report["pipeline_backend"] == report["world_backend"] == "gloo"
        assert report["stage_ends"] == [10 * r for r in PIPELINES[rank // 2]]
        assert report["max"] == [3.0, 0.0]
        assert report["gathered"] == ([0, 1, 2, 3] if rank == 0 else None)
        assert report["broadcast"] == "plan of rank 0"


def test_without_gloo_the_job_groups_are_used_and_each_rank_says_so_once(tmp_path):
    reports = spawn_world(_control_plane_worker, 4, tmp_path, payload=False)
    for rank, report in enumerate(reports):
        assert not report["own_pipeline_group"]
        assert report["pipeline_ranks"] == PIPELINES[rank // 2]
        (line,) = report["lines"]
        assert line.startswith(f"[energy] rank {rank}: no gloo groups (this torch has no gloo backend)")
        assert "job's nccl groups" in line


def _alone_worker(rank: int, world_size: int, payload: None) -> dict[str, Any]:
    from megatron_energy.runtime.comms import TorchComms

    pipeline = dist.new_group([rank])  # every rank its own pipeline: PP=1
    comms = TorchComms(pipeline)
    report: dict[str, Any] = {"max": comms.all_reduce_max([float(rank)])}  # a real collective when world > 1

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a collective ran on a group of one rank")

    dist.all_gather_object = refuse  # type: ignore[assignment]
    report["stage_ends"] = comms.all_gather_pipeline(rank)
    if world_size == 1:
        dist.gather_object = dist.broadcast_object_list = dist.all_reduce = refuse  # type: ignore[assignment]
        report["gathered"] = comms.gather_to_root("mine")
        report["broadcast"] = comms.broadcast_from_root("plan")
        report["max"] = comms.all_reduce_max([1.0, -2.0])
    return report


@pytest.mark.parametrize("world_size", [1, 2])
def test_groups_of_one_rank_run_no_collective(tmp_path, world_size):
    reports = spawn_world(_alone_worker, world_size, tmp_path)
    for rank, report in enumerate(reports):
        assert report["stage_ends"] == [rank]
        if world_size == 1:
            assert (report["gathered"], report["broadcast"], report["max"]) == (["mine"], "plan", [1.0, -2.0])
        else:
            assert report["max"] == [1.0]
