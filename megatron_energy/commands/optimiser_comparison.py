"""Perseus-only vs Kareus-only vs both, every figure *modelled* (``simulate --compare``, ``demo``).

Four iterations of the job, each priced by the overlap model (``sim.overlap``: collectives as work beside
computation, static and dynamic energy apart) on a profile of the job: the job description's synthetic one
(:func:`compare_optimisers`) or the one a live session measured (:func:`compare_modes`, the demo):

* **stock**: every instruction at its fastest clock, megatron-core's default collective schedule (gradient
  reduce-scatter after the last backward, parameter all-gather after the optimizer, NCCL's CTA budgets,
  tensor-parallel collectives exposed);
* **perseus**: Perseus's iso-time clocks (solved on the job's DAG for the stock all-maximum-clocks time), the
  default collective schedule;
* **kareus**: stock clocks, Kareus's collective choices at iso-time (no slower than *stock*);
* **all**: Perseus's clocks refined by Kareus, or Kareus's own joint clock moves from stock clocks where
  the model prices those lower (``KareusOptimiser.joint``; no slower than *perseus*'s deadline: iso-time).

Clock switches are instant in this comparison (the overlap model does not price switch latency).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.job import JobConfig
from megatron_energy.kareus.collective_setup import CollectiveSetup
from megatron_energy.kareus.collectives import CollectiveWorkload, build_collectives
from megatron_energy.kareus.optimiser import KareusOptimiser
from megatron_energy.kareus.schedule import ChoiceKey, ClassChoice, KareusModel
from megatron_energy.kareus.search import SearchBudget
from megatron_energy.perseus.planner import Planner
from megatron_energy.pipeline.dag import IterationTail, PipelineDag
from megatron_energy.pipeline.profile import Profile
from megatron_energy.pipeline.workload import TransformerShape
from megatron_energy.report.job_folder import ReportError, read_job_folder
from megatron_energy.sim.overlap import OverlapResult

MODES: tuple[str, ...] = ("stock", "perseus", "kareus", "all")
"""The rows of a comparison, in order."""


@dataclass(frozen=True)
class ModeResult:
    """One row: the iteration under one mode (modelled)."""

    mode: str
    """One of :data:`MODES`."""
    result: OverlapResult
    """The simulated iteration."""
    deadline_s: float
    """The iteration time the mode had to meet."""
    choices: dict[ChoiceKey, ClassChoice]
    """Collective choices (megatron-core's defaults for stock and perseus)."""


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
    model: KareusModel
    """The model that priced them."""

    def row(self, mode: str) -> ModeResult:
        """The row of ``mode``."""
        return self.rows[MODES.index(mode)]


def compare_optimisers(job: JobConfig, budget: SearchBudget | None = None) -> Comparison:
    """Plan and price the four modes of a job description, on its synthetic profile (module docstring).

    Args:
        job: The job description.
        budget: Kareus's search budget (model-priced trials per stage); its default when ``None``.

    Returns:
        The four rows.
    """
    spec = job.spec()
    subject = ComparedJob(job.name, job.pipeline_stages, job.tensor_parallel * job.data_parallel)
    dag = job.build_dag(spec=spec)
    workload = job.collective_workload(spec)
    return compare_modes(subject, dag, job.synthetic_profile(spec), spec, workload, job.fingerprint(), budget)


def compare_modes(
    job: ComparedJob,
    dag: PipelineDag,
    profile: Profile,
    spec: GpuSpec,
    workload: CollectiveWorkload,
    fingerprint: str,
    budget: SearchBudget | None = None,
) -> Comparison:
    """Plan and price the four modes of a job (module docstring).

    Args:
        job: What the tables say about the job.
        dag: Its iteration DAG (transfers and tail included).
        profile: Time and energy of its instructions per clock.
        spec: The GPU spec.
        workload: Its collectives (a live job's levers included).
        fingerprint: The job fingerprint (Kareus's search cache key).
        budget: Kareus's search budget; its default when ``None``.

    Returns:
        The four rows.
    """
    model = KareusModel(
        dag, profile, spec, build_collectives(workload), workload.layers_per_chunk, workload.levers
    )
    optimiser = KareusOptimiser(budget=budget) if budget is not None else KareusOptimiser()
    defaults = model.choices_default()
    stock = model.evaluate(None, defaults)
    planner = Planner(dag, profile, num_points=2, switch_latency_s=0.0)
    perseus_point = planner.solver.solve(planner.solver.baseline.iteration_time_s)
    perseus_clocks = dict(perseus_point.clocks)
    perseus = model.evaluate(perseus_clocks, defaults)
    kareus_choices = optimiser.choose(model, workload, None, stock.iteration_time_s, fingerprint)
    all_deadline = max(perseus_point.deadline_s, perseus.iteration_time_s)
    all_clocks, all_choices = optimiser.joint(model, workload, perseus_clocks, all_deadline, fingerprint)
    rows = (
        ModeResult("stock", stock, stock.iteration_time_s, defaults),
        ModeResult("perseus", perseus, perseus_point.deadline_s, defaults),
        ModeResult("kareus", model.evaluate(None, kareus_choices), stock.iteration_time_s, kareus_choices),
        ModeResult("all", model.evaluate(all_clocks, all_choices), all_deadline, all_choices),
    )
    return Comparison(job, spec, rows, model)


def compare_job_folder(folder: Path, name: str, budget: SearchBudget | None = None) -> Comparison:
    """The four modes of a job a live session planned, priced on the profile it measured (the demo).

    The DAG is the session's (its measured iteration tail; transfers inside the measured instruction times),
    the collectives those the session described (``job.json``: the model shape and the collective setup with
    the job's levers), so each mode plans only what the running job could honour.

    Args:
        folder: The job's cache folder (``<energy dir>/<fingerprint>``).
        name: The job's name in the tables.
        budget: Kareus's search budget; its default when ``None``.

    Raises:
        ReportError: The folder is not a finished job's, or its record has no model shape or collectives.
    """
    job = read_job_folder(folder)
    model, setup = job.parts.get("model"), job.parts.get("collectives")
    if model is None or setup is None:
        raise ReportError(
            f"{folder}/job.json records no model shape or collectives (a job cached by an older version?): "
            "run the job again"
        )
    shape = TransformerShape(**model)
    tail = job.plan.measured_tail
    dag = PipelineDag.build(
        job.orders, tail=None if tail is None else IterationTail.measured(tail.time_s, tail.stage_energy_j)
    )
    workload = CollectiveSetup.from_dict(setup).workload(shape, job.orders, job.spec)
    pipelines = job.parts["tensor_parallel_size"] * job.parts["data_parallel_size"]
    subject = ComparedJob(name, job.orders.num_stages, pipelines)
    return compare_modes(subject, dag, job.profile, job.spec, workload, job.plan.fingerprint, budget)
