"""Pick the frontier point for a target, executable under the GPU's clock-switch latency.

Targets (``--energy-target``): ``iso-time`` keeps the iteration time of all-maximum clocks (every
instruction at its highest profiled clock, as the GPU runs unplanned; see
:func:`~megatron_energy.pipeline.stock_clocks.all_max_clocks`), ``slowdown:X`` allows ``(1 + X)`` times that,
``min-energy`` takes the frontier's minimum-energy point, ``power:W[,peak:P]`` the fastest point within a
power budget per GPU (:mod:`megatron_energy.optimisers.perseus.power_point`). For data-parallel stragglers,
:meth:`Planner.point_for_time` gives the point for a slower pace ``T'``: the least energy that still
finishes within ``T'``; past the minimum-energy point it stays there, since running slower than that only
adds energy.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cached_property

from megatron_energy.optimisers.interface import SWITCH_EVALUATIONS
from megatron_energy.optimisers.perseus.frontier import Frontier, FrontierPoint, FrontierSolver
from megatron_energy.optimisers.perseus.power_point import fastest_within_budget
from megatron_energy.optimisers.perseus.switch_latency import make_switch_aware
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.profile import Profile
from megatron_energy.sim.simulator import StagePowers
from megatron_energy.target import EnergyTarget, parse_target


class Planner:
    """Frontier-based planning for one job (one DAG and profile).

    Args:
        dag: The iteration DAG.
        profile: Time and energy per clock of every instruction.
        powers: Blocked and idle power; the profile's when ``None``.
        num_points: Deadlines in the frontier sweep.
        switch_latency_s: The GPU's clock-switch latency; the points this planner hands out are made
            executable under it (``perseus.switch_latency``), with their latency-aware time and energy.
        switch_evaluations: Latency-aware simulations the improvement search may run for each point made
            executable.
    """

    def __init__(
        self,
        dag: PipelineDag,
        profile: Profile,
        powers: StagePowers | None = None,
        num_points: int = 100,
        switch_latency_s: float = 0.0,
        switch_evaluations: int = SWITCH_EVALUATIONS,
    ):
        self.dag = dag
        self.switch_latency_s = switch_latency_s
        self.switch_evaluations = switch_evaluations
        self.profile = profile
        self.num_points = num_points
        self.solver = FrontierSolver(dag, profile, powers)

    @cached_property
    def frontier(self) -> Frontier:
        """The frontier from the all-maximum-clocks time to the minimum-energy point (computed once)."""
        return self.solver.sweep(self.num_points)

    @cached_property
    def min_energy_point(self) -> FrontierPoint:
        """The least-energy plan: the unconstrained solve or a frontier point, whichever uses less."""
        return min(self.solver.solve(math.inf), self.frontier.min_energy_point(), key=lambda p: p.energy_j)

    def executable(self, point: FrontierPoint) -> FrontierPoint:
        """``point`` with its clocks made executable under the switch latency, and re-simulated with it.

        Its bound is the relaxed optimum at its deadline (:meth:`FrontierSolver.with_exact_bound`), never a
        sweep's looser dual bound, so the gap reported with a plan is the gap to that optimum.
        """
        point = self.solver.with_exact_bound(point)
        if self.switch_latency_s <= 0:
            return point
        deadline_s = point.deadline_s if math.isfinite(point.deadline_s) else point.time_s
        adjusted = make_switch_aware(
            self.dag,
            self.profile,
            point.clocks,
            self.switch_latency_s,
            max(deadline_s, point.time_s),
            max_evaluations=self.switch_evaluations,
        )
        return dataclasses.replace(
            point,
            time_s=adjusted.result.iteration_time_s,
            energy_j=adjusted.result.total_energy_j,
            stage_energy_j=tuple(stage.total_energy_j for stage in adjusted.result.stages),
            stage_busy_s=tuple(stage.busy_s for stage in adjusted.result.stages),
            clocks=adjusted.clocks,
        )

    def executable_points(self) -> list[FrontierPoint]:
        """Every frontier point and the minimum-energy point, made executable (the power target's choices)."""
        return [self.executable(point) for point in (*self.frontier.points, self.min_energy_point)]

    def point_for_time(self, time_s: float) -> FrontierPoint:
        """The least-energy executable point whose iteration time is within ``time_s``.

        A ``time_s`` past the minimum-energy point gives that point; one below the all-maximum-clocks time
        gives the all-maximum-clocks time's plan (nothing runs faster).
        """
        best = self.min_energy_point
        if time_s >= best.time_s:
            return self.executable(best)
        deadline_s = max(time_s, self.solver.min_time_s)
        solved = self.solver.solve(deadline_s)
        listed = self.frontier.best_within(deadline_s)
        return self.executable(solved if listed is None or solved.energy_j <= listed.energy_j else listed)

    def point(self, target: EnergyTarget | str) -> FrontierPoint:
        """The frontier point for a target (``iso-time``, ``min-energy``, ``slowdown:X`` or ``power:W``).

        Raises:
            PowerBudgetError: A ``power`` target no executable frontier point fits.
            ValueError: A ``smooth`` target: its point weighs the filler too (``perseus.smooth_point``).
        """
        target = parse_target(target) if isinstance(target, str) else target
        if target.kind == "smooth":
            raise ValueError(f"{target}: a smooth target's point comes from perseus.smooth_point")
        if target.kind == "power":
            return fastest_within_budget(self.executable_points(), self.profile, target)
        return self.point_for_time(target.deadline_s(self.solver.baseline.iteration_time_s))
