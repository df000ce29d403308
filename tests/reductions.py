"""The session's reductions over a job, in one process, for the unit tests: their result, and scripted peers.

``runtime.control_plane.group_chain.reduce_over`` reduces a vector for a max and one for a sum over the job's
groups in turn; over every group of the job that is the element-wise max and sum over every rank's vectors
(:func:`over_ranks`). :class:`PeerComms` is one rank whose groups have scripted peers: each collective over
a group of more than one rank is a message (:class:`Message`), read no sooner than the next step, like
gloo's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from megatron_energy.runtime.control_plane.comms import Group, Known, LocalComms, Pending, ReduceOp


def over_ranks(vectors: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[list[float], list[float]]:
    """The element-wise max of every rank's first vector and sum of its second."""
    maxima = [max(values) for values in zip(*(high for high, _ in vectors), strict=True)]
    sums = [sum(values) for values in zip(*(total for _, total in vectors), strict=True)]
    return maxima, sums


class Message:
    """A collective started over peers: its result, read at ``wait``."""

    local = False

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def wait(self) -> list[float]:
        return self.values


class PeerComms(LocalComms):
    """One rank whose groups have the given sizes; every peer sends :meth:`peer` of this rank's vector.

    Args:
        sizes: Ranks per group (a group not named has one rank: no collective).
    """

    def __init__(self, sizes: Mapping[Group, int]) -> None:
        self.sizes = dict(sizes)
        self.started: list[Group] = []
        """The group of every collective started, in order."""

    def size(self, group: Group) -> int:
        return self.sizes.get(group, 1)

    def peer(self, values: Sequence[float], op: ReduceOp, group: Group) -> list[float]:
        """What each peer sends when this rank sends ``values`` (the same, unless a test says otherwise)."""
        return list(values)

    def start_all_reduce(self, values: Sequence[float], op: ReduceOp, group: Group) -> Pending:
        size = self.size(group)
        if size == 1:
            return Known(values)
        self.started.append(group)
        peer = self.peer(values, op, group)
        if op == "max":
            return Message([max(mine, theirs) for mine, theirs in zip(values, peer, strict=True)])
        return Message([mine + (size - 1) * theirs for mine, theirs in zip(values, peer, strict=True)])
