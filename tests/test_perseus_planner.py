import argparse

import pytest

from megatron_energy.commands import plan as plan_command
from megatron_energy.config import EnergyTarget
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.megatron.schedule import pipeline_orders
from megatron_energy.perseus.planner import Planner
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.plan import Plan, fingerprint
from megatron_energy.sim import Simulator

STAGES, MICROBATCHES = 4, 8


def _profile() -> Profile:
    spec = load_gpu_spec("a100-sxm-80gb")
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    clocks = [clock for clock in spec.sm_clocks_mhz if clock >= 900][::2]
    return Profile.synthetic(shape, spec, STAGES, clocks_mhz=clocks)


@pytest.fixture(scope="module")
def planner():
    dag = PipelineDag.build(pipeline_orders(STAGES, MICROBATCHES))
    return Planner(dag, _profile(), fingerprint=fingerprint(job="planner-test"), num_points=30)


def _simulated(planner, plan):
    clocks = {
        (item.kind, stage, item.chunk, item.microbatch): item.clock_mhz
        for stage in range(plan.num_stages)
        for item in plan.rank_clocks(stage)
    }
    return Simulator(planner.dag, planner.profile).run(clocks)


def test_iso_time_plan_is_no_slower_than_all_maximum_clocks(planner):
    plan = planner.plan("iso-time")
    baseline = planner.solver.baseline
    result = _simulated(planner, plan)
    assert result.iteration_time_s <= baseline.iteration_time_s
    assert result.total_energy_j == pytest.approx(plan.prediction.energy_j)
    assert plan.prediction.energy_j < baseline.total_energy_j
    assert plan.prediction.baseline_time_s == baseline.iteration_time_s
    assert plan.target == "iso-time" and plan.provenance == "modelled" and plan.gpu_name == "a100-sxm-80gb"
    assert plan.prediction.lower_bound_j <= plan.prediction.energy_j


def test_slowdown_trades_time_for_energy_within_its_budget(planner):
    iso = planner.point("iso-time")
    slow = planner.point(EnergyTarget("slowdown", 0.05))
    assert slow.time_s <= 1.05 * planner.solver.min_time_s
    assert slow.energy_j <= iso.energy_j
    assert planner.plan("slowdown:0.05").target == "slowdown:0.05"


def test_min_energy_point_is_the_least_energy_on_the_frontier(planner):
    best = planner.point("min-energy")
    assert all(best.energy_j <= point.energy_j + 1e-9 for point in planner.frontier.points)
    assert best.energy_j < planner.point("iso-time").energy_j


def test_straggler_pace_past_the_min_energy_point_stays_there(planner):
    best = planner.point("min-energy")
    for pace_s in (best.time_s, 1.2 * best.time_s, 10 * best.time_s):
        plan = planner.for_iteration_time(pace_s)
        assert plan.prediction.energy_j == best.energy_j
        assert plan.prediction.iteration_time_s == best.time_s
        assert plan.target == f"time:{pace_s:.6f}"


def test_straggler_pace_between_iso_time_and_min_energy(planner):
    iso, best = planner.point("iso-time"), planner.point("min-energy")
    pace_s = 0.5 * (iso.time_s + best.time_s)
    point = planner.point_for_time(pace_s)
    assert point.time_s <= pace_s
    assert best.energy_j <= point.energy_j <= iso.energy_j
    faster_than_possible = planner.point_for_time(0.5 * planner.solver.min_time_s)
    assert faster_than_possible.energy_j == pytest.approx(iso.energy_j)


def test_plan_lists_every_rank_in_execution_order_and_round_trips(planner, tmp_path):
    point = planner.point("iso-time")
    plan = planner.to_plan(point, "iso-time")
    for stage, order in enumerate(pipeline_orders(STAGES, MICROBATCHES)):
        assert [(item.kind, item.microbatch, item.chunk) for item in plan.rank_clocks(stage)] == order
    loaded = Plan.load(plan.save(tmp_path / "plan.json"), expected_fingerprint=planner.fingerprint)
    assert loaded == plan
    assert loaded.clock_for(2, "backward", 3, 0) == point.clocks[("backward", 2, 0, 3)]


def test_plan_command_writes_plan_frontier_and_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    csv = tmp_path / "profile.csv"
    _profile().to_csv(csv)
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    out, frontier, plot = tmp_path / "plan.json", tmp_path / "frontier.csv", tmp_path / "frontier.png"
    args = parser.parse_args(
        [
            "plan",
            *("--profile", str(csv), "--stages", str(STAGES), "--microbatches", str(MICROBATCHES)),
            *("--gpu-spec", "a100-sxm-80gb", "--target", "slowdown:0.02", "--points", "12"),
            *("--out", str(out), "--frontier", str(frontier), "--plot", str(plot)),
        ]
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "modelled: the pipeline simulated from a measured profile" in printed
    assert "energy per iteration (J)" in printed and "│ modelled" in printed
    plan = Plan.load(out)
    assert plan.provenance == "measured" and plan.target == "slowdown:0.02"
    assert plan.prediction.iteration_time_s <= 1.02 * plan.prediction.baseline_time_s
    assert len(frontier.read_text().splitlines()) == 13
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_command_refuses_a_profile_of_another_pipeline(tmp_path, capsys):
    csv = tmp_path / "profile.csv"
    _profile().to_csv(csv)
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    out = tmp_path / "plan.json"
    pipeline = ("--stages", "8", "--microbatches", "16", "--gpu-spec", "a100-sxm-80gb")
    args = parser.parse_args(["plan", "--profile", str(csv), *pipeline, "--out", str(out)])
    assert args.func(args) == 2
    assert "covers 4 stages x 1 chunks" in capsys.readouterr().err
    assert not out.exists()
