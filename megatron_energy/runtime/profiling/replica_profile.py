"""Planning inputs from one replica: its ranks' profiles on rank 0, a fixed-size check of every other rank.

Tensor- and data-parallel peers run the same instructions of their stage, so one rank per stage says what
the plan needs: the **planning replica** (global rank 0's replica and tensor-parallel rank,
``runtime.control_plane.group_chain.in_planning_replica``) gathers its stages' rows and stock steps on rank 0
over its pipeline alone, whatever the number of replicas. Every other rank takes part in three fixed-size
reductions only (:func:`replica_profile`):

- per stage, over its tensor and data-parallel groups, the lowest and highest of a few summary figures
  at stock clocks (:class:`StageSpread`: the instructions' time per microbatch, the iteration time and the
  energy per iteration), which rank 0 sets against :data:`SPREAD_TOLERANCE`: a stage whose ranks differ
  more is said so in the log (the plan is made from the planning replica's rows; a slower replica is then
  followed as a straggler, ``runtime.control_plane.staged_exchange``);
- over the whole job, whether any rank could not summarise its profile (every rank then falls back), and
  the job's stock baseline steps over every GPU (``runtime.profiling.job_stock``), which the energy log
  compares with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_energy.runtime.control_plane.comms import RankComms
from megatron_energy.runtime.control_plane.group_chain import gather_replica, reduce_over
from megatron_energy.runtime.planning_round.planning import Fallback
from megatron_energy.runtime.profiling.collector import ProfileRow, StepRecord, baseline_records, mean_record
from megatron_energy.runtime.profiling.job_stock import JobStock, job_stock, stock_vectors

SPREAD_TOLERANCE = 0.05
"""Relative spread of a stage's summary figures over its ranks beyond which the log says they disagree."""

FIGURES = (
    ("instruction time per microbatch", "ms", 1e3),
    ("iteration time", "ms", 1e3),
    ("energy per iteration", "J", 1.0),
)
"""The summary figures of :class:`StageSpread`, in its order: name, unit, scale from seconds or joules."""


@dataclass(frozen=True)
class StageSpread:
    """The lowest and highest of one stage's summary figures over its ranks, at the stock clock."""

    lowest: tuple[float, ...]
    """Per figure of :data:`FIGURES`: the smallest value of any rank of the stage."""
    highest: tuple[float, ...]
    """Per figure: the largest."""

    def disagreement(self, tolerance: float = SPREAD_TOLERANCE) -> str | None:
        """The figure spread most beyond ``tolerance``, its lowest and highest value; ``None`` if none is."""
        spread = [
            (high / low, name, unit, scale * low, scale * high)
            for (name, unit, scale), low, high in zip(FIGURES, self.lowest, self.highest, strict=True)
            if low > 0 and math.isfinite(high) and high / low - 1 > tolerance
        ]
        if not spread:
            return None
        ratio, name, unit, low, high = max(spread)
        return f"{name} {low:.1f}-{high:.1f} {unit} (+{100 * (ratio - 1):.1f} % > {100 * tolerance:g} %)"


@dataclass(frozen=True)
class StageProfile:
    """What one stage of the planning replica sends rank 0."""

    global_rank: int
    rows: list[ProfileRow]
    steps: list[StepRecord]
    spread: StageSpread


@dataclass(frozen=True)
class ReplicaProfile:
    """The outcome of :func:`replica_profile` on one rank."""

    stock: JobStock
    """The job's stock baseline steps (every rank)."""
    failed: bool
    """Whether any rank of the job could not summarise its profile (every rank)."""
    stages: list[StageProfile | Fallback] | None
    """The planning replica's stages, by stage (rank 0 only; ``None`` elsewhere)."""


def _summary(profile: tuple[list[ProfileRow], list[StepRecord]] | None, stock_clock_mhz: int) -> list[float]:
    """This rank's figures of :data:`FIGURES`, each with its negation: one max gives the highest and lowest.

    A figure this rank has not (no profile, no energy counter) is ``-inf`` twice: it takes no part.
    """
    figures = [math.nan] * len(FIGURES)
    if profile is not None:
        rows, steps = profile
        baseline = baseline_records(steps)
        mean = mean_record(baseline) if baseline else None
        figures = [
            sum(row.time_s for row in rows if row.clock_mhz == stock_clock_mhz),
            math.nan if mean is None else mean.iteration_s,
            math.nan if mean is None else mean.energy_j,
        ]
    pairs = [(figure, -figure) if math.isfinite(figure) else (-math.inf, -math.inf) for figure in figures]
    return [value for pair in pairs for value in pair]


def replica_profile(
    comms: RankComms,
    contribution: tuple[list[ProfileRow], list[StepRecord]] | Fallback,
    stock_steps: int,
    stock_clock_mhz: int,
    global_rank: int,
) -> ReplicaProfile:
    """Agree on the planning inputs (see the module docstring); every rank calls it at the end of profiling.

    Fixed-size reductions over the tensor and data-parallel groups, then over the pipeline; then the gather
    over the planning replica's pipeline.

    Args:
        comms: The rank's collectives.
        contribution: This rank's profile rows and stock steps, or why it has none.
        stock_steps: The agreed number of baseline steps (the same on every rank).
        stock_clock_mhz: The stock clock.
        global_rank: This rank in the default group.
    """
    profile = None if isinstance(contribution, Fallback) else contribution
    summary = _summary(profile, stock_clock_mhz)
    stock_max, stock_sum = stock_vectors([] if profile is None else profile[1], stock_steps)
    job_max = [0.0 if profile is not None else 1.0, *stock_max]
    stage_max, stock_sum = reduce_over(comms, ("tensor", "data"), [*summary, *job_max], stock_sum)
    count = len(summary)
    spread = StageSpread(tuple(-low for low in stage_max[1:count:2]), tuple(stage_max[0:count:2]))
    job_max, stock_sum = reduce_over(comms, ("pipeline",), stage_max[count:], stock_sum)
    mine = (
        contribution
        if isinstance(contribution, Fallback)
        else StageProfile(global_rank, *contribution, spread)
    )
    return ReplicaProfile(job_stock(job_max[1:], stock_sum), job_max[0] > 0, gather_replica(comms, mine))
