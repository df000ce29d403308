"""The ``smooth:`` target: the least energy, filler included, that meets a bound on the power swing in time.

Among clock plans that meet the target's time bound (iso-time, or its ``slowdown=X``), it takes the one whose
modelled energy *plus the filler it still needs* (``sim.filler``) is least:

- the levers of the clocks: the frontier's least-energy point at the deadline already slows work off the
  critical path, which lowers its power (and so the peak a floor is measured from) and stretches it into the
  bubble after it (work moved into a trough); other frontier points within the deadline are candidates too;
- from each, the clocks raised to at least a grid clock (a slowed instruction under a floor costs filler, a
  faster one may cost less), over a few clocks spread over the profiled grid; and capped at the lowest grid
  clock that still meets the deadline (found by bisection) and the next few above it: a lower peak lowers a
  floor and the ramps up to it;
- the schedule's order is megatron-core's and the iteration tail (gradient sync, optimizer step) follows the
  last backward in the DAG, so no other lever moves work into a trough: none is used;
- then filler, only where the chosen clocks still break the bound.

Each candidate is simulated under the switch latency; one slower than the deadline is dropped. The same
bound met by filler alone on stock clocks (the filler floor) is priced for the comparison the plan carries
(:class:`~megatron_energy.plan_smoothing.PlanSmoothing`). Every figure is *modelled*.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from megatron_energy.optimisers.perseus.frontier import FrontierPoint
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.pipeline.instruction import Step
from megatron_energy.pipeline.stock_clocks import all_max_clocks
from megatron_energy.plan_smoothing import PlanSmoothing
from megatron_energy.sim.filler import PipelineFiller, pipeline_filler
from megatron_energy.sim.power_timeline import stage_power_traces
from megatron_energy.sim.simulator import SimResult, Simulator
from megatron_energy.smooth_bound import SmoothBound
from megatron_energy.target import EnergyTarget

SPREAD_CLOCKS = 6
"""Grid clocks the raised and capped candidates are tried at, spread over the profiled grid."""

CAPS_TRIED = 3
"""Caps tried per starting point: the lowest that meets the deadline and the grid clocks just above it."""

BASE_POINTS = 4
"""Frontier points within the deadline the candidates start from, at most (the least-energy one first)."""


@dataclass(frozen=True)
class SmoothChoice:
    """The clocks a ``smooth:`` target runs and the filler they need (modelled)."""

    point: FrontierPoint
    """The point: its clocks and latency-aware time and energy, without filler."""

    filler: PipelineFiller
    """The filler the point still needs to meet the bound."""

    smoothing: PlanSmoothing
    """What the plan carries: the bound, the filler windows, the filler floor's cost."""


def smooth_point(planner: Planner, target: EnergyTarget) -> SmoothChoice:
    """The least-energy point of a ``smooth:`` target, filler included (see the module docstring).

    Args:
        planner: The job's planner (its DAG, profile, frontier and switch latency).
        target: The ``smooth:`` target.

    Returns:
        The choice.

    Raises:
        ValueError: If ``target`` is not a smooth target.
    """
    if target.smooth is None:
        raise ValueError(f"smooth_point needs a smooth target, got {target}")
    search = _Search(planner, target.smooth, target.deadline_s(planner.solver.baseline.iteration_time_s))
    best = planner.point_for_time(search.deadline_s)
    for base in (best, *_faster_points(planner, search.deadline_s, best)):
        search.price(base, base.clocks, within_deadline=base is not best)  # best: the planner's own point
        for clock in search.spread:
            search.price(base, search.clamped(base.clocks, at_least=clock))
        lowest = search.lowest_cap(base.clocks)
        for cap in search.grid[lowest : lowest + CAPS_TRIED]:
            search.price(base, search.clamped(base.clocks, at_most=cap))
    assert search.best is not None  # the least-energy point at the deadline is always priced
    _, point, filler = search.best
    stock = search.simulator.run(all_max_clocks(planner.dag, planner.profile))
    smoothing = PlanSmoothing(
        bound=search.bound,
        bin_s=filler.bin_s,
        filler=tuple(filler.windows(stage) for stage in range(planner.dag.num_stages)),
        filler_floor_j=_filler(stock, search.simulator, search.bound).energy_j,
    )
    return SmoothChoice(point, filler, smoothing)


def _faster_points(planner: Planner, deadline_s: float, best: FrontierPoint) -> list[FrontierPoint]:
    """Up to ``BASE_POINTS - 1`` other frontier points within the deadline, made executable."""
    within = [point for point in planner.frontier.points if point.time_s <= deadline_s and point is not best]
    step = max(1, len(within) // max(BASE_POINTS - 1, 1))
    return [planner.executable(point) for point in within[::step][: BASE_POINTS - 1]]


class _Search:
    """Candidate clocks priced by simulation, their filler included; the least total kept."""

    def __init__(self, planner: Planner, bound: SmoothBound, deadline_s: float):
        self.planner, self.bound, self.deadline_s = planner, bound, deadline_s
        self.simulator = Simulator(planner.dag, planner.profile)
        profile = planner.profile
        self.options = {key: sorted(option.clock_mhz for option in profile.options(key)) for key in profile}
        self.grid = sorted({clock for clocks in self.options.values() for clock in clocks})
        last = len(self.grid) - 1
        self.spread = sorted(
            {self.grid[round(i * last / max(SPREAD_CLOCKS - 1, 1))] for i in range(SPREAD_CLOCKS)}
        )
        self.best: tuple[float, FrontierPoint, PipelineFiller] | None = None

    def clamped(
        self, clocks: Mapping[Step, int], at_least: int | None = None, at_most: int | None = None
    ) -> dict[Step, int]:
        """``clocks`` raised to at least ``at_least`` or capped at ``at_most`` (the nearest on each grid)."""
        clamped = {}
        for step, clock in clocks.items():
            grid = self.options[step.work]
            if at_least is not None:
                clock = max(clock, next((mhz for mhz in grid if mhz >= at_least), grid[-1]))
            if at_most is not None:
                clock = min(clock, next((mhz for mhz in reversed(grid) if mhz <= at_most), grid[0]))
            clamped[step] = clock
        return clamped

    def lowest_cap(self, clocks: Mapping[Step, int]) -> int:
        """The index in :attr:`grid` of the lowest cap whose clocks still meet the deadline (bisection)."""
        low, high = 0, len(self.grid) - 1  # the top of the grid caps nothing: the point meets its deadline
        while low < high:
            middle = (low + high) // 2
            result = self.simulator.run(
                self.clamped(clocks, at_most=self.grid[middle]), self.planner.switch_latency_s
            )
            low, high = (low, middle) if self._meets_deadline(result) else (middle + 1, high)
        return low

    def price(self, base: FrontierPoint, clocks: Mapping[Step, int], within_deadline: bool = True) -> None:
        """Simulate ``clocks``; keep them if they meet the deadline for less energy, filler included.

        ``within_deadline=False`` prices them whatever their time (the planner's point for the deadline,
        which the plan would run anyway).
        """
        result = self.simulator.run(clocks, self.planner.switch_latency_s)
        if within_deadline and not self._meets_deadline(result):
            return
        filler = _filler(result, self.simulator, self.bound)
        total_j = result.total_energy_j + filler.energy_j
        if self.best is None or total_j < self.best[0] * (1 - 1e-12):
            self.best = (total_j, _as_point(base, clocks, result), filler)

    def _meets_deadline(self, result: SimResult) -> bool:
        """Whether a simulated iteration ends within the deadline (up to float rounding)."""
        return result.iteration_time_s <= self.deadline_s * (1 + 1e-9)


def _filler(result: SimResult, simulator: Simulator, bound: SmoothBound) -> PipelineFiller:
    """The filler ``result``'s power needs to meet ``bound``."""
    return pipeline_filler(stage_power_traces(result, simulator.powers), bound)


def _as_point(base: FrontierPoint, clocks: Mapping[Step, int], result: SimResult) -> FrontierPoint:
    """``base`` with ``clocks`` and the figures of their simulation (its deadline and bound kept)."""
    return dataclasses.replace(
        base,
        time_s=result.iteration_time_s,
        energy_j=result.total_energy_j,
        stage_energy_j=tuple(stage.total_energy_j for stage in result.stages),
        stage_busy_s=tuple(stage.busy_s for stage in result.stages),
        clocks=dict(clocks),
    )
