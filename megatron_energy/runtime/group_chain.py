"""Job-wide collectives as chains over the job's groups: a reduction, a broadcast, one replica's gather.

No group spans the world (``runtime.comms``), yet the three groups of a rank reach every rank:

- :func:`reduce_over` / :func:`reduce_everywhere`: a fixed-size vector reduced over the pipeline, then the
  tensor, then the data-parallel group is reduced over the whole job (max and sum alike: each link reduces
  over ranks the previous links have already combined), at the cost of the three groups' hops;
- :func:`broadcast_from_root`: global rank 0's object goes down a tree: over the pipeline of its replica
  and tensor-parallel rank, then over each stage's data-parallel group, then over each tensor group;
- :func:`gather_replica`: one object per stage of global rank 0's replica and tensor-parallel rank (the
  **planning replica**, ``in_planning_replica``), gathered on rank 0 over that pipeline alone.

Every rank calls each of them at the same point; the ranks a link does not concern skip it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from megatron_energy.runtime.comms import GROUPS, Group, RankComms


def reduce_over(
    comms: RankComms, groups: Sequence[Group], maxima: Sequence[float], sums: Sequence[float] = ()
) -> tuple[list[float], list[float]]:
    """Reduce ``maxima`` (element-wise max) and ``sums`` (element-wise sum) over ``groups`` in turn.

    Over each group both vectors are started before either is read, so they take one round trip together;
    an empty vector runs no collective.

    Returns:
        The reduced maxima and sums.
    """
    high, total = list(maxima), list(sums)
    for group in groups:
        pending_high = comms.start_all_reduce(high, "max", group) if high else None
        pending_total = comms.start_all_reduce(total, "sum", group) if total else None
        high = pending_high.wait() if pending_high is not None else high
        total = pending_total.wait() if pending_total is not None else total
    return high, total


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
