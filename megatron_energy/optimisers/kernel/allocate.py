"""An instruction's time budget distributed over its phases: least energy, convexly.

Each phase has a (time, energy) option per clock (the GPU spec's model, :class:`GpuPowerModel`, so each
class responds as the model says: compute-bound time scales with the clock, memory-bound time is flat down to
the saturation clock, fixed time does not move). Choosing one option per phase to minimise total energy with
total time within the budget is a multiple-choice knapsack; its convex relaxation is solved exactly by the
greedy below (every phase starts at its least-energy option and buys time along its lower convex hull,
cheapest joule per second first, until the budget is met), and a last pass moves each phase to any cheaper
option the remaining slack allows.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile


@dataclass(frozen=True)
class PhaseOption:
    """One way to run a phase: at ``clock_mhz`` it takes ``time_s`` and uses ``energy_j`` (modelled)."""

    clock_mhz: int
    time_s: float
    energy_j: float


def phase_options(model: GpuPowerModel, work: WorkProfile, clocks_mhz: Sequence[int]) -> list[PhaseOption]:
    """The options of ``work`` at each clock, fastest first."""
    options = [PhaseOption(c, model.time_s(work, c), model.energy_j(work, c)) for c in clocks_mhz]
    return sorted(options, key=lambda o: (o.time_s, o.energy_j, o.clock_mhz))


def lower_hull(options: Sequence[PhaseOption]) -> list[PhaseOption]:
    """The lower convex hull of the Pareto options, fastest first (energy strictly falling)."""
    pareto: list[PhaseOption] = []
    for option in sorted(options, key=lambda o: (o.time_s, o.energy_j, o.clock_mhz)):
        if not pareto or option.energy_j < pareto[-1].energy_j:
            pareto.append(option)
    hull: list[PhaseOption] = []
    for option in pareto:
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], option) <= 0:
            hull.pop()
        hull.append(option)
    return hull


def _cross(a: PhaseOption, b: PhaseOption, c: PhaseOption) -> float:
    """Positive when ``b`` lies below the segment ``a``–``c`` (the hull turns the right way)."""
    return (b.time_s - a.time_s) * (c.energy_j - a.energy_j) - (b.energy_j - a.energy_j) * (
        c.time_s - a.time_s
    )


def allocate(option_sets: Sequence[Sequence[PhaseOption]], budget_s: float) -> list[PhaseOption]:
    """The least-energy choice of one option per phase with total time within ``budget_s``.

    Args:
        option_sets: Each phase's options (:func:`phase_options`).
        budget_s: The time the phases may take together.

    Returns:
        One option per phase; every phase's fastest option when even those exceed the budget.
    """
    hulls = [lower_hull(options) for options in option_sets]
    chosen = [len(hull) - 1 for hull in hulls]  # least energy: the slowest hull point
    total_s = sum(hull[i].time_s for hull, i in zip(hulls, chosen, strict=True))
    heap: list[tuple[float, int]] = []
    for phase, hull in enumerate(hulls):
        _push_upgrade(heap, hull, chosen[phase], phase)
    while total_s > budget_s and heap:
        _, phase = heapq.heappop(heap)
        hull, index = hulls[phase], chosen[phase]
        total_s -= hull[index].time_s - hull[index - 1].time_s
        chosen[phase] = index - 1
        _push_upgrade(heap, hull, index - 1, phase)
    picked = [hull[i] for hull, i in zip(hulls, chosen, strict=True)]
    return _use_slack(picked, option_sets, budget_s)


def _push_upgrade(heap: list[tuple[float, int]], hull: Sequence[PhaseOption], index: int, phase: int) -> None:
    """Queue the phase's next step towards its fastest option, keyed by joules per second saved."""
    if index == 0:
        return
    faster, current = hull[index - 1], hull[index]
    heapq.heappush(heap, ((faster.energy_j - current.energy_j) / (current.time_s - faster.time_s), phase))


def _use_slack(
    picked: list[PhaseOption], option_sets: Sequence[Sequence[PhaseOption]], budget_s: float
) -> list[PhaseOption]:
    """Move each phase to its cheapest option that still fits the budget (one pass, largest saving first)."""
    total_s = sum(option.time_s for option in picked)
    if total_s > budget_s:
        return picked
    for phase, options in enumerate(option_sets):
        current = picked[phase]
        fitting = [current, *(o for o in options if total_s - current.time_s + o.time_s <= budget_s)]
        best = min(fitting, key=lambda o: (o.energy_j, o.time_s))
        if best.energy_j < current.energy_j:
            total_s += best.time_s - current.time_s
            picked[phase] = best
    return picked
