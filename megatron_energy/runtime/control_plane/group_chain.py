"""Job-wide collectives as chains over the job's groups: a reduction, a broadcast, one replica's gather.

No group spans the world (``runtime.control_plane.comms``), yet the three groups of a rank reach every rank:

- :func:`reduce_over` / :func:`reduce_everywhere`: a fixed-size vector reduced over the pipeline, then the
  tensor, then the data-parallel group is reduced over the whole job (max and sum alike: each link reduces
  over ranks the previous links have already combined), at the cost of the three groups' hops; the same
  chain as stages (:func:`reduction_stages`) runs a link a step in a
  ``runtime.control_plane.staged_exchange``;
- :func:`broadcast_from_root`: global rank 0's object goes down a tree: over the pipeline of its replica
  and tensor-parallel rank, then over each stage's data-parallel group, then over each tensor group;
- :func:`gather_replica`: one object per stage of global rank 0's replica and tensor-parallel rank (the
  **planning replica**, ``in_planning_replica``), gathered on rank 0 over that pipeline alone.

Every rank calls each of them at the same point; the ranks a link does not concern skip it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from megatron_energy.runtime.control_plane.comms import GROUPS, Group, Pending, RankComms
from megatron_energy.runtime.control_plane.staged_exchange import Stages


def run_at_once[T](stages: Stages[T]) -> T:
    """Run an exchange's links one after the other now, each read as soon as it is started."""
    try:
        pending = next(stages)
        while True:
            pending = stages.send(pending.wait())
    except StopIteration as done:
        return done.value


class _PendingPair:
    """A max and a sum started together over one group: one link, read as one vector (maxima, then sums)."""

    def __init__(self, high: Pending | None, total: Pending | None) -> None:
        self.high, self.total = high, total
        self.local = all(pending is None or pending.local for pending in (high, total))

    def wait(self) -> list[float]:
        """The reduced maxima followed by the reduced sums."""
        high = self.high.wait() if self.high is not None else []
        return high + (self.total.wait() if self.total is not None else [])


def reduction_stages(
    comms: RankComms, groups: Sequence[Group], maxima: Sequence[float], sums: Sequence[float] = ()
) -> Stages[tuple[list[float], list[float]]]:
    """Reduce ``maxima`` (element-wise max) and ``sums`` (element-wise sum) over ``groups`` in turn, by links.

    Over each group both vectors are started before either is read, so they take one round trip together
    (one link); an empty vector runs no collective.

    Returns:
        The reduced maxima and sums.
    """
    high, total = list(maxima), list(sums)
    for group in groups:
        pending_high = comms.start_all_reduce(high, "max", group) if high else None
        pending_total = comms.start_all_reduce(total, "sum", group) if total else None
        both = yield _PendingPair(pending_high, pending_total)
        high, total = both[: len(high)], both[len(high) :]
    return high, total


def reduce_over(
    comms: RankComms, groups: Sequence[Group], maxima: Sequence[float], sums: Sequence[float] = ()
) -> tuple[list[float], list[float]]:
    """:func:`reduction_stages`, each link read as soon as it is started (waits for the whole chain)."""
    return run_at_once(reduction_stages(comms, groups, maxima, sums))


def reduce_everywhere(comms: RankComms, maxima: Sequence[float]) -> list[float]:
    """The element-wise maximum of ``maxima`` over every rank of the job (a chain over its three groups)."""
    return reduce_over(comms, GROUPS, maxima)[0]


def in_planning_replica(comms: RankComms) -> bool:
    """Whether this rank is its stage's rank in the planning replica (global rank 0's, tensor rank 0)."""
    return comms.rank("data") == 0 and comms.rank("tensor") == 0


def broadcast_from_root(comms: RankComms, obj: Any) -> Any:
    """Global rank 0's picklable object on every rank (down the tree of the module docstring)."""
    if in_planning_replica(comms):
        obj = comms.broadcast(obj, "pipeline")
    if comms.rank("tensor") == 0:
        obj = comms.broadcast(obj, "data")
    return comms.broadcast(obj, "tensor")


def gather_replica(comms: RankComms, obj: Any) -> list[Any] | None:
    """The planning replica's objects by stage on global rank 0; ``None`` on every other rank."""
    if not in_planning_replica(comms):
        return None
    return comms.gather(obj, "pipeline")
