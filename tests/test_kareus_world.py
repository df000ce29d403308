"""``--energy-mode kareus`` and ``all`` planned live: the session gives the planner the job's collectives.

Two gloo worlds of megatron-core ranks (pipeline 2 x data parallel 2, GPT-3 1.3B stage work on simulated
H100s, the distributed optimizer with ``--overlap-grad-reduce``), each through the launcher's session
(``session_world``). The job's collectives come from Megatron's arguments (``megatron.collective_setup``) and
reach the optimiser as ``PlanningJob.collectives``; every figure is modelled.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from session_world import ASSUMED_H100, RankReport, SessionSettings, run_world

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.kareus.choices import KareusModel
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.pipeline.collective_levers import RuntimeLevers
from megatron_energy.pipeline.collective_names import AFTER_OPTIMIZER
from megatron_energy.pipeline.collectives import build_collectives
from megatron_energy.pipeline.dag_nodes import IterationTail
from megatron_energy.pipeline.job_collectives import CollectiveSetup
from megatron_energy.pipeline.profile import Profile
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import TransformerShape
from megatron_energy.plan import ClockAction, CollectiveAction, Plan, PlanPoint
from megatron_energy.plan_file import load_plan
from megatron_energy.target import EnergyTarget

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

FLAGS = (("use_distributed_optimizer", True), ("overlap_grad_reduce", True))
SETUP = CollectiveSetup(
    data_parallel=2,
    distributed_optimizer=True,
    levers=RuntimeLevers(overlap_grad_reduce=True),
)


def _settings(mode: str, energy_dir: Path) -> SessionSettings:
    return SessionSettings(
        pipeline_size=2,
        data_parallel_size=2,
        num_microbatches=4,
        gpu_spec=ASSUMED_H100,  # the scenario below (Perseus's clocks priced past stock) is this spec's
        freq_grid=(1980, 1530),
        profile_iters=1,
        run_steps=2,
        log_interval=2,
        energy_dir=energy_dir,
        mode=mode,
        megatron_args=FLAGS,
    )


def _run(mode: str, tmp_path: Path) -> tuple[Plan, list[RankReport], Path]:
    settings = _settings(mode, tmp_path / "energy")
    reports = run_world(settings, tmp_path / "results")
    fingerprint = json.loads((settings.energy_dir / "last_job.json").read_text())["fingerprint"]
    folder = settings.energy_dir / fingerprint
    return load_plan(folder / "plan.json", expected_fingerprint=fingerprint), reports, folder


@pytest.fixture(scope="module")
def kareus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, list[RankReport], Path]:
    return _run("kareus", tmp_path_factory.mktemp("kareus-world"))


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, list[RankReport], Path]:
    return _run("all", tmp_path_factory.mktemp("all-world"))


def _collective_actions(point: PlanPoint, stage: int) -> list[CollectiveAction]:
    return [a for a in point.ranks[stage].actions if isinstance(a, CollectiveAction)]


def _planning_job(plan: Plan) -> PlanningJob:
    """The world's job as its session described it to the clock planner."""
    tail = plan.measured_tail
    return PlanningJob(
        orders=pipeline_orders(2, 4),
        fingerprint=plan.fingerprint,
        target=EnergyTarget("iso-time"),
        switch_latency_s=plan.switch_latency_s,
        tail=None if tail is None else IterationTail.measured(tail.time_s, tail.stage_energy_j),
    )


def _model(job: PlanningJob, profile: Profile) -> KareusModel:
    """The Kareus model of the world's job (the live levers), priced by the profile the session measured."""
    spec = load_gpu_spec(ASSUMED_H100)
    workload = SETUP.workload(TransformerShape.from_name("gpt3-1.3b"), job.orders, spec)
    collectives = build_collectives(workload)
    return KareusModel(job.dag(), profile, spec, collectives, workload.layers_per_chunk, SETUP.levers)


def test_kareus_plans_live_with_every_collective_class_and_runs_the_plan(
    kareus: tuple[Plan, list[RankReport], Path],
) -> None:
    plan, reports, _ = kareus
    assert plan.optimisers == ("kareus",)
    point = plan.target_point
    assert point.iteration_time_s <= plan.baseline.iteration_time_s * (1 + 1e-9)
    for stage in range(2):
        actions = _collective_actions(point, stage)
        classes = {a.collective.class_key for a in actions}
        assert classes == {"dp.reduce_scatter", "dp.all_gather", "pp.send_recv"}
        assert all(a.at.instruction.stage == stage for a in actions)
        # what the running job cannot change stays as Megatron started it
        assert all(
            a.at.phase == AFTER_OPTIMIZER and a.max_ctas is None
            for a in actions
            if a.collective.op == "all_gather"
        )
        assert all(a.max_ctas is None for a in actions if a.collective.class_key == "pp.send_recv")
    budgets = {
        a.max_ctas
        for s in range(2)
        for a in _collective_actions(point, s)
        if a.collective.op == "reduce_scatter"
    }
    assert budgets - {None}, "the search gave the gradient reduce-scatters no CTA budget"
    for report in reports:
        assert report.steps[-1].phase == "planned"


def test_all_prices_kareus_under_the_switch_latency_and_costs_no_more_than_perseus_alone(
    both: tuple[Plan, list[RankReport], Path],
) -> None:
    """The overlap model (instant switches) prices Perseus's clocks with the job's collectives slower than its
    own stock iteration, which made `all` leave Kareus out; priced as its plan file predicts it (the clocks
    under the switch latency, plus what the collective choices change: ``kareus.pricing``), Kareus's point
    is set against the same stock iteration as Perseus's, within iso-time and no costlier."""
    plan, reports, folder = both
    job = _planning_job(plan)
    profile = Profile.from_csv(folder / "profile.csv", gpu_name=load_gpu_spec(ASSUMED_H100).name)
    model = _model(job, profile)
    perseus = PerseusOptimiser().plan(profile, job)
    perseus_clocks = {i: c for stage in range(2) for i, c in perseus.target_point.clock_table(stage).items()}
    priced = model.evaluate(perseus_clocks, model.choices_default())
    stock = model.evaluate(None, model.choices_default())
    assert priced.iteration_time_s > stock.iteration_time_s  # the instant-switch model's view of this job
    assert plan.optimisers == ("perseus", "kareus", "kernel") and plan.notes == ()
    assert plan.baseline.energy_j == pytest.approx(perseus.baseline.energy_j, rel=1e-12)  # one stock
    point = plan.target_point
    assert point.iteration_time_s <= plan.baseline.iteration_time_s * (1 + 1e-9)
    assert point.energy_j <= perseus.target_point.energy_j * (1 + 1e-12)
    for stage in range(2):
        assert _collective_actions(point, stage), "the plan names the job's collectives"
    for report in reports:
        assert report.steps[-1].phase == "planned"
    assert any(isinstance(a, ClockAction) for a in point.ranks[0].actions)
