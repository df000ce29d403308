"""The session's collectives under an NCCL job run over gloo groups of the job's own groups (never the world).

A real 8-rank gloo world plays a PP=2 x TP=2 x DP=2 job with megatron-core's own parallel state;
``torch.distributed.get_backend`` as the session reads it answers ``nccl`` (torch's own internals still see
gloo), so ``control_plane_comms`` takes the path of a GPU job: each rank creates a gloo group of the same
ranks as each of its pipeline, tensor and data-parallel groups, with ``use_local_synchronization`` (every
call is recorded), and no group of the world. The job's device is given as ``cpu`` for the job's own groups'
agreement (there is no GPU here); every collective the session then runs goes over the new gloo groups.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist
from log_lines import capture_lines
from megatron_harness import spawn_world

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

SIZES = {"pipeline": 2, "tensor": 2, "data": 2}


def _job_groups() -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    return {
        "pipeline": ps.get_pipeline_model_parallel_group(),
        "tensor": ps.get_tensor_and_context_parallel_group(),
        "data": ps.get_data_parallel_group(),
    }


def _control_plane_worker(rank: int, world_size: int, fault: str | None) -> dict[str, Any]:
    from torch.distributed import distributed_c10d

    from megatron_energy.runtime.control_plane.gloo_groups import control_plane_comms
    from megatron_energy.runtime.control_plane.group_chain import (
        broadcast_from_root,
        gather_replica,
        reduce_everywhere,
    )

    job = _job_groups()
    created: list[tuple[list[int], dict[str, Any]]] = []
    new_group = dist.new_group

    def recording_new_group(ranks: list[int], **kwargs: Any) -> Any:
        created.append((list(ranks), kwargs))
        group = new_group(ranks, **kwargs)  # the peers complete theirs: the fault is this rank's alone
        if fault == "rank 5" and rank == 5 and len(created) == 2:
            raise RuntimeError("no route to the peers (injected)")
        return group

    dist.new_group = recording_new_group  # type: ignore[assignment]
    if fault == "no gloo":
        dist.is_gloo_available = lambda: False  # type: ignore[assignment]
    dist.get_backend = lambda group=None: "nccl"  # type: ignore[assignment]  # the job as the session sees it
    lines = capture_lines()
    comms = control_plane_comms(job, "cpu")
    report: dict[str, Any] = {
        "lines": lines,
        "created": created,
        "own": {name: comms.process_group(name) is not group for name, group in job.items()},
        "ranks": {name: dist.get_process_group_ranks(comms.process_group(name)) for name in job},
        "job_ranks": {name: dist.get_process_group_ranks(group) for name, group in job.items()},
        "backends": {name: distributed_c10d.get_backend(comms.process_group(name)) for name in job},
    }
    report["max"] = reduce_everywhere(comms, [float(rank), -float(rank)])
    report["broadcast"] = broadcast_from_root(comms, f"plan of rank {rank}")
    report["gathered"] = gather_replica(comms, rank)
    report["pending"] = comms.start_all_reduce([1.0], "sum", "data").wait()
    return report


def test_the_session_talks_over_new_gloo_groups_of_the_job_groups_and_none_of_the_world(tmp_path):
    reports = spawn_world(_control_plane_worker, 8, tmp_path, payload=None)
    local = {"backend": "gloo", "use_local_synchronization": True}
    for report in reports:
        assert report["lines"] == []
        # one gloo group per job group, created by its own ranks alone: no world group, no world barrier
        assert [ranks for ranks, _ in report["created"]] == [report["job_ranks"][name] for name in SIZES]
        assert all(kwargs == local for _, kwargs in report["created"])
        assert all(len(ranks) < 8 for ranks, _ in report["created"])
        assert all(report["own"].values())
        assert report["ranks"] == report["job_ranks"]
        assert set(report["backends"].values()) == {"gloo"}
        assert report["max"] == [7.0, 0.0]  # the chain over the three groups reaches every rank
        assert report["broadcast"] == "plan of rank 0"  # down the tree from rank 0
        assert report["pending"] == [2.0]
    # the planning replica (data rank 0, tensor rank 0: ranks 0 and 4 here) gathers on rank 0 alone
    assert reports[0]["gathered"] == [0, 4]
    assert all(report["gathered"] is None for report in reports[1:])


@pytest.mark.parametrize("fault", ["rank 5", "no gloo"])
def test_a_rank_that_cannot_create_its_groups_sends_every_rank_to_the_job_groups(tmp_path, fault):
    reports = spawn_world(_control_plane_worker, 8, tmp_path, payload=fault)
    for rank, report in enumerate(reports):
        assert not any(report["own"].values())  # every rank, not only rank 5: one set of communicators
        (line,) = report["lines"]
        why = (
            "this torch has no gloo backend"
            if fault == "no gloo"
            else "no route to the peers (injected)"
            if rank == 5
            else "another rank could not create its gloo groups"
        )
        assert line.startswith(f"[energy] rank {rank}: no gloo groups ({why})")
        assert "job's nccl groups" in line
        assert report["max"] == [7.0, 0.0] and report["broadcast"] == "plan of rank 0"


def _alone_worker(rank: int, world_size: int, payload: None) -> dict[str, Any]:
    from megatron_energy.runtime.control_plane.comms import TorchComms
    from megatron_energy.runtime.control_plane.group_chain import (
        broadcast_from_root,
        gather_replica,
        reduce_everywhere,
    )

    alone = dist.new_group([rank])
    data = dist.new_group(list(range(world_size)))  # every rank its own pipeline and tensor group: PP=TP=1
    comms = TorchComms({"pipeline": alone, "tensor": alone, "data": data})
    report: dict[str, Any] = {"max": reduce_everywhere(comms, [float(rank)])}  # a collective when world > 1

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a collective ran on a group of one rank")

    dist.all_gather_object = dist.gather_object = refuse  # type: ignore[assignment]
    report["stage_ends"] = comms.all_gather(rank, "pipeline")
    report["gathered"] = gather_replica(comms, "mine") if rank == 0 else None
    if world_size == 1:
        dist.broadcast_object_list = dist.all_reduce = refuse  # type: ignore[assignment]
        report["broadcast"] = broadcast_from_root(comms, "plan")
        report["max"] = reduce_everywhere(comms, [1.0, -2.0])
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
    assert reports[0]["gathered"] == ["mine"]
