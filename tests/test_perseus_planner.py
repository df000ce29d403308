import argparse
import dataclasses
from pathlib import Path

import pytest

from megatron_energy.commands import plan_command
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.interface import SWITCH_EVALUATIONS, PlanningJob
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser, plan_point
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import ClockAction, Plan, PlanPoint, fingerprint
from megatron_energy.plan_file import load_plan, save_plan
from megatron_energy.sim import Simulator
from megatron_energy.sim.simulator import SimResult
from megatron_energy.target import EnergyTarget, parse_target

STAGES, MICROBATCHES, POINTS = 4, 8, 30
FINGERPRINT = fingerprint(job="planner-test")


def _profile(num_stages: int = STAGES) -> Profile:
    """A modelled GPT-3 1.3B profile on an A100 over every other clock from 900 MHz.

    Args:
        num_stages: Pipeline stages the profile covers.

    Returns:
        The profile.
    """
    spec = load_gpu_spec("a100-sxm-80gb")
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    clocks = [clock for clock in spec.sm_clocks_mhz if clock >= 900][::2]
    return Profile.synthetic(shape, spec, num_stages, clocks_mhz=clocks)


@pytest.fixture(scope="module")
def orders() -> PipelineOrders:
    return pipeline_orders(STAGES, MICROBATCHES)


@pytest.fixture(scope="module")
def planner(orders: PipelineOrders) -> Planner:
    return Planner(PipelineDag.build(orders), _profile(), num_points=POINTS)


def _optimised(planner: Planner, orders: PipelineOrders, target: str) -> Plan:
    """The Perseus optimiser's plan for ``target``, on the planner's profile and the same orders and sweep.

    Args:
        planner: The planner whose profile is planned with.
        orders: The executed orders the planner's DAG was built from.
        target: An ``--energy-target`` value.

    Returns:
        The plan (no switch latency: its points are the planner's frontier points).
    """
    job = PlanningJob(orders, FINGERPRINT, parse_target(target), frontier_points=POINTS)
    return PerseusOptimiser().plan(planner.profile, job)


@pytest.fixture(scope="module")
def iso_plan(planner: Planner, orders: PipelineOrders) -> Plan:
    return _optimised(planner, orders, "iso-time")


def _simulated(planner: Planner, point: PlanPoint) -> SimResult:
    """Simulate the clocks a plan point locks at every instruction start, on the planner's DAG and profile.

    Args:
        planner: The planner.
        point: A point of a plan made for the planner's job.

    Returns:
        The simulated iteration.
    """
    clocks = {
        instruction: clock
        for stage in range(len(point.ranks))
        for instruction, clock in point.clock_table(stage).items()
    }
    return Simulator(planner.dag, planner.profile).run(clocks)


def test_a_plan_may_keep_a_single_point_besides_its_target(orders: PipelineOrders) -> None:
    job = PlanningJob(orders, FINGERPRINT, parse_target("iso-time"), frontier_points=6, kept_points=1)
    plan = PerseusOptimiser().plan(_profile(), job)  # kept_points=1 divided by zero when spreading the points
    assert 1 <= len(plan.points) <= 2
    assert plan.points[plan.target_index].label == "iso-time"


def test_iso_time_plan_is_no_slower_than_all_maximum_clocks(planner, iso_plan):
    baseline = planner.solver.baseline
    target = iso_plan.target_point
    result = _simulated(planner, target)
    assert result.iteration_time_s <= baseline.iteration_time_s
    assert result.total_energy_j == pytest.approx(target.energy_j)
    assert target.energy_j < baseline.total_energy_j
    assert iso_plan.baseline.iteration_time_s == baseline.iteration_time_s
    assert iso_plan.baseline.energy_j == baseline.total_energy_j
    assert iso_plan.target == "iso-time" and iso_plan.provenance == "modelled"
    assert iso_plan.gpu_name == "a100-sxm-80gb" and iso_plan.optimisers == ("perseus",)
    assert iso_plan.fingerprint == FINGERPRINT
    assert target.label == "iso-time"
    assert target.lower_bound_j <= target.energy_j


def test_slowdown_trades_time_for_energy_within_its_budget(planner, orders):
    iso = planner.point("iso-time")
    slow = planner.point(EnergyTarget("slowdown", 0.05))
    assert slow.time_s <= 1.05 * planner.solver.min_time_s
    assert slow.energy_j <= iso.energy_j
    plan = _optimised(planner, orders, "slowdown:0.05")
    assert plan.target == "slowdown:0.05" and plan.target_point.label == "slowdown:0.05"
    # the optimiser solves the same deadline on its own (warm starts may pick another plan of that budget)
    assert plan.target_point.deadline_s == pytest.approx(slow.deadline_s, rel=1e-12)
    assert plan.target_point.iteration_time_s <= slow.deadline_s * (1 + 1e-9)
    assert plan.target_point.energy_j == pytest.approx(slow.energy_j, rel=2e-3)


def test_min_energy_point_is_the_least_energy_on_the_frontier(planner):
    best = planner.point("min-energy")
    assert all(best.energy_j <= point.energy_j + 1e-9 for point in planner.frontier.points)
    assert best.energy_j < planner.point("iso-time").energy_j


def test_straggler_pace_past_the_min_energy_point_stays_there(planner, iso_plan):
    best = planner.point("min-energy")
    for pace_s in (best.time_s, 1.2 * best.time_s, 10 * best.time_s):
        point = planner.point_for_time(pace_s)
        assert point.energy_j == best.energy_j
        assert point.time_s == best.time_s
        # The plan keeps that point for a replica following a straggler at this pace (the optimiser solves
        # its own frontier: the same optimum, summed over ranks, so equal up to rounding).
        kept = iso_plan.points[iso_plan.index_for_time(pace_s)]
        assert kept.energy_j == pytest.approx(best.energy_j, rel=1e-12)
        assert kept.iteration_time_s == best.time_s
        assert kept.label == f"time:{best.time_s:.6f}"


def test_straggler_pace_between_iso_time_and_min_energy(planner):
    iso, best = planner.point("iso-time"), planner.point("min-energy")
    pace_s = 0.5 * (iso.time_s + best.time_s)
    point = planner.point_for_time(pace_s)
    assert point.time_s <= pace_s
    assert best.energy_j <= point.energy_j <= iso.energy_j
    faster_than_possible = planner.point_for_time(0.5 * planner.solver.min_time_s)
    assert faster_than_possible.energy_j == pytest.approx(iso.energy_j)


def test_plan_lists_every_rank_in_execution_order_and_round_trips(planner, orders, iso_plan, tmp_path):
    point = planner.point("iso-time")
    converted = plan_point(planner, point, "iso-time")
    assert (converted.label, converted.iteration_time_s) == ("iso-time", point.time_s)
    for stage, order in enumerate(orders.ranks):
        rank = converted.ranks[stage]
        assert all(isinstance(action, ClockAction) and action.at.phase is None for action in rank.actions)
        assert [action.at.instruction for action in rank.actions] == list(order)
        assert all(action.clock_mhz == point.clocks[action.at.instruction] for action in rank.actions)
        assert rank.energy_j == point.stage_energy_j[stage]
    plan = dataclasses.replace(iso_plan, points=(converted,), target_index=0)
    loaded = load_plan(save_plan(plan, tmp_path / "plan.json"), expected_fingerprint=FINGERPRINT)
    assert loaded == plan
    backward = Instruction(stage=2, chunk=0, microbatch=3, kind="backward")
    assert loaded.clock_for(2, backward) == point.clocks[backward]


def _with_source(profile: Profile, source: str) -> Profile:
    options = {key: profile.options(key) for key in profile}
    return Profile(options, profile.gpu_name, source, profile.blocked_power_w, profile.idle_power_w)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["measured", "modelled", "simulated"])
def test_plan_command_writes_plan_frontier_and_plot(tmp_path, capsys, monkeypatch, source):
    monkeypatch.setenv("COLUMNS", "200")
    csv = tmp_path / "profile.csv"
    _with_source(_profile(), source).to_csv(csv)  # the file says where its figures come from
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    out, plot = tmp_path / "plan.json", tmp_path / "frontier.png"
    args = parser.parse_args(
        [
            "plan",
            *("--profile", str(csv)),
            *("--stages", str(STAGES), "--microbatches", str(MICROBATCHES)),
            *("--gpu-spec", "a100-sxm-80gb", "--target", "slowdown:0.02", "--points", "12"),
            *("--out", str(out), "--plot", str(plot)),
        ]
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    # The per-instruction figures are what the file says; every iteration figure is modelled.
    assert f"modelled: the pipeline simulated from a {source} profile" in printed
    assert "energy per iteration (J)" in printed and "│ modelled" in printed
    plan = load_plan(out)
    assert plan.provenance == source and plan.target == "slowdown:0.02"
    assert plan.target_point.iteration_time_s <= 1.02 * plan.baseline.iteration_time_s
    # The frontier (one sample per deadline of --points) now travels in the plan file.
    assert len(plan.frontier) == 12
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _plan_status(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    return args.func(args)


@pytest.mark.slow
def test_plan_command_never_assumes_where_a_profile_comes_from(tmp_path, capsys):
    pipeline = ("--stages", str(STAGES), "--microbatches", str(MICROBATCHES), "--gpu-spec", "a100-sxm-80gb")
    stated = tmp_path / "stated.csv"
    _with_source(_profile(), "simulated").to_csv(stated)
    # a flag that contradicts the file is refused
    argv = ["--profile", str(stated), "--profile-source", "measured", *pipeline, "--out", str(tmp_path / "a")]
    assert _plan_status(argv) == 2
    assert "says its figures are simulated, not measured" in capsys.readouterr().err
    # a Perseus/lowtime CSV that does not say needs the flag, and takes it
    bare = tmp_path / "bare.csv"
    bare.write_text("\n".join(",".join(row.split(",")[:5]) for row in stated.read_text().splitlines()) + "\n")
    assert _plan_status(["--profile", str(bare), *pipeline, "--out", str(tmp_path / "b")]) == 2
    assert "does not say where its figures come from" in capsys.readouterr().err
    out = tmp_path / "c.json"
    assert (
        _plan_status(["--profile", str(bare), "--profile-source", "measured", *pipeline, "--out", str(out)])
        == 0
    )
    assert load_plan(out).provenance == "measured"


def test_plan_command_refuses_a_profile_of_another_pipeline(tmp_path, capsys):
    csv = tmp_path / "profile.csv"
    _profile().to_csv(csv)
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    out = tmp_path / "plan.json"
    pipeline = ("--stages", "8", "--microbatches", "16", "--gpu-spec", "a100-sxm-80gb")
    profile = ("--profile", str(csv), "--profile-source", "modelled")
    args = parser.parse_args(["plan", *profile, *pipeline, "--out", str(out)])
    assert args.func(args) == 2
    assert "covers 4 stages x 1 chunks" in capsys.readouterr().err
    assert not out.exists()


def test_plan_command_refuses_a_profile_of_another_pipeline_than_the_job_config(tmp_path, capsys):
    job = Path(__file__).resolve().parents[1] / "configs" / "examples" / "gpt3-xl-pp4-h100.yaml"
    csv = tmp_path / "profile.csv"
    _profile(num_stages=2).to_csv(csv)
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    out = tmp_path / "plan.json"
    profile = ("--profile", str(csv), "--profile-source", "modelled")
    args = parser.parse_args(["plan", "--config", str(job), *profile, "--out", str(out)])
    assert args.func(args) == 2
    assert "covers 2 stages x 1 chunks, but the job" in capsys.readouterr().err
    assert not out.exists()


def test_a_measured_tail_moves_every_point_by_its_time_and_energy():
    """The tail is a constant of the job: as good plans, each longer by its time and dearer by its energy."""
    from megatron_energy.optimisers.perseus.frontier import FrontierSolver
    from megatron_energy.pipeline.dag_nodes import IterationTail

    orders, profile = pipeline_orders(2, 4), _profile(2)
    tail = IterationTail.measured(outside_s=0.01, stage_energy_j=(9.0, 6.0))
    plain = FrontierSolver(PipelineDag.build(orders), profile)
    tailed = FrontierSolver(PipelineDag.build(orders, tail=tail), profile)
    assert tailed.min_time_s == pytest.approx(plain.min_time_s + 0.01)
    for slack in (1.0, 1.05, 1.2):
        without = plain.solve(plain.min_time_s * slack)
        with_tail = tailed.solve(plain.min_time_s * slack + 0.01)
        assert with_tail.time_s <= plain.min_time_s * slack + 0.01 * (1 + 1e-9)
        assert with_tail.lower_bound_j == pytest.approx(without.lower_bound_j + 15.0, rel=1e-9)
        # both searches stop within TARGET_GAP of their bound; equally good plans may differ in clocks
        assert with_tail.energy_j == pytest.approx(without.energy_j + 15.0, rel=2e-4)
        assert with_tail.gap == pytest.approx(without.gap, abs=2e-4)
        simulated = Simulator(PipelineDag.build(orders, tail=tail), profile).run(with_tail.clocks)
        assert [stage.tail_energy_j for stage in simulated.stages] == [9.0, 6.0]


def test_the_switch_latency_post_pass_searches_as_long_as_the_planning_job_allows(
    orders: PipelineOrders,
) -> None:
    profile = _profile()
    base = PlanningJob(
        orders, FINGERPRINT, parse_target("iso-time"), switch_latency_s=0.02, frontier_points=6
    )
    plans = {
        evaluations: PerseusOptimiser().plan(
            profile, dataclasses.replace(base, switch_evaluations=evaluations)
        )
        for evaluations in (1, SWITCH_EVALUATIONS)
    }
    short, full = (plans[evaluations].target_point for evaluations in sorted(plans))
    assert full.iteration_time_s <= plans[1].baseline.iteration_time_s * (1 + 1e-9)
    assert full.energy_j < short.energy_j
