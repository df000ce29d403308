"""A job-wide exchange spread over steps: one link of a chain of reductions per step, one exchange every K.

A per-step exchange the size of the world would cost every step more than the iteration at 16k ranks
(``runtime.control_plane.exchange_period``). :class:`StagedExchange` runs an exchange as a chain of
all-reduces over the job's groups (``runtime.control_plane.comms``), one link per step: a link is started
without waiting at one step's end and read at the next one's, when gloo has long completed it on its own
threads, and the next link starts there. A link over a group of one rank runs no collective and does not take
a step. A new exchange begins every ``period`` steps (K), and never before the previous one has completed (K
is at least an exchange's steps), so each group carries at most one collective every K steps.

An exchange is a generator (:data:`Stages`): it yields each link's ``Pending`` and receives its result, and
returns its outcome. Every rank calls :meth:`StagedExchange.step` at the same steps, so every rank starts
each link at the same step and takes the outcome at the same step. The session runs two:

- :func:`pace_stages`, in the run phase when the job has several data-parallel replicas: the replica's
  span (a max over its pipeline, then over its tensor group), then each replica's contribution to the
  straggler policy over the data-parallel group (max and min in one max);
- :func:`any_rank_stages`, while planning runs in the background: whether every rank has read its kernel
  timelines (whether any rank has not), then whether rank 0 has the planner's outcome (a max over the three
  groups), after which every rank receives it down a tree
  (``runtime.control_plane.group_chain.broadcast_from_root``) and adopts it at the same step.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

from megatron_energy.runtime.control_plane.comms import GROUPS, Pending, RankComms

type Stages[T] = Generator[Pending, list[float], T]
"""An exchange: yields each link's started all-reduce, receives its result, returns the outcome."""


class StagedExchange[T]:
    """Runs one exchange at a time, a link per step, a new one every ``period`` steps.

    Args:
        period: Steps between the starts of two exchanges (K, ``runtime.control_plane.exchange_period``); at
        least 1.
    """

    def __init__(self, period: int) -> None:
        self.period = max(1, period)
        self._since = self.period  # steps since the last exchange began: the first step begins one
        self._stages: Stages[T] | None = None
        self._pending: Pending | None = None

    def step(self, begin: Callable[[], Stages[T]] | None) -> T | None:
        """One step: read the link in flight and start the next; begin an exchange if one is due.

        Args:
            begin: Makes the exchange to begin (called only when one begins, with this step's figures);
                ``None``: none may begin at this step.

        Returns:
            The exchange's outcome on the step it completes; ``None`` on every other step.
        """
        self._since += 1
        outcome = None if self._stages is None else self._advance(self._pending)
        if begin is not None and self._stages is None and self._since >= self.period:
            self._since = 0
            self._stages = begin()
            begun = self._advance(None)  # an exchange of local links only completes at once
            outcome = outcome if begun is None else begun
        return outcome

    @property
    def in_flight(self) -> bool:
        """Whether an exchange has begun and not completed."""
        return self._stages is not None

    def _advance(self, pending: Pending | None) -> T | None:
        """Send the link's result on, through every link that needs no message, up to the next one started."""
        assert self._stages is not None
        try:
            pending = next(self._stages) if pending is None else self._stages.send(pending.wait())
            while pending.local:
                pending = self._stages.send(pending.wait())
        except StopIteration as done:
            self._stages = self._pending = None
            return done.value
        self._pending = pending
        return None


@dataclass(frozen=True)
class PaceVerdict:
    """What one exchange of the replicas' paces found (``runtime.running.policies.StragglerPolicy``)."""

    step: int
    """The step whose spans the exchange compared (it completes a few steps later)."""
    mine_s: float
    """This replica's contribution: its measured time when it straggles, else the nominal plan time."""
    slowest_s: float
    """The largest contribution of any replica."""
    fastest_s: float
    """The smallest contribution of any replica."""


def pace_stages(
    comms: RankComms, step: int, span_s: float, contribution: Callable[[float], float]
) -> Stages[PaceVerdict]:
    """The replicas' paces: the replica's span over its pipeline and tensor groups, then over the replicas.

    Args:
        comms: The rank's collectives.
        step: The step the exchange begins at.
        span_s: This rank's span of that step (its stage's end, plus the plan's tail).
        contribution: This replica's contribution from its span (called once the replica's span is known,
            a step or two later; it holds what the point running at ``step`` predicts).
    """
    (replica_s,) = yield comms.start_all_reduce([span_s], "max", "pipeline")
    (replica_s,) = yield comms.start_all_reduce([replica_s], "max", "tensor")
    mine_s = contribution(replica_s)  # the same on every rank of the replica
    slowest_s, negated_fastest_s = yield comms.start_all_reduce([mine_s, -mine_s], "max", "data")
    return PaceVerdict(step, mine_s, slowest_s, -negated_fastest_s)


def any_rank_stages(comms: RankComms, raised: bool) -> Stages[bool]:
    """Whether any rank of the job ``raised`` its flag: one max over each group in turn."""
    flag = [1.0 if raised else 0.0]
    for group in GROUPS:
        flag = yield comms.start_all_reduce(flag, "max", group)
    return flag[0] > 0
