"""Perseus-only vs Kareus-only vs all, every figure *modelled* (``simulate --compare``, ``demo``).

Each mode's row is its plan's target point as its plan file predicts it: planned by the optimisers of
``--energy-mode`` (the same ones, on the same ``PlanningJob``, as ``megatron-energy plan`` and the session)
and priced under the GPU's switch latency (Perseus's executable points; Kareus's collective choices added to
the latency-aware simulation of their clocks, ``kareus.pricing``; the phase optimiser's latency-aware
change). A plan line, the demo's table and ``report`` print the same figures and the same saving
(``plan_outcome.energy_change``). The profile is the job description's synthetic one
(:func:`compare_optimisers`) or the one a live session measured (:func:`compare_job_folder`, the demo):

* **stock**: every instruction at its fastest clock, megatron-core's default collective schedule;
* **perseus**: ``--energy-mode perseus``'s plan: a clock per instruction;
* **kareus**: ``--energy-mode kareus``'s plan: stock clocks, the collectives' launch points and CTA budgets;
* **all**: ``--energy-mode all``'s plan: Perseus, then Kareus, then phase clocks, each refinement kept where
  it does not lose, or one of its parts' plans where that predicts less energy within the target
  (``composition``; the plan's notes say which).

Each planned mode is then also given the memory lever (``optimisers.memory_clock``, what
``--energy-memory-clock auto`` adds to the session's plan): the memory rows, printed apart
(``commands.memory_lever_output``).

Every row's deadline is the target's on the stock iteration; no row's iteration exceeds it. On an MoE job
with expert parallelism each row also carries the expert all-to-all's part of its iteration
(``commands.all_to_all_share``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from megatron_energy.commands.all_to_all_share import AllToAllShare, all_to_all_share
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.energy_dir import JobFiles
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.composition import ComposedOptimiser
from megatron_energy.optimisers.interface import PlanningJob, ProfileRequest
from megatron_energy.optimisers.kareus.collective_optimiser import KareusOptimiser
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.optimisers.kernel.phase_optimiser import PhaseOptimiser
from megatron_energy.optimisers.memory_clock import candidate_memory_clocks, choose_memory_clocks
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.optimisers.perseus.planner_cache import PlannerCache
from megatron_energy.optimisers.saving_band import saving_band, with_saving_band
from megatron_energy.pipeline.collectives import build_collectives
from megatron_energy.pipeline.dag_nodes import IterationTail
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan
from megatron_energy.plan_band import SavingBand
from megatron_energy.report.job_folder import ReportError, read_job_folder
from megatron_energy.runtime.planning_round.replanning import job_from_facts
from megatron_energy.runtime.profiling.measured_inputs import MeasuredInputs
from megatron_energy.target import EnergyTarget, parse_target

MODES: tuple[str, ...] = ("stock", "perseus", "kareus", "all")
"""The rows of a comparison, in order."""


@dataclass(frozen=True)
class ModeResult:
    """One row: the iteration under one mode, as the mode's plan file predicts it (modelled)."""

    mode: str
    """One of :data:`MODES`."""
    iteration_time_s: float
    """Predicted iteration time under the switch latency."""
    stage_energy_j: tuple[float, ...]
    """Predicted energy per iteration of each stage's GPU."""
    deadline_s: float
    """The iteration time the target allows (the target's deadline on the stock iteration)."""
    idle_power_w: float
    """The GPU's idle power: the static part of every second of the iteration."""
    plan: Plan
    """The mode's plan (stock: the Perseus plan, whose baseline is this row)."""
    all_to_all: AllToAllShare | None = None
    """The expert all-to-all's part of the iteration (modelled); ``None`` without one."""
    versus_perseus: SavingBand | None = None
    """The band of the row's energy change against the Perseus row (``optimisers.saving_band``, both plans
    priced under each variant); ``None`` for the Perseus row itself."""

    @property
    def total_energy_j(self) -> float:
        """Predicted energy of the pipeline's GPUs per iteration."""
        return sum(self.stage_energy_j)

    def stage_static_j(self, stage: int) -> float:
        """Static energy of one stage's GPU: idle power over the iteration."""
        del stage  # the same on every GPU of the pipeline
        return self.idle_power_w * self.iteration_time_s

    @property
    def static_j(self) -> float:
        """Static energy of the pipeline's GPUs."""
        return sum(self.stage_static_j(stage) for stage in range(len(self.stage_energy_j)))

    @property
    def dynamic_j(self) -> float:
        """Energy above idle power."""
        return self.total_energy_j - self.static_j


@dataclass(frozen=True)
class ComparedJob:
    """What the comparison's tables say about the job."""

    name: str
    """The job's name."""
    pipeline_stages: int
    """GPUs of one pipeline (the figures' scope)."""
    pipelines: int
    """Pipelines of the whole job (tensor-parallel x data-parallel size)."""


@dataclass(frozen=True)
class Comparison:
    """Every mode of one job (modelled)."""

    job: ComparedJob
    """The job."""
    spec: GpuSpec
    """Its GPU spec."""
    rows: tuple[ModeResult, ...]
    """One per :data:`MODES` entry."""
    switch_latency_s: float
    """The clock-switch latency every plan is executable under."""
    memory_rows: tuple[ModeResult, ...] = ()
    """Each planned mode (:data:`MODES` but stock) with the memory lever (``optimisers.memory_clock``): its
    plan with the memory clocks that pay, the plan itself where none does; none on a GPU with no lower
    memory clock to try."""

    def row(self, mode: str) -> ModeResult:
        """The row of ``mode``."""
        return self.rows[MODES.index(mode)]

    def memory_row(self, mode: str) -> ModeResult:
        """The row of ``mode`` with the memory lever."""
        return next(row for row in self.memory_rows if row.mode == mode)


def all_optimiser(
    budget: SearchBudget | None = None, planners: PlannerCache | None = None
) -> ComposedOptimiser:
    """``--energy-mode all`` as the registry resolves it, with Kareus's search budget.

    Args:
        budget: Kareus's search budget; its default when ``None``.
        planners: Perseus's planners kept across targets of one job (``estimate``); none kept when ``None``.
    """
    return ComposedOptimiser([PerseusOptimiser(planners), kareus_optimiser(budget), PhaseOptimiser()])


def kareus_optimiser(budget: SearchBudget | None = None) -> KareusOptimiser:
    """Kareus as ``all`` composes it, with its search budget (its default when ``None``)."""
    return KareusOptimiser(budget=budget) if budget is not None else KareusOptimiser()


def compare_optimisers(
    job: JobConfig, budget: SearchBudget | None = None, target: EnergyTarget | None = None, points: int = 40
) -> Comparison:
    """Plan and price the modes of a job description on its synthetic profile (module docstring).

    Args:
        job: The job description.
        budget: Kareus's search budget (model-priced trials per stage); its default when ``None``.
        target: The planning target; iso-time when ``None``.
        points: Deadlines in Perseus's frontier sweep (``megatron-energy plan --points``).

    Returns:
        The rows.
    """
    spec = job.spec()
    subject = ComparedJob(job.name, job.pipeline_stages, job.tensor_parallel * job.data_parallel)
    planning = job.planning_job(target or parse_target("iso-time"), points, spec=spec)
    return compare_modes(subject, job.synthetic_profile(spec), planning, spec, budget)


def compare_modes(
    job: ComparedJob,
    profile: Profile,
    planning: PlanningJob,
    spec: GpuSpec,
    budget: SearchBudget | None = None,
) -> Comparison:
    """Plan every mode of a job and take each plan's target point (module docstring).

    Args:
        job: What the tables say about the job.
        profile: Time and energy of its instructions per clock.
        planning: The job as the optimisers plan it (its collectives included).
        spec: The GPU spec.
        budget: Kareus's search budget; its default when ``None``.

    Returns:
        The rows, stock first.
    """
    both, alone = all_optimiser(budget).plan_with_parts(profile, planning)  # perseus and kareus alone too
    plans = {
        mode: with_saving_band(plan, profile, planning)
        for mode, plan in (("perseus", alone["perseus"]), ("kareus", alone["kareus"]), ("all", both))
    }
    perseus = plans["perseus"]
    deadline_s = planning.target.deadline_s(perseus.baseline.iteration_time_s)
    idle_w = profile.idle_power_w
    collectives = build_collectives(planning.collectives) if planning.collectives is not None else []
    stock_s = perseus.baseline.iteration_time_s
    rows = [
        ModeResult(
            "stock",
            stock_s,
            perseus.baseline.stage_energy_j,
            deadline_s,
            idle_w,
            perseus,
            all_to_all_share(collectives, None, stock_s, spec),
            None if perseus.saving_band is None else perseus.saving_band.reversed(),
        )
    ]
    dag = planning.dag()

    def planned(mode: str, plan: Plan, versus_perseus: bool = True) -> ModeResult:
        point = plan.target_point
        energies = tuple(rank.energy_j for rank in point.ranks)
        share = all_to_all_share(collectives, point, point.iteration_time_s, spec)
        versus = None
        if versus_perseus and mode != "perseus":
            versus = saving_band(plan, dag, profile, spec, against=perseus)
        return ModeResult(mode, point.iteration_time_s, energies, deadline_s, idle_w, plan, share, versus)

    rows += [planned(mode, plans[mode]) for mode in MODES[1:]]
    memory_rows = tuple(
        planned(mode, choose_memory_clocks(plans[mode], profile, planning), versus_perseus=False)
        for mode in MODES[1:]
        if candidate_memory_clocks(spec)
    )
    return Comparison(job, spec, tuple(rows), planning.switch_latency_s, memory_rows)


def compare_job_folder(folder: Path, name: str, budget: SearchBudget | None = None) -> Comparison:
    """The modes of a job a live session planned, priced on the profile it measured (the demo).

    The job is the session's, built as the session builds it (``runtime.planning_round.replanning``): its
    facts (``job.json``: the model shape, the layer layout and the collective setup with the job's levers),
    orders, measured iteration tail and phases (``measured.json``), and target and switch latency (the
    plan's), so each mode plans only what the running job could honour.

    Args:
        folder: The job's cache folder (``<energy dir>/<fingerprint>``).
        name: The job's name in the tables.
        budget: Kareus's search budget; its default when ``None``.

    Raises:
        ReportError: The folder is not a finished job's, or its record has no model shape or collectives.
    """
    job, files = read_job_folder(folder), JobFiles(folder)
    facts = job.facts
    if facts.model is None or facts.collectives is None:
        raise ReportError(
            f"{files.record} records no model shape or collectives (a job cached by an older version?): "
            "run the job again"
        )
    measured_path = files.measured
    if measured_path.is_file():
        measured = MeasuredInputs.from_json(measured_path.read_text(encoding="utf-8"))
    else:
        tail = job.plan.measured_tail
        measured = MeasuredInputs(
            ProfileRequest(),
            None if tail is None else IterationTail.measured(tail.time_s, tail.stage_energy_j),
        )
    planning = job_from_facts(
        facts,
        job.orders,
        job.spec,
        parse_target(job.plan.target),
        job.plan.fingerprint,
        measured,
        switch_latency_s=job.plan.switch_latency_s,
    )
    pipelines = facts.tensor_parallel_size * facts.data_parallel_size
    subject = ComparedJob(name, job.orders.num_stages, pipelines)
    return compare_modes(subject, job.profile, planning, job.spec, budget)
