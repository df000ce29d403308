"""The memory clock as a lever: a static memory clock per pipeline rank, chosen on any optimiser's plan.

The optimisers choose SM clocks (and collective launch points, phase clocks); the memory clock is an outer
choice over their plan, per rank, for the whole run phase (``plan_memory`` says why it is static). Where the
GPU spec lists more than one memory clock (:func:`candidate_memory_clocks`), a greedy pass over the ranks
tries each lower memory clock ``m`` on each rank:

1. every instruction of the rank keeps its step no longer than the plan made it: its SM clock becomes the
   cheapest profiled clock whose time at ``m`` is at most its time at the plan's clock and the top memory
   clock (the fastest clock when none is; instructions with phase clocks keep theirs);
2. every point of the plan is priced again with the rank at ``m`` (:mod:`megatron_energy.sim.memory_clocks`:
   the simulator's pass of re-priced options, static power, the iteration tail);
3. the change is kept only if no point's iteration gets longer (the critical path is never slowed: a rank
   whose instructions or tail would delay the iteration's end keeps the top memory clock) and the target
   point's energy falls.

The pass repeats, each time keeping the change that saves the most, until none saves anything. Each point's
predicted energy, busy time and iteration time change by what that pricing changes against the same pricing
at the top memory clock, so what the optimiser's own pricing added (Kareus's collective choices, the phase
clocks) stays as it was. The plan then carries one memory clock per rank and says what it saves in its notes;
a plan where no rank gains stays exactly the plan it was (its file included). A ``smooth:`` plan keeps the
top memory clock: its filler was placed on its power there. Every figure is *modelled*.
"""

from __future__ import annotations

import dataclasses

from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.optimisers.interface import Optimiser, PlanningJob, ProfileRequest
from megatron_energy.optimisers.saving_band import clocks_the_job_runs
from megatron_energy.pipeline.instruction import Step
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import ClockAction, Plan, PlanPoint, RankPlan
from megatron_energy.sim.memory_clocks import MemoryClockPricing, MemoryClocks
from megatron_energy.sim.simulator import SimResult

TOLERANCE = 1e-9
"""Relative slack of a comparison of times or energies (one figure priced twice may differ by rounding)."""

LOWEST_MEMORY_FRACTION = 0.5
"""Memory clocks below this fraction of the top one are not tried: they are idle states that NVIDIA pairs
with the lowest SM clocks only (the RTX 3080 Ti's 810 and 405 MHz allow SM clocks up to 420 MHz)."""


def candidate_memory_clocks(spec: GpuSpec) -> tuple[int, ...]:
    """The lower memory clocks the lever tries on ``spec``, highest first (none on a one-clock GPU)."""
    top = spec.max_memory_clock_mhz
    return tuple(clock for clock in spec.memory_clocks_mhz[1:] if clock >= LOWEST_MEMORY_FRACTION * top)


@dataclasses.dataclass
class MemoryClockLever:
    """An optimiser whose plan then gets a memory clock per rank where that pays (module docstring).

    The wrapper the registry resolves every ``--energy-mode`` to; ``PlanningJob.memory_clock`` turns the
    lever off (``--energy-memory-clock off``).
    """

    inner: Optimiser
    """The optimiser that plans the SM clocks (and the rest)."""

    @property
    def name(self) -> str:
        """The inner optimiser's ``--energy-mode`` name."""
        return self.inner.name

    @property
    def request(self) -> ProfileRequest:
        """What the inner optimiser needs profiled (the lever needs nothing more)."""
        return self.inner.request

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        """The inner optimiser's plan, with the memory clocks :func:`choose_memory_clocks` keeps."""
        return choose_memory_clocks(self.inner.plan(profile, job, base), profile, job)


def choose_memory_clocks(plan: Plan, profile: Profile, job: PlanningJob) -> Plan:
    """``plan`` with a lower memory clock on each rank where it saves energy and slows nothing.

    Args:
        plan: A plan of ``job`` at the top memory clock (one that already carries memory clocks is kept).
        profile: The profile it was planned from.
        job: The job (its DAG and tail; ``job.memory_clock`` off, or a GPU without a spec or with one memory
            clock, keeps the plan).

    Returns:
        The plan with memory clocks and re-priced points, or ``plan`` itself when no rank gains.
    """
    spec = job.gpu or _spec_named(profile.gpu_name)
    candidates = () if spec is None else candidate_memory_clocks(spec)
    if spec is None or not job.memory_clock or not candidates or plan.memory_clocks_mhz or plan.smoothing:
        return plan  # a smooth plan's filler is placed on its power at the stock memory clock
    search = _Search(plan, profile, MemoryClockPricing(job.dag(), profile, spec, plan.switch_latency_s))
    memory: MemoryClocks = (None,) * plan.num_stages
    while True:
        best: tuple[float, MemoryClocks] | None = None
        for stage in range(plan.num_stages):
            for clock in candidates:
                if memory[stage] != clock:
                    trial = (*memory[:stage], clock, *memory[stage + 1 :])
                    gain = search.gain(trial, memory)
                    if gain is not None and (best is None or gain > best[0]):
                        best = (gain, trial)
        if best is None:
            break
        memory = best[1]
    if memory == (None,) * plan.num_stages:
        return plan
    return search.applied(memory, spec)


def _spec_named(gpu_name: str) -> GpuSpec | None:
    """The spec of the profile's GPU; ``None`` for a GPU without one (a CSV profile's ``unspecified``)."""
    try:
        return load_gpu_spec(gpu_name)
    except ValueError:
        return None


class _Search:
    """The plan's points priced under memory clocks, each rank's SM clocks adjusted (module docstring)."""

    def __init__(self, plan: Plan, profile: Profile, pricing: MemoryClockPricing):
        self.plan = plan
        self.profile = profile
        self.pricing = pricing
        self.clocks = [clocks_the_job_runs(point, pricing.dag) for point in plan.points]
        self.phased = [_phased_steps(point) for point in plan.points]
        stock = (None,) * plan.num_stages
        self.reference = [pricing.price(clocks, stock) for clocks in self.clocks]
        self._prices: dict[tuple[int, MemoryClocks], SimResult] = {}

    def gain(self, trial: MemoryClocks, current: MemoryClocks) -> float | None:
        """Energy ``trial`` saves against ``current`` at the target point; ``None`` if it slows or loses."""
        target = self.plan.target_index
        now, then = self.price(target, current), self.price(target, trial)
        gain = now.total_energy_j - then.total_energy_j
        if gain <= TOLERANCE * now.total_energy_j:
            return None
        for index, reference in enumerate(self.reference):
            if self.price(index, trial).iteration_time_s > reference.iteration_time_s * (1 + TOLERANCE):
                return None
        return gain

    def price(self, index: int, memory: MemoryClocks) -> SimResult:
        """Point ``index`` priced with ``memory``, its SM clocks adjusted."""
        key = (index, memory)
        price = self._prices.get(key)
        if price is None:
            price = self._prices[key] = self.pricing.price(self.adjusted(index, memory), memory)
        return price

    def adjusted(self, index: int, memory: MemoryClocks) -> dict[Step, int]:
        """Point ``index``'s SM clocks with each lowered rank's steps kept no longer (module docstring)."""
        clocks = dict(self.clocks[index])
        for step, clock in self.clocks[index].items():
            memory_mhz = memory[step.stage]
            if memory_mhz is not None and step not in self.phased[index]:
                clocks[step] = self._cheapest_no_longer(step, clock, memory_mhz)
        return clocks

    def _cheapest_no_longer(self, step: Step, clock_mhz: int, memory_mhz: int) -> int:
        """The cheapest clock whose time at ``memory_mhz`` is at most ``clock_mhz``'s at the top one."""
        key = step.work
        limit_s = self.profile.option_at(key, clock_mhz).time_s * (1 + TOLERANCE)
        options = self.pricing.options_at(key, memory_mhz)
        fitting = [option for option in options if option.time_s <= limit_s]
        if not fitting:
            return min(options, key=lambda option: (option.time_s, option.energy_j)).clock_mhz
        return min(fitting, key=lambda option: (option.energy_j, -option.clock_mhz)).clock_mhz

    def applied(self, memory: MemoryClocks, spec: GpuSpec) -> Plan:
        """The plan with ``memory`` on its ranks: adjusted clock actions and re-priced points."""
        points = tuple(self._point(index, memory) for index in range(len(self.plan.points)))
        top = spec.max_memory_clock_mhz
        clocks = tuple(top if clock is None else clock for clock in memory)
        target = self.plan.target_index
        saving_j = self.reference[target].total_energy_j - self.price(target, memory).total_energy_j
        lowered = ", ".join(f"rank {stage} {clock} MHz" for stage, clock in enumerate(clocks) if clock != top)
        note = (
            f"memory clocks: {lowered} (top {top} MHz) save {saving_j:,.1f} J per iteration at the target "
            f"point, no point slower (modelled)"
        )
        return dataclasses.replace(
            self.plan, points=points, memory_clocks_mhz=clocks, notes=(*self.plan.notes, note)
        )

    def _point(self, index: int, memory: MemoryClocks) -> PlanPoint:
        point, reference, price = self.plan.points[index], self.reference[index], self.price(index, memory)
        clocks = self.adjusted(index, memory)
        ranks = tuple(
            RankPlan(
                actions=tuple(
                    dataclasses.replace(action, clock_mhz=clocks.get(action.at.step, action.clock_mhz))
                    if isinstance(action, ClockAction) and action.at.phase is None
                    else action
                    for action in rank.actions
                ),
                energy_j=rank.energy_j
                + price.stages[stage].total_energy_j
                - reference.stages[stage].total_energy_j,
                busy_s=rank.busy_s + price.stages[stage].busy_s - reference.stages[stage].busy_s,
            )
            for stage, rank in enumerate(point.ranks)
        )
        time_s = point.iteration_time_s + price.iteration_time_s - reference.iteration_time_s
        return dataclasses.replace(point, iteration_time_s=time_s, ranks=ranks)


def _phased_steps(point: PlanPoint) -> frozenset[Step]:
    """The steps with phase clocks inside them (they keep their instruction clock)."""
    return frozenset(
        action.at.step
        for rank in point.ranks
        for action in rank.actions
        if isinstance(action, ClockAction) and action.at.phase is not None
    )
