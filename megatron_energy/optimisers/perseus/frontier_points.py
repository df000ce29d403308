"""The data of a frontier sweep: relaxed solutions, frontier points and the frontier itself.

See :mod:`megatron_energy.optimisers.perseus.frontier` for how they are computed. All figures are *modelled*.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from megatron_energy.optimisers.perseus.local_search import REL_TOL
from megatron_energy.pipeline.instruction import Step
from megatron_energy.sim.simulator import SimResult


class PlanClocks(Mapping[Step, int]):
    """The SM clock of every compute node of one plan, stored as an array (a read-only mapping)."""

    def __init__(self, positions: Mapping[Step, int], clocks: Sequence[int]):
        self._positions = positions
        self._clocks = tuple(clocks)

    def __getitem__(self, node: Step) -> int:
        return self._clocks[self._positions[node]]

    def __iter__(self) -> Iterator[Step]:
        return iter(self._positions)

    def __len__(self) -> int:
        return len(self._clocks)

    def __repr__(self) -> str:
        return f"PlanClocks({len(self)} instructions)"


@dataclass(frozen=True)
class FrontierPoint:
    """One plan on the frontier (all figures *modelled*: simulated from the profile).

    Attributes:
        deadline_s: Iteration-time budget the plan was solved for.
        time_s: Simulated iteration time of the plan (never above ``deadline_s``).
        energy_j: Simulated energy of one iteration under the plan, all stages.
        lower_bound_j: No plan meeting ``deadline_s`` uses less: the optimum of the relaxed problem at the
            deadline when ``exact_bound``, otherwise a dual bound of it: the better of the best tangent of the
            (convex) relaxed optimum as a function of the deadline, taken at the deadlines where it was
            solved, and the Lagrangian bound of the relaxed program's multipliers interpolated between the
            two solves around the deadline (valid, but looser).
        stage_energy_j: Simulated energy per stage.
        stage_busy_s: Simulated busy (computing) time per stage.
        clocks: SM clock of every compute node.
        exact_bound: Whether ``lower_bound_j`` is the relaxed optimum at this very deadline.
    """

    deadline_s: float
    time_s: float
    energy_j: float
    lower_bound_j: float
    stage_energy_j: tuple[float, ...]
    stage_busy_s: tuple[float, ...]
    clocks: Mapping[Step, int]
    exact_bound: bool = True

    @property
    def gap(self) -> float:
        """Relative distance of the plan's energy above its lower bound."""
        return self.energy_j / self.lower_bound_j - 1.0


@dataclass(frozen=True)
class Frontier:
    """Frontier points for a sweep of deadlines, energy non-increasing as the deadline grows.

    Attributes:
        points: One point per deadline, ascending deadline.
        baseline: Simulation of every instruction at its maximum clock (:func:`all_max_clocks`).
        min_time_s: Iteration time with every instruction at its fastest option (the first deadline).
    """

    points: tuple[FrontierPoint, ...]
    baseline: SimResult
    min_time_s: float

    def min_energy_point(self) -> FrontierPoint:
        """The point of least energy (the quickest of equals)."""
        return min(self.points, key=lambda point: (point.energy_j, point.time_s))

    def best_within(self, time_s: float) -> FrontierPoint | None:
        """The least-energy point whose simulated iteration time is at most ``time_s``, if any."""
        feasible = [point for point in self.points if point.time_s <= time_s * (1 + REL_TOL)]
        return min(feasible, key=lambda point: (point.energy_j, point.time_s), default=None)

    def to_csv(self, path: str | Path) -> None:
        """Write ``deadline_s,time_s,energy_j,lower_bound_j,gap_percent,bound`` per point (all modelled).

        ``bound`` says what ``lower_bound_j`` is: ``relaxed`` (the relaxed optimum at the deadline) or
        ``dual`` (a dual bound of it, lower: the gap is then overstated, never understated).
        """
        with Path(path).open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["deadline_s", "time_s", "energy_j", "lower_bound_j", "gap_percent", "bound"])
            for point in self.points:
                writer.writerow(
                    [
                        f"{point.deadline_s:.9g}",
                        f"{point.time_s:.9g}",
                        f"{point.energy_j:.9g}",
                        f"{point.lower_bound_j:.9g}",
                        f"{100 * point.gap:.6f}",
                        "relaxed" if point.exact_bound else "dual",
                    ]
                )


@dataclass(frozen=True)
class RelaxedSolution:
    """A solution of the relaxed (convex-hull) problem at one deadline, and a lower bound for the deadline.

    Attributes:
        deadline_s: The iteration-time budget.
        time_s: Iteration time of the relaxed solution (at most the deadline).
        lower_bound_j: No plan that meets the deadline uses less.
        durations_s: Relaxed duration of every node, indexed like ``PipelineDag.nodes``.
        slope_j_per_s: Rate of change of the relaxed optimum with the deadline (a subgradient, at most 0).
        exact: Whether this is the relaxed optimum itself; otherwise a feasible relaxed solution interpolated
            between two solved deadlines, with a dual bound (see :class:`FrontierPoint`).
        chord_j: For an interpolated solution, the chord between the two solved optima at this deadline: at
            least the relaxed optimum here, and close to it. The local search aims at it (the bound is
            looser); ``None`` for an exact one.
        multipliers: The relaxed program's row multipliers (``y ≥ 0``, one per row) of the solve, or their
            interpolation; any of them bound the optimum at every deadline
            (:meth:`~megatron_energy.optimisers.perseus.relaxation.HotStartProgram.dual_bound`). ``None`` if
            unknown.
    """

    deadline_s: float
    time_s: float
    lower_bound_j: float
    durations_s: np.ndarray
    slope_j_per_s: float = 0.0
    exact: bool = True
    chord_j: float | None = None
    multipliers: np.ndarray | None = None

    def tangent_j(self, deadline_s: float) -> float:
        """The relaxed optimum's tangent through this solution, at ``deadline_s``: a lower bound there."""
        return self.lower_bound_j + self.slope_j_per_s * (deadline_s - self.deadline_s)


def interpolated(low: RelaxedSolution, high: RelaxedSolution, deadline_s: float) -> RelaxedSolution:
    """A relaxed solution for a deadline between two solved ones, without solving.

    The relaxed problem's constraints are linear, so the convex combination of two feasible solutions is
    feasible for the same combination of deadlines; its bound is the better of the two tangents (the relaxed
    optimum is convex in the deadline, so each tangent lies below it). Its multipliers are the same
    combination of the two solves' multipliers (where both have them), for a dual bound that may beat both.
    """
    weight = (high.deadline_s - deadline_s) / (high.deadline_s - low.deadline_s)
    multipliers = None
    if low.multipliers is not None and high.multipliers is not None:
        multipliers = weight * low.multipliers + (1 - weight) * high.multipliers
    return RelaxedSolution(
        deadline_s=deadline_s,
        time_s=weight * low.time_s + (1 - weight) * high.time_s,
        lower_bound_j=max(low.tangent_j(deadline_s), high.tangent_j(deadline_s)),
        durations_s=weight * low.durations_s + (1 - weight) * high.durations_s,
        exact=False,
        chord_j=weight * low.lower_bound_j + (1 - weight) * high.lower_bound_j,
        multipliers=multipliers,
    )
