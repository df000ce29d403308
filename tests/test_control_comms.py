"""The session's collectives under an NCCL job run over gloo groups of the same ranks (never on the GPU).

A real 4-rank gloo world with two 2-stage pipelines plays the job; ``torch.distributed.get_backend`` as the
session reads it answers ``nccl`` (torch's own internals still see gloo), so ``control_plane_comms`` takes
the path of a GPU job: new gloo groups, every rank creating them in the same order. The job's device is
given as ``cuda``: a collective that still put its tensor there would fail on this CPU-only machine.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from megatron_harness import spawn_world

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
