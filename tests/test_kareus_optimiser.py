"""The Kareus optimiser (Optimiser interface), the registry, and simulate --compare on the example jobs."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

from megatron_energy.cli import main
from megatron_energy.commands.optimiser_comparison import compare_optimisers
from megatron_energy.errors import EnergyValueError
from megatron_energy.job import JobConfig
from megatron_energy.optimisers import registry
from megatron_energy.optimisers.composition import ComposedOptimiser
from megatron_energy.optimisers.interface import PlanningJob, ProfileRequest
from megatron_energy.optimisers.kareus.choices import KareusModel
from megatron_energy.optimisers.kareus.collective_optimiser import KareusOptimiser
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.optimisers.kareus.search_cache import SearchCache
from megatron_energy.optimisers.kernel.phase_optimiser import PhaseOptimiser
from megatron_energy.optimisers.perseus.clock_optimiser import plan_point
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.pipeline.collectives import build_collectives
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Baseline, CollectiveAction, Plan, PlanPoint
from megatron_energy.plan_file import plan_text, read_plan
from megatron_energy.plan_outcome import plan_saving
from megatron_energy.target import parse_target
from tests.kareus_jobs import EXAMPLE_7B, EXAMPLE_70B, EXAMPLES

FAST = SearchBudget(trials=3)


def planning_job(job: JobConfig) -> PlanningJob:
    spec = job.spec()
    return PlanningJob(
        orders=job.orders(),
        fingerprint=job.fingerprint(),
        target=parse_target("iso-time"),
        comm=job.comm_spec(spec),
        tail=job.iteration_tail(spec),
        collectives=job.collective_workload(spec),
        gpu=spec,
    )


def test_kareus_and_all_are_released_in_that_order() -> None:
    assert registry.mode_problem("kareus") is None
    assert isinstance(registry.resolve("kareus"), KareusOptimiser)
    composed = registry.resolve("all")
    assert isinstance(composed, ComposedOptimiser)
    assert [part.name for part in composed.parts] == ["perseus", "kareus", "kernel"]
    assert composed.request.collectives


@pytest.mark.slow
def test_kareus_alone_plans_every_collective_and_the_plan_round_trips(tmp_path: Path) -> None:
    job = JobConfig.load(EXAMPLE_7B)
    spec = job.spec()
    plan = KareusOptimiser(budget=FAST, cache_dir=tmp_path).plan(
        job.synthetic_profile(spec), planning_job(job)
    )
    assert plan.optimisers == ("kareus",)
    point = plan.target_point
    assert point.iteration_time_s <= plan.baseline.iteration_time_s * (1 + 1e-9)
    assert point.energy_j < plan.baseline.energy_j
    for stage, rank in enumerate(point.ranks):
        names = [a.collective for a in rank.actions if isinstance(a, CollectiveAction)]
        assert len(names) == len(set(names))
        assert {n.class_key for n in names} >= {"dp.reduce_scatter", "pp.send_recv"}
        assert all(a.at.instruction.stage == stage for a in rank.actions)
    assert read_plan(plan_text(plan)) == plan
    assert SearchCache(tmp_path).path(job.fingerprint()).is_file()


@functools.cache
def perseus_plan_of(example: Path) -> Plan:
    """Perseus's iso-time plan of an example job (instant switches, one point), solved once per process."""
    job = JobConfig.load(example)
    spec = job.spec()
    planner = Planner(job.build_dag(spec=spec), job.synthetic_profile(spec), num_points=2)
    point = planner.solver.solve(planner.solver.baseline.iteration_time_s)
    return Plan(
        fingerprint=job.fingerprint(),
        gpu_name=spec.name,
        provenance="modelled",
        target="iso-time",
        optimisers=("perseus",),
        switch_latency_s=0.0,
        baseline=Baseline(planner.solver.baseline.iteration_time_s, planner.solver.baseline.total_energy_j),
        points=(plan_point(planner, point, "iso-time"),),
        target_index=0,
    )


@dataclass
class Planned:
    """A first optimiser that hands out a plan made beforehand (Perseus's, in the composition's place)."""

    given: Plan
    name = "perseus"
    request = ProfileRequest()

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        return self.given


@pytest.mark.slow
def test_kareus_refines_a_perseus_plan_without_missing_its_deadline() -> None:
    job = JobConfig.load(EXAMPLE_7B)
    base = perseus_plan_of(EXAMPLE_7B)
    plan = KareusOptimiser(budget=FAST).plan(job.synthetic_profile(), planning_job(job), base)
    assert plan.optimisers == ("perseus", "kareus")
    assert plan.target_point.iteration_time_s <= plan.target_point.deadline_s * (1 + 1e-9)
    assert plan.target_point.deadline_s >= base.target_point.deadline_s


def _halved(point: PlanPoint) -> PlanPoint:
    """``point`` with every rank's predicted energy halved."""
    ranks = tuple(dataclasses.replace(rank, energy_j=rank.energy_j / 2) for rank in point.ranks)
    return dataclasses.replace(point, ranks=ranks)


@pytest.mark.slow
def test_a_refinement_that_improves_no_point_is_the_base_plan_and_does_not_name_kareus() -> None:
    """A base whose points no schedule of the collectives beats comes back as it is, not renamed.

    The base is Perseus's plan with every point's predicted energy halved: nothing Kareus prices is cheaper.
    """
    job = JobConfig.load(EXAMPLE_7B)
    profile, planning = job.synthetic_profile(), planning_job(job)
    perseus = perseus_plan_of(EXAMPLE_7B)
    cheap = dataclasses.replace(perseus, points=tuple(_halved(point) for point in perseus.points))
    assert KareusOptimiser(budget=FAST).plan(profile, planning, cheap) is cheap
    assert KareusOptimiser(budget=FAST).plan(profile, planning, perseus).optimisers == ("perseus", "kareus")


@pytest.mark.slow
def test_all_composed_predicts_less_energy_than_perseus_alone_on_the_example_job() -> None:
    """``all`` = Perseus, then Kareus given Perseus's clocks (and moving them jointly), then phase clocks.

    On the 7B job; the composition does not depend on the job, and the 70B job's ``all`` is checked against
    Perseus alone by the comparison test below.
    """
    job = JobConfig.load(EXAMPLE_7B)
    base = perseus_plan_of(EXAMPLE_7B)
    composed = ComposedOptimiser(
        [Planned(base), KareusOptimiser(budget=SearchBudget(trials=2)), PhaseOptimiser()]
    )
    profile, planning = job.synthetic_profile(), planning_job(job)
    plan = composed.plan(profile, planning)
    assert plan.optimisers == ("perseus", "kareus", "kernel")
    point = plan.target_point
    assert point.iteration_time_s <= point.deadline_s * (1 + 1e-9)
    assert any(isinstance(a, CollectiveAction) and a.max_ctas for rank in point.ranks for a in rank.actions)
    # priced alike (the overlap model), every Perseus point with megatron-core's collectives costs more
    workload = job.collective_workload()
    model = KareusModel(
        planning.dag(), profile, job.spec(), build_collectives(workload), workload.layers_per_chunk
    )
    for mine, perseus in zip(plan.points, base.points, strict=True):
        clocks = {i: c for stage in range(len(perseus.ranks)) for i, c in perseus.clock_table(stage).items()}
        alone = model.evaluate(clocks, model.choices_default())
        assert mine.energy_j <= alone.total_energy_j
    assert point.energy_j < alone.total_energy_j  # the one point: strictly, where the model finds a saving


def test_a_job_without_its_collectives_is_refused_with_what_to_do() -> None:
    job = JobConfig.load(EXAMPLE_7B)
    bare = PlanningJob(orders=job.orders(), fingerprint="x", target=parse_target("iso-time"))
    with pytest.raises(EnergyValueError, match="collective workload"):
        KareusOptimiser(budget=FAST).plan(job.synthetic_profile(), bare)


@pytest.mark.slow
def test_in_a_composition_without_collectives_the_base_plan_passes_through() -> None:
    job = JobConfig.load(EXAMPLE_7B)
    bare = PlanningJob(orders=job.orders(), fingerprint="x", target=parse_target("iso-time"))
    base = KareusOptimiser(budget=FAST).plan(job.synthetic_profile(), planning_job(job))
    assert KareusOptimiser(budget=FAST).plan(job.synthetic_profile(), bare, base) is base


@pytest.mark.slow
@pytest.mark.parametrize("example", [EXAMPLE_7B, EXAMPLE_70B], ids=["7b-pp4-tp2-h200", "70b-pp8-tp8-a100"])
def test_all_at_iso_time_uses_less_modelled_energy_than_perseus_alone(example: Path) -> None:
    comparison = compare_optimisers(JobConfig.load(example), SearchBudget(trials=2), points=3)
    perseus, both = comparison.row("perseus"), comparison.row("all")
    assert both.iteration_time_s <= both.deadline_s * (1 + 1e-9)
    assert both.total_energy_j < 0.97 * perseus.total_energy_j
    kareus, stock = comparison.row("kareus"), comparison.row("stock")
    assert kareus.iteration_time_s <= stock.iteration_time_s * (1 + 1e-9)
    assert kareus.total_energy_j < stock.total_energy_j


@pytest.mark.slow
def test_simulate_compare_prints_every_mode_as_modelled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "all.json"
    argv = [
        "simulate",
        "--config",
        str(EXAMPLE_7B),
        "--compare",
        "--trials",
        "1",
        "--points",
        "3",
        "--trace",
        str(trace),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for mode in ("stock", "perseus", "kareus", "all"):
        assert f"│ {mode}" in out
    assert "modelled" in out and "static" in out and "dynamic" in out
    assert f"trace of all's clocks written to {trace}" in out and trace.stat().st_size > 0


@pytest.mark.slow
def test_kareus_alone_at_min_energy_may_take_longer_than_stock_clocks() -> None:
    job = JobConfig.load(EXAMPLES / "gpt3-xl-pp4-h100.yaml")
    spec = job.spec()
    planning = job.planning_job(parse_target("min-energy"), 10, spec=spec)
    plan = KareusOptimiser(budget=SearchBudget(trials=4)).plan(job.synthetic_profile(spec), planning)
    point = plan.target_point
    assert plan.optimisers == ("kareus",)
    assert point.iteration_time_s > plan.baseline.iteration_time_s  # slower: a min-energy target has no bound
    assert plan_saving(plan) < 0 and point.deadline_s == point.iteration_time_s
