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

from megatron_energy.commands.optimiser_comparison import all_optimiser, kareus_optimiser
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.errors import EnergyValueError
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.interface import SWITCH_EVALUATIONS, Optimiser, PlanningJob
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

    With more than one worker, Kareus alone (which needs no Perseus plan) is planned at every target in a
    process of its own while this one sweeps Perseus's frontier; then the targets are planned side by side,
    each taking that plan as the composition's Kareus alone. The figures are those of the sequential loop.

    Args:
        job: The job.
        targets: The planning targets, in the order the table lists them.
        budget: Kareus's search budget; its default when ``None``.
        points: Deadlines in Perseus's frontier sweep.
        progress: Called with a line as each stage starts (the command prints it).
        workers: Processes planning side by side (forked, so each plans as the sequential loop would); the
            CPUs this process may use, at most one per target, when ``None``; 1 plans everything in this
            process.
        switch_evaluations: Latency-aware simulations the switch-latency post-pass may run per point
            (``PlanningJob.switch_evaluations``).

    Returns:
        The rows.
    """
    global _TASK  # a forked worker reads the task it inherits: nothing of it is pickled
    spec = job.spec()
    profile = job.synthetic_profile(spec)
    plannings = tuple(_planning(job, target, points, spec, switch_evaluations) for target in targets)
    workers = min(len(targets), workers or _usable_cpus())
    forking = workers > 1 and "fork" in multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork") if forking else None
    kareus_alone: list[Plan | None] = [None] * len(targets)
    beside = None
    if context is not None:
        _TASK = _KareusAlone(kareus_optimiser(budget), profile, plannings)
        beside = context.Pool(1)
        planned_beside = beside.map_async(_run_alone, range(len(targets)), chunksize=1)
    try:
        progress(f"the frontier sweep (Perseus, shared by the targets){_BESIDE if beside else ''}")
        planners = PlannerCache()
        planner = PerseusOptimiser(planners).planner(profile, plannings[0])
        planner.min_energy_point  # noqa: B018 (the sweep and the unconstrained solve, before the targets fan out)
        if beside is not None:
            kareus_alone = planned_beside.get()
    finally:
        _TASK = None
        if beside is not None:
            beside.terminate()  # its plans are in (or no longer wanted)
            beside.join()
    task = _TargetTask(profile, planners, tuple(targets), plannings, budget, tuple(kareus_alone), progress)
    if context is None:
        rows = [task(index) for index in range(len(targets))]
    else:
        _TASK = task
        try:
            with context.Pool(workers) as pool:
                rows = pool.map(_run_target, range(len(targets)), chunksize=1)
        finally:
            _TASK = None
    return JobEstimate(job, spec, tuple(row for target_rows in rows for row in target_rows))


_BESIDE = ", Kareus alone at every target beside it"
"""What the progress line adds where Kareus alone is planned beside the sweep."""


@dataclass(frozen=True)
class _KareusAlone:
    """Kareus alone at one target (an index into ``plannings``); ``None`` where it cannot plan alone."""

    kareus: Optimiser
    profile: Profile
    plannings: tuple[PlanningJob, ...]

    def __call__(self, index: int) -> Plan | None:
        try:
            return self.kareus.plan(self.profile, self.plannings[index])
        except EnergyValueError:  # the composition then leaves it out, as it does itself
            return None


@dataclass(frozen=True)
class _TargetTask:
    """Every mode of the job at one target (an index into ``targets``)."""

    profile: Profile
    planners: PlannerCache
    targets: tuple[EnergyTarget, ...]
    plannings: tuple[PlanningJob, ...]
    budget: SearchBudget | None
    kareus_alone: tuple[Plan | None, ...]
    progress: Callable[[str], None]

    def __call__(self, index: int) -> list[ModeEstimate]:
        target, profile, planning = self.targets[index], self.profile, self.plannings[index]
        step = f"[{index + 1}/{len(self.targets)}] {target}"
        self.progress(f"{step}: planning {', '.join(ESTIMATE_MODES)}")
        known = self.kareus_alone[index]
        planned = None if known is None else {known.optimisers[-1]: known}
        both, alone = all_optimiser(self.budget, self.planners).plan_with_parts(
            profile, planning, None, planned
        )
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


_TASK: _TargetTask | _KareusAlone | None = None
"""The task a forked worker runs (set by :func:`estimate_job` while its pool lives)."""


def _run_alone(index: int) -> Plan | None:
    assert isinstance(_TASK, _KareusAlone)
    return _TASK(index)


def _run_target(index: int) -> list[ModeEstimate]:
    assert isinstance(_TASK, _TargetTask)
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
