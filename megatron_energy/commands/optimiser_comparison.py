"""Perseus-only vs Kareus-only vs both on a job description, every figure *modelled* (``simulate --compare``).

Four iterations of the job, each priced by the overlap model (``sim.overlap``: collectives as work beside
computation, static and dynamic energy apart) on the job's synthetic profile:

* **stock**: every instruction at its fastest clock, megatron-core's default collective schedule (gradient
  reduce-scatter after the last backward, parameter all-gather after the optimizer, NCCL's CTA budgets,
  tensor-parallel collectives exposed);
* **perseus**: Perseus's iso-time clocks (solved on the job's DAG for the stock all-maximum-clocks time), the
  default collective schedule;
* **kareus**: stock clocks, Kareus's collective choices at iso-time (no slower than *stock*);
* **all**: Perseus's clocks refined by Kareus (no slower than *perseus*'s deadline, the same iso-time).

Clock switches are instant in this comparison (the overlap model does not price switch latency).
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.job import JobConfig
from megatron_energy.kareus.collectives import build_collectives
from megatron_energy.kareus.optimiser import KareusOptimiser
from megatron_energy.kareus.schedule import ChoiceKey, ClassChoice, KareusModel
from megatron_energy.kareus.search import SearchBudget
from megatron_energy.perseus.planner import Planner
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
class Comparison:
    """Every mode of one job (modelled)."""

    job: JobConfig
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
    """Plan and price the four modes of ``job`` (module docstring).

    Args:
        job: The job description.
        budget: Kareus's search budget (model-priced trials per stage); its default when ``None``.

    Returns:
        The four rows.
    """
    spec = job.spec()
    dag = job.build_dag(spec=spec)
    profile = job.synthetic_profile(spec)
    workload = job.collective_workload(spec)
    model = KareusModel(dag, profile, spec, build_collectives(workload), workload.layers_per_chunk)
    optimiser = KareusOptimiser(budget=budget) if budget is not None else KareusOptimiser()
    defaults = model.choices_default()
    stock = model.evaluate(None, defaults)
    planner = Planner(dag, profile, num_points=2, switch_latency_s=0.0)
    perseus_point = planner.solver.solve(planner.solver.baseline.iteration_time_s)
    perseus_clocks = dict(perseus_point.clocks)
    perseus = model.evaluate(perseus_clocks, defaults)
    fingerprint = job.fingerprint()
    kareus_choices = optimiser.choose(model, workload, None, stock.iteration_time_s, fingerprint)
    all_deadline = max(perseus_point.deadline_s, perseus.iteration_time_s)
    all_choices = optimiser.choose(model, workload, perseus_clocks, all_deadline, fingerprint)
    rows = (
        ModeResult("stock", stock, stock.iteration_time_s, defaults),
        ModeResult("perseus", perseus, perseus_point.deadline_s, defaults),
        ModeResult("kareus", model.evaluate(None, kareus_choices), stock.iteration_time_s, kareus_choices),
        ModeResult("all", model.evaluate(perseus_clocks, all_choices), all_deadline, all_choices),
    )
    return Comparison(job, spec, rows, model)
