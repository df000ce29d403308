"""``--energy-target smooth:...``: its parser, the least filler on traces with known answers, and plans that
meet their bound in the simulator for less energy than a filler floor of the same bound (all modelled)."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest
from test_sim import EXAMPLE, TIMES_2X2

from megatron_energy.commands import plan_command, simulate
from megatron_energy.config import EnergyConfig
from megatron_energy.errors import EnergyValueError
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.composition import ComposedOptimiser
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.memory_clock import choose_memory_clocks
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import Plan, PlanError
from megatron_energy.plan_file import load_plan, plan_text, read_plan
from megatron_energy.plan_outcome import why_nothing_found
from megatron_energy.plan_smoothing import FillerWindow
from megatron_energy.power_swing import PowerTrace, floor_energy_j
from megatron_energy.runtime.planning_round.planning import plan_summary
from megatron_energy.sim.filler import bound_problems, filled_traces, pipeline_filler
from megatron_energy.sim.power_timeline import stage_power_traces
from megatron_energy.sim.simulator import Simulator
from megatron_energy.smooth_bound import SmoothBound
from megatron_energy.target import EnergyTarget, parse_target

# --- the parser ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "smooth:floor=0.8",
        "smooth:ramp=3000",
        "smooth:job-ramp=5e+06@16384",
        "smooth:floor=0.5,ramp=2000,job-ramp=1e+06@1024,slowdown=0.05",
    ],
)
def test_a_smooth_target_round_trips_through_its_text(text):
    target = parse_target(text)
    assert target.kind == "smooth" and target.smooth is not None
    assert str(target) == text and parse_target(str(target)) == target


def test_a_smooth_target_is_typed_with_its_time_bound():
    target = parse_target("Smooth: floor=0.8, job-ramp=5e6@16384, slowdown=0.1")
    assert target.smooth == SmoothBound(floor_share=0.8, job_ramp_w_per_s=5e6, job_gpus=16384)
    assert target.slowdown == 0.1 and target.deadline_s(2.0) == pytest.approx(2.2)
    assert parse_target("smooth:ramp=3000").deadline_s(2.0) == 2.0  # iso-time by default
    assert target.smooth.resolution_s == 0.02


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("smooth:", "at least one of"),
        ("smooth:slowdown=0.05", "needs a floor, a ramp or a job ramp"),
        ("smooth:floor=1.5", "floor share must be in"),
        ("smooth:floor=0", "floor share must be in"),
        ("smooth:ramp=-3", "ramp must be positive"),
        ("smooth:ramp=fast", "'fast' is not a finite number"),
        ("smooth:job-ramp=5e6", "needs the job's GPU count"),
        ("smooth:job-ramp=5e6@0", "at least one GPU"),
        ("smooth:floor=0.8,floor=0.7", "repeated"),
        ("smooth:swing=100", "not a key=value of smooth"),
        ("smooth:floor=0.8,slowdown=2", "strictly between 0 and 1"),
    ],
)
def test_a_bad_smooth_target_is_refused_with_what_to_give(text, problem):
    with pytest.raises(argparse.ArgumentTypeError, match=problem) as refused:
        parse_target(text)
    assert "e.g. smooth:floor=0.8" in str(refused.value)


def test_only_a_smooth_target_carries_a_bound():
    with pytest.raises(EnergyValueError, match="only a smooth target"):
        EnergyTarget("iso-time", smooth=SmoothBound(floor_share=0.5))
    with pytest.raises(EnergyValueError, match="only a smooth target"):
        EnergyTarget("smooth")


# --- the least filler on known traces ------------------------------------------------------------------

TROUGH = PowerTrace(np.array([0.0, 0.3, 1.0]), np.array([100.0, 500.0]), "modelled")
"""One 1 s iteration: 0.3 s at 100 W, then 0.7 s at 500 W."""


def test_a_floor_alone_costs_what_a_filler_floor_costs():
    bound = SmoothBound(floor_share=0.8, resolution_s=0.1)
    filler = pipeline_filler([TROUGH, TROUGH.shifted(0.5)], bound)
    assert filler.bin_s == pytest.approx(0.1)
    assert filler.energy_j == pytest.approx(2 * floor_energy_j(TROUGH, 400.0, 0.1)) == pytest.approx(180.0)
    ((start_s, end_s, power_w),) = [dataclasses.astuple(window) for window in filler.windows(0)]
    assert (start_s, end_s, power_w) == pytest.approx((0.0, 0.3, 300.0))


def test_a_ramp_limit_rises_before_the_work_and_decays_after_it():
    bound = SmoothBound(ramp_w_per_s=2000.0, resolution_s=0.1)  # 200 W per 0.1 s bin
    filler = pipeline_filler([TROUGH], bound)
    # three 100 W bins between 500 W ones (the iteration wraps round): the outer two rise to 300 W, one step
    # below 500 W, and the middle one stays at 100 W, one step below them
    assert filler.power_w[0].tolist() == pytest.approx([200.0, 0, 200.0, 0, 0, 0, 0, 0, 0, 0])
    (filled,) = filled_traces([TROUGH], [filler.windows(0)])
    assert bound_problems([filled], bound, filler.bin_s) == []
    assert bound_problems([TROUGH], bound, filler.bin_s) == ["stage 0: ramp 4000.0 W/s over 2000 W/s"]


def test_a_job_ramp_is_met_on_the_pipelines_sum_in_phase():
    bound = SmoothBound(job_ramp_w_per_s=1e6, job_gpus=10_000, resolution_s=0.1)
    traces = [TROUGH, TROUGH]
    assert bound_problems(traces, bound, 0.1)  # 2 x 400 W in 0.1 s = 8 kW/s per pipeline, 40 MW/s in all
    filler = pipeline_filler(traces, bound)
    filled = filled_traces(traces, [filler.windows(0), filler.windows(1)])
    assert bound_problems(filled, bound, filler.bin_s) == []
    assert filler.power_w[0].tolist() == pytest.approx(filler.power_w[1].tolist())  # spread evenly


# --- plans ---------------------------------------------------------------------------------------------


def _profile(clocks=(1500, 1300, 1100, 900)) -> Profile:
    """Each instruction at a few clocks: time t x 1500 / f, power 40 W + 60 W x (f / 1500)^2."""
    options = {}
    for (stage, kind), t in TIMES_2X2.items():
        options[Work(stage, 0, kind)] = [
            ClockOption(f, t * 1500 / f, t * 1500 / f * (40 + 60 * (f / 1500) ** 2)) for f in clocks
        ]
    return Profile(options, "test-gpu", "modelled", 50.0, 30.0)


def _job(target: str) -> PlanningJob:
    return PlanningJob(pipeline_orders(2, 4), "f" * 64, parse_target(target), frontier_points=8)


def _simulated(plan: Plan, dag: PipelineDag, profile: Profile) -> tuple[list[PowerTrace], float]:
    """The plan's target point simulated again: each stage's power, and the energy (without filler)."""
    simulator = Simulator(dag, profile)
    point = plan.target_point
    clocks = {step: mhz for stage in range(plan.num_stages) for step, mhz in point.step_clocks(stage).items()}
    result = simulator.run(clocks, plan.switch_latency_s)
    return stage_power_traces(result, simulator.powers), result.total_energy_j


def _simulated_filled(plan: Plan, dag: PipelineDag, profile: Profile) -> tuple[list[PowerTrace], float]:
    """The plan's target point simulated again, its filler windows added; its energy with the filler."""
    traces, energy_j = _simulated(plan, dag, profile)
    assert plan.smoothing is not None
    return filled_traces(traces, plan.smoothing.filler), energy_j + plan.smoothing.filler_j


@pytest.mark.parametrize("bound", ["floor=0.8", "ramp=20", "floor=0.6,ramp=30,job-ramp=4000@100"])
def test_a_smooth_plan_meets_its_bound_for_less_energy_than_a_filler_floor(bound):
    profile, job = _profile(), _job(f"smooth:{bound}")
    plan = PerseusOptimiser().plan(profile, job)
    smoothing = plan.smoothing
    assert smoothing is not None and smoothing.bound == job.target.smooth
    filled, energy_j = _simulated_filled(plan, job.dag(), profile)
    assert bound_problems(filled, smoothing.bound, smoothing.bin_s) == []
    assert energy_j == pytest.approx(plan.target_point.energy_j)  # the plan's energy includes its filler
    assert plan.target_point.iteration_time_s <= plan.baseline.iteration_time_s * (1 + 1e-9)  # iso-time
    assert energy_j < plan.baseline.energy_j + smoothing.filler_floor_j
    iso_time = PerseusOptimiser().plan(profile, _job("iso-time"))
    assert iso_time.smoothing is None and read_plan(plan_text(iso_time)) == iso_time
    iso_filler = pipeline_filler(_simulated(iso_time, job.dag(), profile)[0], smoothing.bound)
    assert energy_j <= iso_time.target_point.energy_j + iso_filler.energy_j + 1e-9  # joint, not after


def test_a_smooth_plan_file_round_trips_and_a_filler_past_the_iteration_is_refused():
    profile, job = _profile(), _job("smooth:floor=0.8")
    plan = PerseusOptimiser().plan(profile, job)
    assert read_plan(plan_text(plan)) == plan
    late = FillerWindow(0.0, 2 * plan.target_point.iteration_time_s, 10.0)
    assert plan.smoothing is not None
    broken = dataclasses.replace(plan, smoothing=dataclasses.replace(plan.smoothing, filler=((late,), ())))
    with pytest.raises(PlanError, match="after the target point's"):
        plan_text(broken)
    summary = plan_summary(plan, plan_text(plan))
    assert "filler" in summary and "is not executed: its smoothness (floor=0.8) is modelled" in summary
    assert plan.target_point.energy_j > plan.baseline.energy_j  # the filler outweighs what the clocks save
    assert why_nothing_found(plan) == (
        f"nothing found: smooth: its {plan.smoothing.filler_j:,.1f} J of filler per iteration outweigh what "
        "its clocks save"
    )


def test_all_keeps_the_clock_plan_of_a_smooth_target_and_says_why():
    profile, job = _profile(), _job("smooth:floor=0.8")

    class Refiner:
        name, request = "kernel", PerseusOptimiser.request

        def plan(self, profile, job, base=None):
            raise AssertionError("a smooth target's later parts must not run")

    plan = ComposedOptimiser([PerseusOptimiser(), Refiner()]).plan(profile, job)
    assert plan.smoothing is not None and plan.optimisers == ("perseus",)
    assert "kernel left out: a smooth target's filler is placed on the clock plan" in plan.notes
    assert choose_memory_clocks(plan, profile, job) is plan  # the filler was placed at the stock memory clock


@pytest.mark.parametrize("mode", ["kareus", "kernel"])
def test_modes_without_a_power_timeline_refuse_a_smooth_target(mode):
    refusal = f"--energy-mode {mode} does not price; use --energy-mode perseus or all"
    with pytest.raises(EnergyValueError, match=refusal):
        EnergyConfig(mode=mode, target=parse_target("smooth:floor=0.8"))


@pytest.mark.slow  # plans the GPT-3 XL example (about 5 s), then simulates it twice
def test_the_gpt3_example_meets_a_floor_for_less_than_the_filler_floor_and_the_commands_say_so(
    tmp_path, capsys
):
    out = tmp_path / "plan.json"
    assert (
        _command(
            plan_command,
            ["--config", EXAMPLE, "--target", "smooth:floor=0.8", "--points", "8", "--out", str(out)],
        )
        == 0
    )
    assert "the same smoothness (floor=0.8) at " in capsys.readouterr().out
    plan = load_plan(out)
    config = JobConfig.load(EXAMPLE)
    spec = config.spec()
    filled, energy_j = _simulated_filled(plan, config.build_dag(spec=spec), config.synthetic_profile(spec))
    assert plan.smoothing is not None
    assert bound_problems(filled, plan.smoothing.bound, plan.smoothing.bin_s) == []
    assert energy_j < plan.baseline.energy_j + plan.smoothing.filler_floor_j
    assert (
        _command(simulate, ["--config", EXAMPLE, "--plan", str(out), "--power-swing", "--gpus", "16384"]) == 0
    )
    printed = capsys.readouterr().out
    assert f"with the plan's filler ({plan.smoothing.filler_j:,.1f} J, in the energy change above)" in printed
    (plan_row,) = [line for line in printed.splitlines() if line.startswith("│ plan ")]
    assert f" {plan.smoothing.filler_j / 4:,.1f} " in plan_row  # the per-GPU filler of the 4-GPU replica


def _command(module, argv):
    parser = argparse.ArgumentParser()
    module.register(parser.add_subparsers())
    args = parser.parse_args([module.__name__.rsplit(".", 1)[-1].removesuffix("_command"), *argv])
    return args.func(args)


def test_a_slowdown_lets_the_clocks_lower_the_peak_a_floor_is_measured_from():
    profile = _profile()
    iso_time = PerseusOptimiser().plan(profile, _job("smooth:floor=0.8"))
    slower = PerseusOptimiser().plan(profile, _job("smooth:floor=0.8,slowdown=0.2"))
    peaks = [
        max(
            float(trace.binned(0.02).power_w.max())
            for trace in _simulated(plan, _job("iso-time").dag(), profile)[0]
        )
        for plan in (iso_time, slower)
    ]
    assert peaks[1] < peaks[0]
    assert slower.target_point.iteration_time_s <= 1.2 * slower.baseline.iteration_time_s * (1 + 1e-9)
    assert slower.target_point.energy_j < iso_time.target_point.energy_j  # filler included in both
    filled, _ = _simulated_filled(slower, _job("iso-time").dag(), profile)
    assert slower.smoothing is not None
    assert bound_problems(filled, slower.smoothing.bound, slower.smoothing.bin_s) == []


def test_the_planners_plain_point_refuses_a_smooth_target():
    planner = Planner(_job("iso-time").dag(), _profile(), num_points=4)
    with pytest.raises(ValueError, match=r"comes from perseus\.smooth_point"):
        planner.point(parse_target("smooth:floor=0.8"))
