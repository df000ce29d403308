"""The ``smooth:`` target: the least energy, filler included, that meets a bound on the power swing in time.

Among clock plans that meet the target's time bound (iso-time, or its ``slowdown=X``), it takes the one whose
modelled energy *plus the filler it still needs* (``sim.filler``) is least:

- the levers of the clocks: the frontier's least-energy point at the deadline already slows work off the
  critical path, which lowers its power (and so the peak a floor is measured from) and stretches it into the
  bubble after it (work moved into a trough); other frontier points within the deadline are candidates too;
- from each, the clocks raised to at least a grid clock (a slowed instruction under a floor costs filler, a
  faster one may cost less) and capped at one (a lower peak lowers a floor; only where the deadline still
  holds), over a few clocks spread over the profiled grid;
- the schedule's order is megatron-core's and the iteration tail (gradient sync, optimizer step) follows the
  last backward in the DAG, so no other lever moves work into a trough: none is used;
- then filler, only where the chosen clocks still break the bound.

Each candidate is simulated under the switch latency; one slower than the deadline is dropped. The same
bound met by filler alone on stock clocks (the filler floor) is priced for the comparison the plan carries
(:class:`~megatron_energy.plan_smoothing.PlanSmoothing`). Every figure is *modelled*.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
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
    bound = target.smooth
    deadline_s = target.deadline_s(planner.solver.baseline.iteration_time_s)
    simulator = Simulator(planner.dag, planner.profile)
    best = planner.point_for_time(deadline_s)
    bases = [best, *_faster_points(planner, deadline_s, best)]
    grid = sorted({option.clock_mhz for key in planner.profile for option in planner.profile.options(key)})
    spread = [grid[round(i * (len(grid) - 1) / max(SPREAD_CLOCKS - 1, 1))] for i in range(SPREAD_CLOCKS)]
    choice: tuple[float, FrontierPoint, PipelineFiller] | None = None
    for base in bases:
        for clocks in _variants(planner, base.clocks, spread):
            result = simulator.run(clocks, planner.switch_latency_s)
            if result.iteration_time_s > deadline_s * (1 + 1e-9):
                continue
            filler = _filler(result, simulator, bound)
            total_j = result.total_energy_j + filler.energy_j
            if choice is None or total_j < choice[0] * (1 - 1e-12):
                choice = (total_j, _as_point(base, clocks, result), filler)
    assert choice is not None  # the least-energy point itself meets its deadline
    stock = simulator.run(all_max_clocks(planner.dag, planner.profile))
    _, point, filler = choice
    smoothing = PlanSmoothing(
        bound=bound,
        bin_s=filler.bin_s,
        filler=tuple(filler.windows(stage) for stage in range(planner.dag.num_stages)),
        filler_floor_j=_filler(stock, simulator, bound).energy_j,
    )
    return SmoothChoice(point, filler, smoothing)


def _faster_points(planner: Planner, deadline_s: float, best: FrontierPoint) -> list[FrontierPoint]:
    """Up to ``BASE_POINTS - 1`` other frontier points within the deadline, made executable."""
    within = [point for point in planner.frontier.points if point.time_s <= deadline_s and point is not best]
    step = max(1, len(within) // max(BASE_POINTS - 1, 1))
    return [planner.executable(point) for point in within[::step][: BASE_POINTS - 1]]


def _variants(planner: Planner, clocks: Mapping[Step, int], spread: Sequence[int]) -> list[dict[Step, int]]:
    """The point's clocks, then raised to at least and capped at each of ``spread`` (on each step's grid)."""
    options = {step: sorted(o.clock_mhz for o in planner.profile.options(step.work)) for step in clocks}
    variants = [dict(clocks)]
    for clock in spread:
        at_least = {step: next((g for g in grid if g >= clock), grid[-1]) for step, grid in options.items()}
        at_most = {s: next((g for g in grid[::-1] if g <= clock), grid[0]) for s, grid in options.items()}
        raised = {step: max(mhz, at_least[step]) for step, mhz in clocks.items()}
        capped = {step: min(mhz, at_most[step]) for step, mhz in clocks.items()}
        variants += [variant for variant in (raised, capped) if variant not in variants]
    return variants


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
