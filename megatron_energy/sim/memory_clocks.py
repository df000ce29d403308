"""One iteration under a plan's SM clocks with a memory clock per pipeline stage (every figure *modelled*).

A rank's memory clock ``m`` is static over the run phase (``plan_memory``), so it changes everything its GPU
does in an iteration (``dvfs.model``):

* **instructions**: each profile option ``(f, time, energy)`` of the stage is re-priced by the model's ratio
  ``t(f, m) / t(f, m_max)`` (and the same for energy) for the instruction's work, fitted to its profile rows
  (:func:`~megatron_energy.dvfs.model.fit_work_profile`): memory-bound time stretches by ``m_max / m``, static
  power falls, and power-capped compute runs at a higher clock;
* **blocked and idle time**: the GPU's static power falls by ``memory_idle_power_w x (1 - m / m_max)``;
* **the iteration tail**: a modelled optimizer step is memory-bound (its time stretches by ``m_max / m``), a
  modelled gradient sync is communication (unchanged); a measured tail is priced as memory-bound work
  throughout (its parts are not known apart: the most it could slow down).

The pipeline part (every stage's instructions, waits and transfers) is the simulator's pass over the
re-priced options, with the plan's switch latency; the tails and idle waits then follow per stage
(:func:`~megatron_energy.sim.simulator.account_stage`): the iteration ends when the last stage's tail does.
With every stage at the top memory clock the figures are the simulator's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile, fit_work_profile
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Step, Work
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.plan import Plan
from megatron_energy.sim.simulator import SimResult, Simulator, StagePowers, account_stage

MemoryClocks = tuple[int | None, ...]
"""One memory clock per stage (MHz); ``None`` is the top (stock) one."""

_MEMORY_BOUND = WorkProfile(compute_s=0.0, memory_s=1.0)
"""Unit memory-bound work: how a measured tail is re-priced."""


def plan_memory(plan: Plan, spec: GpuSpec) -> MemoryClocks:
    """A plan's memory clock per stage, ``None`` where it keeps the top one."""
    clocks = plan.memory_clocks_mhz or (spec.max_memory_clock_mhz,) * plan.num_stages
    return tuple(None if clock == spec.max_memory_clock_mhz else clock for clock in clocks)


class MemoryClockPricing:
    """Prices SM clocks per instruction with a memory clock per stage (see the module docstring)."""

    def __init__(self, dag: PipelineDag, profile: Profile, spec: GpuSpec, switch_latency_s: float):
        """Prepare the pricing of ``dag``'s iterations.

        Args:
            dag: The iteration DAG (its tail included).
            profile: Time and energy per SM clock of every instruction, at the top memory clock.
            spec: The GPU (memory clocks, the model's parameters).
            switch_latency_s: SM-clock switch latency of the plan priced.
        """
        self.dag = dag
        self.profile = profile
        self.model = GpuPowerModel(spec)
        self.switch_latency_s = switch_latency_s
        self._works: dict[Work, WorkProfile] = {}
        self._options: dict[tuple[Work, int | None], list[ClockOption]] = {}
        self._simulators: dict[MemoryClocks, Simulator] = {}

    def price(self, clocks: Mapping[Step, int], memory: MemoryClocks) -> SimResult:
        """The iteration at SM ``clocks`` (per compute node) and ``memory`` (per stage), modelled.

        Its timeline is the pipeline part's (tail slices at their stock length).
        """
        if len(memory) != self.dag.num_stages:
            raise ValueError(f"{len(memory)} memory clocks for {self.dag.num_stages} stages")
        result = self._simulator(memory).run(clocks)
        ends = [stage.busy_s + stage.blocked_s for stage in result.stages]
        tails = [self._tail(stage, clock) for stage, clock in enumerate(memory)]
        iteration_s = max(end + tail_s for end, (tail_s, _) in zip(ends, tails, strict=True))
        base = self.profile
        stages = []
        for stage, clock in enumerate(memory):
            saving_w = self._static_saving_w(clock)
            powers = StagePowers(base.blocked_power_w - saving_w, base.idle_power_w - saving_w)
            simulated = result.stages[stage]
            stages.append(
                account_stage(
                    stage,
                    simulated.busy_s,
                    simulated.busy_energy_j,
                    ends[stage],
                    iteration_s,
                    tails[stage],
                    powers,
                )
            )
        return dataclasses.replace(result, iteration_time_s=iteration_s, stages=stages)

    def _static_saving_w(self, memory_clock_mhz: int | None) -> float:
        """Static power a memory clock saves against the top one."""
        return self.model.static_power_w() - self.model.static_power_w(memory_clock_mhz)

    def _tail(self, stage: int, memory_clock_mhz: int | None) -> tuple[float, float]:
        """``(time_s, energy_j)`` of one stage's iteration tail at ``memory_clock_mhz``."""
        tail = self.dag.tail
        idle_w = self.profile.idle_power_w - self._static_saving_w(memory_clock_mhz)
        if tail.is_measured:
            time_ratio, energy_ratio = self._ratios(
                _MEMORY_BOUND, self.model.spec.max_sm_clock_mhz, memory_clock_mhz
            )
            return tail.time_s * time_ratio, tail.stage_energy_j[stage] * energy_ratio
        stretch = 1.0 if memory_clock_mhz is None else self.model.spec.max_memory_clock_mhz / memory_clock_mhz
        time_s = tail.dp_sync_s + tail.optimizer_s * stretch
        return time_s, time_s * idle_w

    def _simulator(self, memory: MemoryClocks) -> Simulator:
        """The simulator of the options re-priced at ``memory`` (the profile's blocked and idle powers)."""
        simulator = self._simulators.get(memory)
        if simulator is None:
            profile = self.profile
            options = {key: self.options_at(key, memory[key.stage]) for key in profile}
            repriced = Profile(
                options, profile.gpu_name, profile.source, profile.blocked_power_w, profile.idle_power_w
            )
            simulator = self._simulators[memory] = Simulator(
                self.dag, repriced, switch_latency_s=self.switch_latency_s
            )
        return simulator

    def options_at(self, key: Work, memory_clock_mhz: int | None) -> list[ClockOption]:
        """``key``'s profile options at ``memory_clock_mhz`` (the profile's own at the top memory clock)."""
        if memory_clock_mhz is None:
            return self.profile.options(key)
        cached = self._options.get((key, memory_clock_mhz))
        if cached is None:
            work = self._work(key)
            cached = []
            for option in self.profile.options(key):
                time_ratio, energy_ratio = self._ratios(work, option.clock_mhz, memory_clock_mhz)
                cached.append(
                    ClockOption(option.clock_mhz, option.time_s * time_ratio, option.energy_j * energy_ratio)
                )
            self._options[(key, memory_clock_mhz)] = cached
        return cached

    def _ratios(self, work: WorkProfile, clock_mhz: int, memory_clock_mhz: int | None) -> tuple[float, float]:
        """Time and energy of ``work`` at ``(clock_mhz, memory_clock_mhz)`` over those at the top one."""
        model = self.model
        return (
            model.time_s(work, clock_mhz, memory_clock_mhz) / model.time_s(work, clock_mhz),
            model.energy_j(work, clock_mhz, memory_clock_mhz) / model.energy_j(work, clock_mhz),
        )

    def _work(self, key: Work) -> WorkProfile:
        """The instruction's work, fitted to its profile rows."""
        work = self._works.get(key)
        if work is None:
            rows = [(o.clock_mhz, o.time_s, o.energy_j) for o in self.profile.options(key)]
            work = self._works[key] = fit_work_profile(self.model.spec, rows).work
        return work
