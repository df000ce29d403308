"""The few collectives the session needs, over the job's own process groups (no extra server).

``TorchComms`` uses ``torch.distributed`` with the groups Megatron created; ``LocalComms`` is the
single-process stand-in for one-rank jobs and tools.
"""

from __future__ import annotations

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
    """Collectives through ``torch.distributed`` on the job's process groups.

    Args:
        pipeline_group: The process group of this rank's pipeline (Megatron's pipeline-parallel group).
        device: Device for the all-reduce tensor (``cuda`` under NCCL, ``cpu`` under gloo).
    """

    def __init__(self, pipeline_group: Any, device: str = "cpu") -> None:
        import torch.distributed as dist

        self._dist = dist
        self._pipeline_group = pipeline_group
        self._device = device

    def gather_to_root(self, obj: Any) -> list[Any] | None:
        """Gather one picklable object per rank on global rank 0."""
        is_root = self._dist.get_rank() == 0
        gathered: list[Any] | None = [None] * self._dist.get_world_size() if is_root else None
        self._dist.gather_object(obj, gathered, dst=0)
        return gathered

    def broadcast_from_root(self, obj: Any) -> Any:
        """Send global rank 0's object to every rank."""
        box = [obj]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_pipeline(self, obj: Any) -> list[Any]:
        """Gather one object per stage of this rank's pipeline, in stage order."""
        size = self._dist.get_world_size(self._pipeline_group)
        gathered: list[Any] = [None] * size
        self._dist.all_gather_object(gathered, obj, group=self._pipeline_group)
        return gathered

    def all_reduce_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over all ranks, in one small all-reduce."""
        import torch

        tensor = torch.tensor(values, dtype=torch.float64, device=self._device)
        self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MAX)
        return tensor.tolist()
