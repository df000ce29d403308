"""The few collectives the session needs, over the job's own groups: never one that spans the world.

Every collective of the session runs over one of three groups of the job (``Group``): this rank's
**pipeline** (the stages of one replica, as one tensor-parallel rank sees them), its **tensor** group (the
tensor- and context-parallel peers of one stage of one replica) and its **data**-parallel group (one stage's
rank in every replica). Together the three reach every rank, so a job-wide figure is a chain of reductions
over them (``runtime.control_plane.group_chain``), and each link costs the hops of its own group, not of the
world: ``runtime.control_plane.exchange_period`` models it.

A collective's figures are a fixed-size float vector (an all-reduce: ``max`` or ``sum``), started without
waiting (:meth:`RankComms.start_all_reduce`; ``Pending.wait`` reads it, a later step if need be), or one
picklable object (a broadcast from the group's first rank, a gather on it, an all-gather), which only
set-up, planning and the simulated GPUs use. A group of one rank has nothing to exchange: its collectives
run no message at all (``Pending.local`` says so). Group ranks are Megatron's: the pipeline rank, the
data-parallel rank and the tensor-parallel rank, so every group's first rank belongs to the replica and
tensor-parallel rank of global rank 0.

``TorchComms`` uses ``torch.distributed`` over the groups it is given (gloo groups of the same ranks under an
NCCL job: ``runtime.control_plane.gloo_groups``); ``LocalComms`` is the single-process stand-in for one-rank
jobs and tools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

Group = Literal["pipeline", "tensor", "data"]
"""One of the job's groups this rank belongs to (see the module docstring)."""
GROUPS: tuple[Group, ...] = ("pipeline", "tensor", "data")
"""The three groups, in the order a job-wide chain of reductions takes them."""
ReduceOp = Literal["max", "sum"]
"""The element-wise reduction of an all-reduce."""


class Pending(Protocol):
    """An all-reduce started and not read yet."""

    local: bool
    """``True`` when no message was needed (a group of one rank): its result is known at once."""

    def wait(self) -> list[float]:
        """The reduced vector (waits for the collective to complete)."""
        ...


class RankComms(Protocol):
    """Collectives over the groups of one rank (see the module docstring)."""

    def size(self, group: Group) -> int:
        """Ranks in ``group``."""
        ...

    def rank(self, group: Group) -> int:
        """This rank's place in ``group`` (0: the group's first rank)."""
        ...

    def start_all_reduce(self, values: Sequence[float], op: ReduceOp, group: Group) -> Pending:
        """Start an element-wise reduction of a small float vector over ``group``; read it with ``wait``."""
        ...

    def broadcast(self, obj: Any, group: Group) -> Any:
        """Send the group's first rank's picklable object to every rank of ``group`` and return it."""
        ...

    def gather(self, obj: Any, group: Group) -> list[Any] | None:
        """One picklable object per rank of ``group``, in group order, on its first rank (else ``None``)."""
        ...

    def all_gather(self, obj: Any, group: Group) -> list[Any]:
        """One picklable object per rank of ``group``, in group order, on every rank of it."""
        ...


class Known:
    """A reduction over a group of one rank: the values themselves, no message."""

    local = True

    def __init__(self, values: Sequence[float]) -> None:
        self._values = list(values)

    def wait(self) -> list[float]:
        """The values."""
        return list(self._values)


class LocalComms:
    """Collectives of a job with one rank: every group is this rank alone."""

    def size(self, group: Group) -> int:
        """1."""
        return 1

    def rank(self, group: Group) -> int:
        """0."""
        return 0

    def start_all_reduce(self, values: Sequence[float], op: ReduceOp, group: Group) -> Pending:
        """The values themselves."""
        return Known(values)

    def broadcast(self, obj: Any, group: Group) -> Any:
        """``obj`` unchanged."""
        return obj

    def gather(self, obj: Any, group: Group) -> list[Any] | None:
        """``[obj]``: this rank is the group's first."""
        return [obj]

    def all_gather(self, obj: Any, group: Group) -> list[Any]:
        """``[obj]``."""
        return [obj]


class _TorchPending:
    """A ``torch.distributed`` all-reduce started with ``async_op=True``."""

    local = False

    def __init__(self, work: Any, tensor: Any) -> None:
        self._work = work
        self._tensor = tensor

    def wait(self) -> list[float]:
        self._work.wait()
        return self._tensor.tolist()


class TorchComms:
    """Collectives through ``torch.distributed`` over the given process groups.

    A group of one rank has nothing to exchange: its collectives return at once (over gloo, an object
    all-gather on a one-rank group still costs ~0.8 ms of pickling and messaging, measured on this project's
    2-core CI machine).

    Args:
        groups: The process group of each ``Group`` (Megatron's, or gloo groups of the same ranks).
        device: Device for the all-reduce tensors (``cpu`` under gloo; ``cuda`` when the job's NCCL groups
            must be used).
    """

    def __init__(self, groups: Mapping[Group, Any], device: str = "cpu") -> None:
        import torch.distributed as dist

        self._dist = dist
        self._groups = dict(groups)
        self._device = device
        self._sizes = {name: dist.get_world_size(group) for name, group in self._groups.items()}
        self._ranks = {name: dist.get_rank(group) for name, group in self._groups.items()}

    def process_group(self, group: Group) -> Any:
        """The ``torch.distributed`` group behind ``group``."""
        return self._groups[group]

    def size(self, group: Group) -> int:
        """Ranks in ``group``."""
        return self._sizes[group]

    def rank(self, group: Group) -> int:
        """This rank's place in ``group``."""
        return self._ranks[group]

    def start_all_reduce(self, values: Sequence[float], op: ReduceOp, group: Group) -> Pending:
        """Start the reduction (``async_op``): gloo runs it on its own threads while training goes on."""
        if self._sizes[group] == 1:
            return Known(values)
        import torch

        tensor = torch.tensor(list(values), dtype=torch.float64, device=self._device)
        reduce_op = self._dist.ReduceOp.MAX if op == "max" else self._dist.ReduceOp.SUM
        work = self._dist.all_reduce(tensor, op=reduce_op, group=self._groups[group], async_op=True)
        return _TorchPending(work, tensor)

    def broadcast(self, obj: Any, group: Group) -> Any:
        """The group's first rank's object."""
        if self._sizes[group] == 1:
            return obj
        box = [obj]
        self._dist.broadcast_object_list(box, group=self._groups[group], group_src=0)
        return box[0]

    def gather(self, obj: Any, group: Group) -> list[Any] | None:
        """Every rank's object on the group's first rank."""
        if self._sizes[group] == 1:
            return [obj]
        first = self._ranks[group] == 0
        gathered: list[Any] | None = [None] * self._sizes[group] if first else None
        self._dist.gather_object(obj, gathered, group=self._groups[group], group_dst=0)
        return gathered

    def all_gather(self, obj: Any, group: Group) -> list[Any]:
        """Every rank's object on every rank of the group."""
        if self._sizes[group] == 1:
            return [obj]
        gathered: list[Any] = [None] * self._sizes[group]
        self._dist.all_gather_object(gathered, obj, group=self._groups[group])
        return gathered
