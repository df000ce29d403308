"""Every mode's plan of a job at every target, each with its saving band (``megatron-energy estimate``).

For each target the modes are planned as ``--energy-mode all`` plans them (``commands.optimiser_comparison``
``all_optimiser``): Perseus, then Kareus and the phase clocks refining it, each part alone besides, so one
composition gives the ``perseus``, ``kareus``, ``kernel`` and ``all`` plans. Each then gets the memory lever
(``--energy-memory-clock auto``, the flag's default: ``optimisers.memory_clock``) and its saving band
(``optimisers.saving_band``), as ``megatron-energy plan`` gives them, so the Perseus row at a target is what
``plan --config`` prints for the same job and target.

What does not depend on the target is done once: the job's modelled profile, and Perseus's frontier sweep
(one :class:`~megatron_energy.optimisers.perseus.planner_cache.PlannerCache` across the targets). The plans
keep no straggler points (``PlanningJob.kept_points`` 0): an estimate prints the target point alone, which
those points do not change. Every figure is *modelled* (the GPU spec's time/power model).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from megatron_energy.commands.optimiser_comparison import all_optimiser
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.interface import SWITCH_EVALUATIONS, PlanningJob
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.optimisers.memory_clock import choose_memory_clocks
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.optimisers.perseus.planner_cache import PlannerCache
from megatron_energy.optimisers.saving_band import with_saving_band
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan
from megatron_energy.plan_outcome import plan_saving
from megatron_energy.target import EnergyTarget

ESTIMATE_MODES: tuple[str, ...] = ("perseus", "kareus", "kernel", "all")
"""The modes an estimate plans, in the order its table lists them."""

DEFAULT_POINTS = 100
"""Deadlines in Perseus's frontier sweep: ``megatron-energy plan``'s default, so the figures are its."""


@dataclass(frozen=True)
class ModeEstimate:
    """One mode at one target: its plan's target point against stock clocks (modelled)."""

    target: EnergyTarget
    """The planning target."""
    mode: str
    """One of :data:`ESTIMATE_MODES`."""
    plan: Plan | None
    """The mode's plan with its saving band; ``None`` where the mode cannot plan this job alone."""
    reason: str = ""
    """Why there is no plan (empty with one)."""

    @property
    def saving(self) -> float:
        """Energy per iteration against stock clocks, ``planned / stock - 1`` (negative: a saving)."""
        assert self.plan is not None
        return plan_saving(self.plan)

    @property
    def time_change(self) -> float:
        """Iteration time against stock clocks, ``planned / stock - 1``."""
        assert self.plan is not None
        return self.plan.target_point.iteration_time_s / self.plan.baseline.iteration_time_s - 1


@dataclass(frozen=True)
class JobEstimate:
    """Every mode of one job at every target (modelled)."""

    job: JobConfig
    """The job."""
    spec: GpuSpec
    """Its GPU spec (the model's parameters)."""
    rows: tuple[ModeEstimate, ...]
    """Target by target, mode by mode (:data:`ESTIMATE_MODES` order)."""

    @property
    def switch_latency_s(self) -> float:
        """The clock-switch latency every plan is executable under (the GPU spec's)."""
        return self.spec.switch_latency_s

    def row(self, target: EnergyTarget, mode: str) -> ModeEstimate:
        """The row of ``mode`` at ``target``."""
        return next(row for row in self.rows if row.target == target and row.mode == mode)


def estimate_job(
    job: JobConfig,
    targets: Sequence[EnergyTarget],
    budget: SearchBudget | None = None,
    points: int = DEFAULT_POINTS,
    progress: Callable[[str], None] = lambda _: None,
    workers: int | None = None,
    switch_evaluations: int = SWITCH_EVALUATIONS,
) -> JobEstimate:
    """Plan every mode of ``job`` at every target (module docstring).

    Args:
        job: The job.
        targets: The planning targets, in the order the table lists them.
        budget: Kareus's search budget; its default when ``None``.
        points: Deadlines in Perseus's frontier sweep.
        progress: Called with a line as each stage starts (the command prints it).
        workers: Processes planning the targets side by side (forked once the shared frontier is swept, so
            each plans as the sequential loop would); the CPUs this process may use, at most one per target,
            when ``None``; 1 plans them in this process.
        switch_evaluations: Latency-aware simulations the switch-latency post-pass may run per point
            (``PlanningJob.switch_evaluations``).

    Returns:
        The rows.
    """
    spec = job.spec()
    profile = job.synthetic_profile(spec)
    planners = PlannerCache()
    progress("the frontier sweep (Perseus, shared by the targets)")
    first = _planning(job, targets[0], points, spec, switch_evaluations)
    planner = PerseusOptimiser(planners).planner(profile, first)
    planner.min_energy_point  # noqa: B018 (the sweep and the unconstrained solve, before the targets fan out)
    task = _TargetTask(
        job, spec, profile, planners, tuple(targets), budget, points, switch_evaluations, progress
    )
    workers = min(len(targets), workers or _usable_cpus())
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        rows = [task(index) for index in range(len(targets))]
    else:
        global _TASK  # a forked worker reads the task it inherits: nothing of it is pickled
        _TASK = task
        try:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                rows = pool.map(_run_task, range(len(targets)), chunksize=1)
        finally:
            _TASK = None
    return JobEstimate(job, spec, tuple(row for target_rows in rows for row in target_rows))


@dataclass(frozen=True)
class _TargetTask:
    """Every mode of the job at one target (an index into ``targets``)."""

    job: JobConfig
    spec: GpuSpec
    profile: Profile
    planners: PlannerCache
    targets: tuple[EnergyTarget, ...]
    budget: SearchBudget | None
    points: int
    switch_evaluations: int
    progress: Callable[[str], None]

    def __call__(self, index: int) -> list[ModeEstimate]:
        target, profile = self.targets[index], self.profile
        step = f"[{index + 1}/{len(self.targets)}] {target}"
        self.progress(f"{step}: planning {', '.join(ESTIMATE_MODES)}")
        planning = _planning(self.job, target, self.points, self.spec, self.switch_evaluations)
        both, alone = all_optimiser(self.budget, self.planners).plan_with_parts(profile, planning)
        plans = {**alone, "all": both}
        self.progress(f"{step}: memory clocks and saving bands")
        rows = []
        for mode in ESTIMATE_MODES:
            plan = plans.get(mode)
            if plan is None:
                rows.append(ModeEstimate(target, mode, None, f"{mode} cannot plan this job alone"))
                continue
            levered = choose_memory_clocks(plan, profile, planning)
            rows.append(ModeEstimate(target, mode, with_saving_band(levered, profile, planning)))
        self.progress(f"{step}: done")
        return rows


_TASK: _TargetTask | None = None
"""The task a forked worker runs (set by :func:`estimate_job` while its pool lives)."""


def _run_task(index: int) -> list[ModeEstimate]:
    assert _TASK is not None
    return _TASK(index)


def _usable_cpus() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _planning(
    job: JobConfig, target: EnergyTarget, points: int, spec: GpuSpec, switch_evaluations: int
) -> PlanningJob:
    """The job as the optimisers plan it for ``target``, without straggler points (module docstring)."""
    planning = job.planning_job(target, points, spec=spec)
    return dataclasses.replace(planning, kept_points=0, switch_evaluations=switch_evaluations)
