"""The few collectives the session needs, over the job's own ranks (no extra server).

``TorchComms`` uses ``torch.distributed``; ``control_plane_comms`` gives it gloo (CPU) process groups for the
job's world and pipelines when the job's groups are NCCL: an NCCL collective, even of a few bytes, is queued
on the GPU's compute stream and its result read back on the host, so the host would wait for every kernel
queued before it. ``LocalComms`` is the single-process stand-in for one-rank jobs and tools.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class RankComms(Protocol):
    """Collectives between the ranks of one training job."""

    def gather_to_root(self, obj: Any) -> list[Any] | None:
        """Gather one picklable object per rank on global rank 0 (``None`` elsewhere)."""
        ...

    def broadcast_from_root(self, obj: Any) -> Any:
        """Send global rank 0's object to every rank and return it."""
        ...

    def all_gather_pipeline(self, obj: Any) -> list[Any]:
        """Gather one object per pipeline stage of this replica, in stage order, on every stage."""
        ...

    def all_reduce_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum of a small float vector over all ranks."""
        ...


class LocalComms:
    """Collectives of a job with one rank."""

    def gather_to_root(self, obj: Any) -> list[Any] | None:
        """Return ``[obj]``: this rank is the root."""
        return [obj]

    def broadcast_from_root(self, obj: Any) -> Any:
        """Return ``obj`` unchanged."""
        return obj

    def all_gather_pipeline(self, obj: Any) -> list[Any]:
        """Return ``[obj]``: the pipeline has one stage."""
        return [obj]

    def all_reduce_max(self, values: list[float]) -> list[float]:
        """Return ``values`` unchanged."""
        return list(values)


class TorchComms:
    """Collectives through ``torch.distributed``.

    A group of one rank has nothing to exchange: its collectives return at once (over gloo, an object
    all-gather on a one-rank group still costs ~0.8 ms of pickling and messaging, measured on this project's
    2-core CI machine; a single-GPU job ran three such collectives every logged step).

    Args:
        pipeline_group: The process group of this rank's pipeline (Megatron's, or a gloo group of its ranks).
        device: Device for the all-reduce tensor (``cuda`` under NCCL, ``cpu`` under gloo).
        world_group: The group of every rank; ``None``: the default group.
    """

    def __init__(self, pipeline_group: Any, device: str = "cpu", world_group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._pipeline_group = pipeline_group
        self._device = device
        self._world_group = world_group
        self._alone = dist.get_world_size(world_group) == 1
        self._pipeline_alone = dist.get_world_size(pipeline_group) == 1

    @property
    def pipeline_group(self) -> Any:
        """The group ``all_gather_pipeline`` runs over."""
        return self._pipeline_group

    @property
    def world_group(self) -> Any:
        """The group of every rank (``None``: the default group)."""
        return self._world_group

    def gather_to_root(self, obj: Any) -> list[Any] | None:
        """Gather one picklable object per rank on global rank 0."""
        if self._alone:
            return [obj]
        is_root = self._dist.get_rank() == 0
        gathered: list[Any] | None = [None] * self._dist.get_world_size() if is_root else None
        self._dist.gather_object(obj, gathered, dst=0, group=self._world_group)
        return gathered

    def broadcast_from_root(self, obj: Any) -> Any:
        """Send global rank 0's object to every rank."""
        if self._alone:
            return obj
        box = [obj]
        self._dist.broadcast_object_list(box, src=0, group=self._world_group)
        return box[0]

    def all_gather_pipeline(self, obj: Any) -> list[Any]:
        """Gather one object per stage of this rank's pipeline, in stage order."""
        if self._pipeline_alone:
            return [obj]
        size = self._dist.get_world_size(self._pipeline_group)
        gathered: list[Any] = [None] * size
        self._dist.all_gather_object(gathered, obj, group=self._pipeline_group)
        return gathered

    def all_reduce_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over all ranks, in one small all-reduce."""
        if self._alone:
            return list(values)
        import torch

        tensor = torch.tensor(values, dtype=torch.float64, device=self._device)
        self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MAX, group=self._world_group)
        return tensor.tolist()


def control_plane_comms(pipeline_group: Any, device: str, warn: Callable[[str], Any]) -> TorchComms:
    """The session's collectives, kept off the GPU: over gloo groups of the job's world and pipelines.

    Under a gloo job (CPU) the job's own groups already are; otherwise a gloo group of every rank and one of
    each pipeline's ranks are created, once, by every rank in the same order (``new_group`` is collective,
    as in megatron-core's own gloo groups): each rank sends the ranks of its pipeline to all over the new
    world group, and every rank creates the pipelines' groups in sorted order. Where gloo is missing or a
    group cannot be created, the job's own groups are used and ``warn`` says so once.

    Args:
        pipeline_group: Megatron's pipeline-parallel group of this rank.
        device: The job's device (``cuda`` or ``cpu``).
        warn: Where the one line goes when the job's own groups must be used.

    Returns:
        The collectives.
    """
    import torch.distributed as dist

    backend = str(dist.get_backend())
    if backend == "gloo":
        return TorchComms(pipeline_group, device="cpu")
    try:
        if not dist.is_gloo_available():
            raise RuntimeError("this torch has no gloo backend")
        world: Any = dist.new_group(backend="gloo")
        mine = dist.get_process_group_ranks(pipeline_group)
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine, group=world)
        own: Any = None
        for ranks in sorted({tuple(ranks) for ranks in everyone}):
            group = dist.new_group(list(ranks), backend="gloo")
            if dist.get_rank() in ranks:
                own = group
        return TorchComms(own, device="cpu", world_group=world)
    except Exception as problem:  # same on every rank: no gloo, or no group could be made
        warn(
            f"[energy] rank {dist.get_rank()}: no gloo groups ({problem}); the session's messages go over "
            f"the job's {backend} groups, and each waits for the GPU's queued work"
        )
        return TorchComms(pipeline_group, device=device)
