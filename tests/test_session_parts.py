"""The parts of the energy session, one at a time, in one process: log line, policies, plan bundle, cache,
profiling, grid; and the session's run phase on a one-stage replica whose data-parallel peer is scripted.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import random
import re
import statistics
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from job_facts import job_facts, read_back
from log_lines import capture_lines
from reductions import PeerComms, over_ranks

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.controller import RESET
from megatron_energy.dvfs.emulation import Emulation
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.simulated import SimulatedGPUs
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.registry import resolve
from megatron_energy.pipeline.collective_names import END, CollectiveName
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.profile import Profile
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import (
    Baseline,
    Boundary,
    ClockAction,
    CollectiveAction,
    Plan,
    PlanError,
    PlanPoint,
    RankPlan,
)
from megatron_energy.runtime.assembly import AUTO_GRID_POINTS, GridError, profiling_grid
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import Group, LocalComms, ReduceOp
from megatron_energy.runtime.energy_log.energy_line import (
    JobInterval,
    StageEnergy,
    StockSamples,
    format_energy_line,
    publish,
)
from megatron_energy.runtime.energy_log.log_aggregate import interval_vectors, job_interval
from megatron_energy.runtime.energy_log.log_window import WINDOW_ITERS, PhaseWindow, RankWindow
from megatron_energy.runtime.parts import RunningPoint
from megatron_energy.runtime.planning_round.cache import JobCache, describe_changes
from megatron_energy.runtime.profiling.baseline_length import MAX_STOCK_S, MAX_STOCK_STEPS, stock_steps_needed
from megatron_energy.runtime.profiling.collector import ProfileCollector, ProfileRow, StepRecord, merge_rows
from megatron_energy.runtime.profiling.extrapolation import extrapolate_rows
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.runtime.running.plan_runner import PlanRunner
from megatron_energy.runtime.running.policies import SafetyNet, StragglerPolicy
from megatron_energy.runtime.session import EnergySession
from megatron_energy.runtime.step_figures import StepFigures
from megatron_energy.runtime.timing import InstructionSample, SimulatedTimer, StepTiming

# ------------------------------------------------------------------------------------------- energy log


def _stage_energy(stage: int, measured: float, **changes) -> StageEnergy:
    fields = dict(
        stage=stage,
        measured_j_per_iter=measured,
        predicted_j_per_iter=0.9 * measured,
        iteration_s=0.1,
    )
    return StageEnergy(**(fields | changes))


def _window(first_step: int, energies: list[float], iteration_s: float = 1.1) -> RankWindow:
    return RankWindow(first_step, tuple(energies), tuple([iteration_s] * len(energies)))


def _interval(ranks: list[StageEnergy], iteration: int) -> JobInterval:
    """The ranks' figures reduced over the job, as every rank has them at the line of ``iteration``."""
    stages = 1 + max(rank.stage for rank in ranks)
    vectors = [interval_vectors(rank, stages, iteration - 1) for rank in ranks]
    return job_interval(*over_ranks(vectors), stages)


def test_energy_line_sums_peers_per_stage_and_labels_every_figure():
    # two replicas of a two-stage pipeline, gathered in rank order (not stage order)
    ranks = [
        _stage_energy(1, 30.0, iteration_s=0.120),
        _stage_energy(0, 10.0),
        _stage_energy(1, 32.0),
        _stage_energy(0, 12.0, iteration_s=0.130),
    ]
    line, scalars = format_energy_line(7, _interval(ranks, 7), "modelled", "planned")
    total = 10.0 + 12.0 + 30.0 + 32.0
    predicted = 0.9 * total
    assert line.startswith("[energy] iteration 7 | planned | ")
    assert "J/iter modelled: s0=22.0 s1=62.0" in line
    assert f"total={total:.1f}" in line
    assert f"predicted (modelled)={predicted:.1f}" in line
    assert "iter 130.0 ms (modelled)" in line  # the slowest rank's iteration
    assert "vs stock" not in line  # no stock baseline given
    assert scalars == pytest.approx(
        {
            "energy/j_per_iter_total": total,
            "energy/j_per_iter_stage0": 22.0,
            "energy/j_per_iter_stage1": 62.0,
            "energy/j_per_iter_predicted": predicted,
            "energy/iteration_s": 0.130,
        }
    )


def _noisy(rng: random.Random, mean: float, n: int, cv: float = 0.03) -> list[float]:
    return [rng.gauss(mean, cv * mean) for _ in range(n)]


def test_a_window_ten_percent_below_stock_reads_as_a_saving_whose_interval_excludes_zero():
    rng = random.Random(1)
    stock = StockSamples(tuple(_noisy(rng, 300.0, 20)), tuple(_noisy(rng, 1.1, 20)), counter_period_s=0.1)
    ranks = [  # the window's iterations 10 % cheaper, as fast; two ranks, summed per iteration
        _stage_energy(0, 135.0, window=_window(30, _noisy(rng, 135.0, 20))),
        _stage_energy(1, 135.0, window=_window(30, _noisy(rng, 135.0, 20))),
    ]
    line, scalars = format_energy_line(50, _interval(ranks, 50), "measured", "planned", stock)
    energy = re.search(
        r"\| energy vs stock: (-\d+\.\d) % ± (\d+\.\d) % \(measured, 95 % CI, n=20 vs 20\) \|", line
    )
    assert energy, line
    assert float(energy[1]) + float(energy[2]) < 0  # resolved: the whole interval below zero
    assert scalars["energy/change_vs_stock_low"] <= -0.10 <= scalars["energy/change_vs_stock_high"]
    assert scalars["energy/change_vs_stock_resolved"] == 1.0
    assert scalars["energy/window_iterations"] == 20
    assert "| time vs stock: within noise (±" in line
    assert scalars["energy/iteration_change_vs_stock_resolved"] == 0.0


def test_the_same_clocks_read_within_noise_and_the_window_never_mixes_phases():
    rng = random.Random(2)
    stock = StockSamples(tuple(_noisy(rng, 300.0, 20)), tuple(_noisy(rng, 1.1, 20)), counter_period_s=0.1)
    # rank 1 changed phase three steps later than rank 0: only the steps both ran in it count
    ranks = [
        _stage_energy(0, 150.0, window=_window(10, _noisy(rng, 150.0, 12))),
        _stage_energy(1, 150.0, window=_window(13, _noisy(rng, 150.0, 9))),
    ]
    line, scalars = format_energy_line(22, _interval(ranks, 22), "measured", "planned", stock)
    assert re.search(r"\| energy vs stock: within noise \(±\d+\.\d %\) \|", line), line
    assert scalars["energy/change_vs_stock_resolved"] == 0.0
    assert scalars["energy/change_vs_stock_low"] < 0 < scalars["energy/change_vs_stock_high"]
    assert scalars["energy/window_iterations"] == 9


def test_a_resolved_change_where_no_clock_was_set_is_said_to_come_from_outside_the_plan():
    rng = random.Random(3)
    stock = StockSamples(tuple(_noisy(rng, 300.0, 20)), tuple(_noisy(rng, 1.1, 20)), counter_period_s=0.1)
    slower = [_stage_energy(0, 330.0, window=_window(30, _noisy(rng, 330.0, 20)))]  # disturbed, say
    outside = "(no clock was set: a change from outside the plan, not its effect)"
    dry, _ = format_energy_line(50, _interval(slower, 50), "measured", "planned (clocks not set)", stock)
    assert re.search(
        r"\| energy vs stock: \+\d+\.\d % ± \d+\.\d % \(measured, 95 % CI, n=20 vs 20\) "
        + re.escape(outside),
        dry,
    ), dry
    applied, _ = format_energy_line(50, _interval(slower, 50), "measured", "planned", stock)
    assert outside not in applied  # with clocks set, the change is the plan's
    assert "time vs stock: within noise" in dry and dry.count(outside) == 1  # only resolved changes say it


def test_energy_line_leaves_out_prediction_and_changes_it_cannot_compute():
    stock = StockSamples((300.0, 301.0), (1.1, 1.1))
    ranks = [
        _stage_energy(0, 10.0),  # the phase just began: its first step settles, no window yet
        _stage_energy(1, 20.0, predicted_j_per_iter=None, window=_window(3, [20.0])),
    ]
    line, scalars = format_energy_line(4, _interval(ranks, 4), "measured", "profiling", stock)
    assert "J/iter measured: s0=10.0 s1=20.0" in line
    assert "predicted" not in line and "vs stock" not in line
    assert set(scalars) == {
        "energy/j_per_iter_total",
        "energy/j_per_iter_stage0",
        "energy/j_per_iter_stage1",
        "energy/iteration_s",
    }


def test_a_phase_window_leaves_out_its_settling_step_and_restarts_with_each_phase():
    window = PhaseWindow()

    def figures(energy_j: float) -> StepFigures:
        return StepFigures(StepTiming((), 1.0, "modelled"), 1.0, energy_j, None, exact=True)

    for step, phase in enumerate(["profiling"] * 3 + ["planned"] * 4):
        window.add(step, phase, figures(float(step)))
    assert [f.energy_j for f in window.take_interval()] == [3.0, 4.0, 5.0, 6.0]  # planned steps only
    assert window.take_interval() == []
    assert window.rank_window() == RankWindow(4, (4.0, 5.0, 6.0), (1.0, 1.0, 1.0))  # step 3 settles
    for step in range(7, 7 + 2 * WINDOW_ITERS):
        window.add(step, "planned", figures(float(step)))
    capped = window.rank_window()
    assert len(capped.energy_j) == WINDOW_ITERS and capped.first_step == 7 + WINDOW_ITERS
    window.add(200, "stock (safety net)", figures(1.0))
    assert window.rank_window().first_step == -1


def test_publish_logs_the_line_and_writes_every_scalar_to_every_sink(caplog):
    first: list[tuple[str, float, int]] = []
    second: list[tuple[str, float, int]] = []
    scalars = {"energy/a": 1.5, "energy/b": -2.0, "energy/c": 0.0}

    with caplog.at_level(logging.INFO, logger="megatron_energy"):
        publish("the line", scalars, 42, [lambda *a: first.append(a), lambda *a: second.append(a)])

    assert caplog.messages == ["the line"]
    expected = sorted((name, value, 42) for name, value in scalars.items())
    assert sorted(first) == expected
    assert sorted(second) == expected


# ---------------------------------------------------------------------------------------------- policies


def test_straggler_contribution_is_the_measured_time_only_beyond_the_tolerance():
    policy = StragglerPolicy(nominal_time_s=1.0, tolerance=0.03)
    assert policy.contribution(1.02 * 1.2, predicted_s=1.2) == 1.0
    assert policy.contribution(1.04 * 1.2, predicted_s=1.2) == pytest.approx(1.04 * 1.2)


def test_straggler_policy_follows_ignores_small_drift_and_recovers():
    policy = StragglerPolicy(nominal_time_s=1.0, tolerance=0.03)
    assert policy.update(1.0, straggling=False) is None  # everyone on pace
    assert policy.update(1.02, straggling=False) is None  # within tolerance of the plan: not a straggler
    assert policy.update(1.3, straggling=False) == 1.3  # follow
    assert policy.pace_s == 1.3
    assert policy.update(1.32, straggling=False) is None  # drift within 3 % of the current pace
    assert policy.update(1.27, straggling=False) is None
    assert policy.update(1.5, straggling=False) == 1.5  # a real change of pace
    assert policy.update(1.01, straggling=False) == 1.0  # recovered: back to the plan's own time
    assert policy.update(1.01, straggling=False) is None


def test_the_straggler_itself_keeps_its_plan():
    policy = StragglerPolicy(nominal_time_s=1.0)
    assert policy.update(1.6, straggling=True) is None
    assert policy.pace_s == 1.0


def test_safety_net_trips_exactly_once_after_patience_consecutive_violations():
    net = SafetyNet(tolerance=0.05, patience=3)
    allowed = 1.0
    slow, fine = 1.06, 1.05  # 1.05 is exactly at the tolerance: not a violation
    assert [net.observe(t, allowed) for t in (slow, slow, fine, slow, slow)] == [False] * 5
    assert net.violations == 2
    assert net.observe(slow, allowed) is True
    assert net.tripped
    assert [net.observe(slow, allowed) for _ in range(5)] == [False] * 5


def test_an_excused_step_ends_a_streak_of_violations():
    net = SafetyNet(tolerance=0.05, patience=2)
    assert net.observe(2.0, 1.0) is False
    net.excuse()
    assert net.observe(2.0, 1.0) is False
    assert net.observe(2.0, 1.0) is True


def test_steps_within_the_stock_steps_own_noise_do_not_trip_the_net():
    """A dry run on a noisy machine: stock steps swing by ~8 %, so 10 %-slow steps are noise, 30 % are not."""
    baseline = StockBaseline(iteration_s=1.0, step_iteration_s=(0.92, 1.0, 1.08, 0.95, 1.05))
    noise_s = baseline.iteration_noise_s
    assert noise_s == pytest.approx(statistics.stdev(baseline.step_iteration_s))
    assert StockBaseline(iteration_s=1.0, step_iteration_s=(0.9, 1.1)).iteration_noise_s == 0.0
    net = SafetyNet(tolerance=0.05, patience=3)
    assert not any(net.observe(1.1, 1.0, noise_s=noise_s) for _ in range(10))
    assert [net.observe(1.3, 1.0, noise_s=noise_s) for _ in range(3)] == [False, False, True]
    quiet = SafetyNet(tolerance=0.05, patience=3)  # no noise known: the tolerance alone decides
    assert [quiet.observe(1.1, 1.0) for _ in range(3)] == [False, False, True]


def _tripped_on_time(patience: int = 2, rearms: int = 2) -> SafetyNet:
    net = SafetyNet(tolerance=0.05, patience=patience, rearms=rearms)
    assert [net.observe(1.5, 1.0) for _ in range(patience)][-1] is True
    return net


def test_the_net_re_arms_when_stock_steps_were_as_slow_and_then_recovered():
    net = _tripped_on_time()
    assert [net.observe_stock(1.5, 1.0) for _ in range(2)] == [False, False]  # as slow at stock: not the plan
    assert net.excused and net.tripped
    assert [net.observe_stock(1.6, 1.0), net.observe_stock(1.0, 1.0), net.observe_stock(1.5, 1.0)] == [
        False
    ] * 3
    assert [net.observe_stock(1.0, 1.0), net.observe_stock(1.02, 1.0)] == [False, True]  # 2 normal in a row
    assert not net.tripped and not net.excused and net.rearms == 1 and net.violations == 0
    assert net.observe_stock(1.0, 1.0) is False  # armed again: nothing to re-arm
    assert [net.observe(1.5, 1.0) for _ in range(2)] == [False, True]  # and it trips as before


def test_the_net_stays_reverted_when_stock_steps_run_at_their_pace_first():
    net = _tripped_on_time()
    assert [net.observe_stock(1.0, 1.0) for _ in range(2)] == [False, False]  # the plan was slow
    assert net.rearms == 0
    assert not any(net.observe_stock(t, 1.0) for t in (1.5, 1.5, 1.5, 1.0, 1.0, 1.0))
    assert net.tripped


def test_the_net_re_arms_at_most_its_re_arms_and_never_after_a_power_trip():
    net = _tripped_on_time(rearms=1)
    assert not any(net.observe_stock(t, 1.0) for t in (1.5, 1.5, 1.0))
    assert net.observe_stock(1.0, 1.0) is True and net.rearms == 0
    assert [net.observe(1.5, 1.0) for _ in range(2)] == [False, True]
    assert not any(net.observe_stock(t, 1.0) for t in (1.5, 1.5, 1.0, 1.0, 1.0))
    power = SafetyNet(tolerance=0.05, patience=1)
    assert power.observe(1.0, 1.0, power_w=500.0, allowed_w=400.0) and power.last_cause == "power"
    assert not any(power.observe_stock(t, 1.0) for t in (1.5, 1.5, 1.0, 1.0))


def test_stock_steps_within_their_own_noise_count_as_normal_after_a_trip():
    net = _tripped_on_time()
    assert [net.observe_stock(1.1, 1.0, noise_s=0.08) for _ in range(2)] == [False, False]  # 2 sigma: noise
    assert net.rearms == 0 and not net.excused


# ------------------------------------------------------------------------------------------- plan runner

F = Instruction(1, 0, 0, "forward")
B = Instruction(1, 0, 0, "backward")
GRAD = CollectiveName("dp", "all_reduce", bucket=0)


def _runner_plan(target_index: int = 1) -> Plan:
    # point energies (sum over 2 stages): 20, 18, 16, 15 (the minimum-energy point, last)
    times = (1.0, 1.1, 1.2, 1.4)
    energies = ((10.0, 10.0), (9.0, 9.0), (8.5, 7.5), (7.0, 8.0))
    points = tuple(
        PlanPoint(
            label=f"p{i}",
            iteration_time_s=times[i],
            deadline_s=times[i],
            lower_bound_j=sum(energies[i]) - 1,
            ranks=(
                RankPlan(
                    (ClockAction(Boundary(Instruction(0, 0, 0, "forward")), 1980 - 100 * i),),
                    energies[i][0],
                    0.5,
                ),
                RankPlan(
                    (
                        ClockAction(Boundary(F), 1900 - 100 * i),
                        CollectiveAction(Boundary(B, END), GRAD, max_ctas=4 + i),
                    ),
                    energies[i][1],
                    0.5,
                ),
            ),
        )
        for i in range(4)
    )
    return Plan(
        "f" * 16,
        "h100-sxm",
        "modelled",
        "iso-time",
        ("perseus",),
        0.0,
        Baseline(1.0, 21.0),
        points,
        target_index,
    )


def test_runner_applies_one_point_of_its_rank_and_switches_points():
    runner = PlanRunner(_runner_plan(), stage=1, order=(F, B))
    assert runner.on_target and runner.clock_at(F) == 1800
    assert runner.clock_at(B) is None  # no clock action there: leave the clock
    assert runner.collective(GRAD).max_ctas == 5
    runner.select(2)
    assert not runner.on_target
    assert runner.clock_at(F) == 1700
    assert runner.predicted_time_s == 1.2 and runner.predicted_energy_j == 7.5


def test_runner_refuses_a_plan_for_another_schedule():
    with pytest.raises(PlanError, match=r"rank 1 does not run.*rerun planning"):
        PlanRunner(_runner_plan(), stage=1, order=(B,))
    with pytest.raises(PlanError, match="not rank 2"):
        PlanRunner(_runner_plan(), stage=2, order=(F, B))


# ------------------------------------------------------------------------------------------------- cache


def _job(**changes) -> dict:
    parts = {"model": {"hidden_size": 2048, "num_layers": 24}, "pipeline_size": 4, "num_microbatches": 8}
    return parts | changes


def test_describe_changes_names_each_changed_fact_dotted_and_sorted():
    old = _job()
    new = _job(num_microbatches=4, model={"hidden_size": 4096, "num_layers": 24}, gpu="h100-sxm")
    assert describe_changes(old, new) == [
        "gpu: None -> 'h100-sxm'",
        "model.hidden_size: 2048 -> 4096",
        "num_microbatches: 8 -> 4",
    ]
    assert describe_changes(old, _job()) == []


def test_cache_load_empty_hit_and_changed(tmp_path):
    cache = JobCache(tmp_path, job_facts())
    first = cache.load()
    assert not first.hit
    assert "empty" in first.message
    assert first.folder == tmp_path / cache.fingerprint

    cache.store({"plan.json": "{}", "baseline.json": "{}", "profile.csv": "stage\n"})
    hit = JobCache(tmp_path, job_facts()).load()
    assert hit.hit and hit.artefacts["profile.csv"] == b"stage\n"
    assert "cache hit" in hit.message and str(cache.folder) in hit.message
    assert json.loads((tmp_path / "last_job.json").read_text())["fingerprint"] == cache.fingerprint
    assert json.loads((cache.folder / "job.json").read_text())["parts"] == read_back(job_facts())

    changed = JobCache(tmp_path, job_facts(num_microbatches=4))
    assert changed.fingerprint != cache.fingerprint
    miss = changed.load()
    assert not miss.hit
    assert "num_microbatches: 8 -> 4" in miss.message
    assert "pipeline_size" not in miss.message


# --------------------------------------------------------------------------------------------- profiling


def _timing(durations: dict[str, float], iteration_s: float, energies: dict[str, float] | None = None):
    """Forward then backward of microbatch 0, back to back after a gap of 10 % of the iteration."""
    samples, start = [], 0.1 * iteration_s
    for kind, duration in durations.items():
        energy = None if energies is None else energies[kind]
        samples.append(
            InstructionSample(Instruction(1, 0, 0, kind), start, start + duration, energy_j=energy)
        )
        start += duration
    return StepTiming(tuple(samples), intrinsic_s=iteration_s, source="modelled")


def _collector(clocks=(1980, 1500), steps_per_clock=2) -> ProfileCollector:
    return ProfileCollector(
        clocks_mhz=clocks, steps_per_clock=steps_per_clock, blocked_power_w=100.0, idle_power_w=50.0
    )


def test_profile_collector_walks_the_grid_and_discards_each_settling_step():
    collector = _collector()
    assert collector.steps_needed == 8
    walked = []
    # stock: settling step (wildly off, must be discarded), two baseline steps, two synchronous profile steps;
    # 1500 MHz: settling step, two profile steps
    plan = {1980: (9.0, 7.0, 8.0, 2.0, 3.0), 1500: (9.0, 3.0, 5.0)}
    for clock in (1980, 1500):
        for forward_s in plan[clock]:
            assert not collector.done
            walked.append(collector.begin_step())
            timing = _timing(
                {"forward": forward_s, "backward": 2 * forward_s},
                10.0,
                {"forward": forward_s, "backward": 1.0},
            )
            collector.add_step(StepFigures(timing, 10.0 + forward_s, 100.0 + forward_s, None, exact=True))
    assert [(step.clock_mhz, step.kind) for step in walked] == [
        (1980, "settling"),
        (1980, "baseline"),
        (1980, "baseline"),
        (1980, "profile"),
        (1980, "profile"),
        (1500, "settling"),
        (1500, "profile"),
        (1500, "profile"),
    ]
    assert [step.synchronised for step in walked] == [True, False, False, True, True, True, True, True]
    assert collector.done
    assert collector.clock_for_next_step() == 1500  # stays on the last clock once done

    # the rows come from every measured step: the stock clock's baseline and synchronous steps
    rows = {(row.work.kind, row.clock_mhz): row for row in collector.rows()}
    assert set(rows) == {("forward", 1980), ("backward", 1980), ("forward", 1500), ("backward", 1500)}
    assert rows[("forward", 1980)].time_s == pytest.approx((7.0 + 8.0 + 2.0 + 3.0) / 4)
    assert rows[("backward", 1500)].time_s == pytest.approx((6.0 + 10.0) / 2)
    assert rows[("forward", 1500)].energy_j == pytest.approx((3.0 + 5.0) / 2)
    assert rows[("backward", 1980)].energy_j == pytest.approx(1.0)
    assert [rows[(kind, 1980)].samples for kind in ("forward", "backward")] == [4, 4]
    assert all(row.samples == 2 for key, row in rows.items() if key[1] == 1500)
    assert all(row.work.stage == 1 and row.work.chunk == 0 for row in rows.values())

    # the stock baseline comes from the baseline steps only
    stock = collector.stock_baseline()
    assert stock is not None and stock.clock_mhz == 1980
    assert stock.iteration_s == pytest.approx((17.0 + 18.0) / 2)
    assert stock.energy_j == pytest.approx((107.0 + 108.0) / 2)


def test_measured_step_energy_less_waiting_and_the_outside_part_is_split_over_instructions_by_time():
    collector = _collector(clocks=(1980,), steps_per_clock=1)
    timing = _timing({"forward": 0.1, "backward": 0.3}, iteration_s=1.0)  # no per-instruction energy
    timing = dataclasses.replace(timing, cycle_s=1.25)  # 0.25 s between the two schedules
    collector.add_step(StepFigures(timing, 1.25, 0.0, 0.0, exact=False))  # settling
    collector.add_step(StepFigures(timing, 1.3, 240.0, None, exact=False))  # baseline: one lap, no split
    step_energy_j, outside_j = 200.0, 30.0  # the pipeline span's 200 J and 30 J between the schedules
    collector.add_step(StepFigures(timing, 1.25, step_energy_j + outside_j, outside_j, exact=False))

    busy_s = 0.1 + 0.3
    last_end_s = 0.1 + busy_s
    blocked_j = 100.0 * (last_end_s - busy_s)  # the gap before the forward, at the blocked power
    idle_j = 50.0 * (1.0 - last_end_s)  # after the last instruction, at the idle power
    busy_j = step_energy_j - blocked_j - idle_j
    # the baseline step's pipeline span: its whole 240 J less the 30 J the synchronous step measured outside
    baseline_busy_j = 240.0 - outside_j - blocked_j - idle_j
    rows = {row.work.kind: row for row in collector.rows()}
    assert rows["forward"].energy_j == pytest.approx((busy_j + baseline_busy_j) / 2 * 0.1 / busy_s)
    assert rows["backward"].energy_j == pytest.approx((busy_j + baseline_busy_j) / 2 * 0.3 / busy_s)
    baseline, profiled = collector.stock_steps()
    assert (baseline.synchronised, profiled.synchronised) == (False, True)
    assert (baseline.iteration_s, baseline.energy_j, baseline.outside_j) == (1.3, 240.0, 0.0)
    assert (profiled.iteration_s, profiled.energy_j) == (1.25, 230.0)  # the whole iteration
    assert (profiled.outside_s, profiled.outside_j) == (pytest.approx(0.25), 30.0)


def test_the_baseline_is_measured_as_long_as_decided_at_the_pilots_end_under_the_lag():
    collector = _collector(steps_per_clock=1)
    collector.stock_iters = 3  # the pilot
    timing = _timing({"forward": 0.1, "backward": 0.3}, iteration_s=1.0)
    walked, held = [], []
    while not collector.done:
        walked.append(collector.begin_step())
        if not walked[-1].synchronised:  # lagged: this step's figures come at the next step's end
            held.append(StepFigures(timing, 1.0, 100.0, None, exact=False))
            ready = held[:-1]
            del held[:-1]
        else:
            ready = [*held, StepFigures(timing, 1.0, 100.0, None, exact=False)]
            held.clear()
        for figures in ready:
            collector.add_step(figures)
            if collector.stock_begun == 3 and collector.stock_iters == 3:
                assert collector.stock_measured == 2  # the pilot's last step is still in flight
                collector.set_stock_steps(5)  # decided at the pilot's end: two more
    kinds = [(step.clock_mhz, step.kind) for step in walked]
    assert kinds == [(1980, "settling")] + [(1980, "baseline")] * 5 + [
        (1980, "profile"),
        (1500, "settling"),
        (1500, "profile"),
    ]
    assert len(collector.baseline_steps()) == 5 and collector.steps_needed == 9
    with pytest.raises(ValueError):
        collector.set_stock_steps(6)  # the baseline steps are over


def test_the_stock_baseline_length_follows_the_counter_period_and_the_spread():
    def steps(times: list[float], energies: list[float]) -> list[StepRecord]:
        return [StepRecord(1980, t, e) for t, e in zip(times, energies, strict=True)]

    # exact energies, no spread: the pilot is enough
    assert stock_steps_needed(steps([0.125] * 3, [200.0] * 3), counter_period_s=0.0) == 3
    # a 100 ms counter and 30 ms iterations: 7 iterations per sample, 3 samples, within the bounds
    assert stock_steps_needed(steps([0.03] * 3, [20.0] * 3), counter_period_s=0.1) == MAX_STOCK_STEPS
    # 1.1 s iterations with 3 % noise: as many as the 1 % target asks for, bounded
    noisy = steps([1.1, 1.12, 1.09], [1100.0, 1140.0, 1080.0])
    assert stock_steps_needed(noisy, counter_period_s=0.1) == MAX_STOCK_STEPS
    quiet = steps([1.1, 1.1005, 1.1], [1100.0, 1100.5, 1100.0])
    assert stock_steps_needed(quiet, counter_period_s=0.1) == 3
    # 10 s iterations: no more than MAX_STOCK_S seconds of them
    slow = steps([10.0, 10.5, 9.6], [1e4, 1.05e4, 0.96e4])
    assert stock_steps_needed(slow, counter_period_s=0.1) == int(
        MAX_STOCK_S / statistics.fmean([10.0, 10.5, 9.6])
    )
    # the stock clock's synchronous profile steps count towards the bound; the steps begun are the floor
    assert stock_steps_needed(noisy, counter_period_s=0.1, synchronous_steps=2) == MAX_STOCK_STEPS - 2
    assert stock_steps_needed(quiet, counter_period_s=0.1, synchronous_steps=2, begun=4) == 4


def test_merge_rows_takes_the_slowest_peer_and_the_mean_energy():
    def row(stage: int, clock: int, time_s: float, energy_j: float) -> ProfileRow:
        return ProfileRow(Work(stage, 0, "forward"), clock, time_s, energy_j, samples=2)

    merged = merge_rows(
        [
            [row(0, 1980, 1.0, 10.0), row(0, 1500, 1.3, 8.0)],
            [row(1, 1980, 2.0, 20.0)],
            [row(0, 1980, 1.2, 12.0), row(0, 1500, 1.25, 9.0)],
        ]
    )
    assert merged == {
        Work(0, 0, "forward"): {1980: (1.2, pytest.approx(11.0)), 1500: (1.3, pytest.approx(8.5))},
        Work(1, 0, "forward"): {1980: (2.0, 20.0)},
    }


# -------------------------------------------------------------------------------------------------- grid

H100_CLOCKS = list(range(1980, 209, -15))


def test_auto_grid_spreads_over_the_top_half_and_starts_at_stock():
    grid = profiling_grid(None, H100_CLOCKS)
    assert len(grid) == AUTO_GRID_POINTS
    assert grid[0] == max(H100_CLOCKS)
    assert grid == sorted(grid, reverse=True)
    assert all(clock in H100_CLOCKS and clock >= max(H100_CLOCKS) / 2 for clock in grid)
    gaps = {a - b for a, b in itertools.pairwise(grid)}
    assert len(gaps) == 1  # evenly spaced


def test_requested_grid_is_sorted_highest_first():
    assert profiling_grid([1305, 1980, 1530], H100_CLOCKS) == [1980, 1530, 1305]


def test_unsupported_clock_names_the_nearest_supported_ones():
    with pytest.raises(GridError) as refused:
        profiling_grid([1980, 1702, 1290], H100_CLOCKS)
    message = str(refused.value)
    assert "1702 -> 1695" in message
    assert "1290 ->" not in message and "1980 ->" not in message  # supported ones are not named
    assert "210-1980 MHz" in message


def test_an_unsupported_clock_between_two_names_the_closer():
    with pytest.raises(GridError, match=r"1296 -> 1290"):
        profiling_grid([1296], H100_CLOCKS)


# ----------------------------------------------------- the run phase of a session with a scripted peer


class _Controller:
    """Records the clocks the session asks for."""

    def __init__(self) -> None:
        self.requests: list[int | None] = []

    def request(self, clock_mhz: int | None, boundary: object = None) -> None:
        self.requests.append(clock_mhz)

    @property
    def clock_mhz(self) -> int:
        last = self.requests[-1] if self.requests else RESET
        return 1980 if last is RESET else last

    def set_memory_clock(self, clock_mhz: int | None) -> None:
        pass

    def close(self) -> None:
        pass


class _Meter:
    def lap(self, name: str = "iteration") -> None:
        return None


class _Timer:
    """Each instruction runs at the last requested clock: 10 ms forward / 20 ms backward at 1980 MHz,
    scaled by 1980 / clock (compute bound) and by ``slowdown`` (an extrinsic slowdown)."""

    source = "modelled"

    def __init__(self, controller: _Controller) -> None:
        self.controller = controller
        self.slowdown = 1.0
        self._runs: list[tuple[str, float, float]] = []

    def wait_for_device(self) -> None:
        pass

    def step_begin(self) -> None:
        self._runs.clear()

    def begin(self, instruction: Instruction) -> None:
        return None

    def end(self, instruction: Instruction) -> None:
        kind, clock = instruction.kind, self.controller.clock_mhz
        time_s = (0.010 if kind == "forward" else 0.020) * 1980 / clock * self.slowdown
        power_w = 100.0 + 600.0 * (clock / 1980) ** 2
        self._runs.append((kind, time_s, power_w * time_s))

    def flush(self) -> tuple[StepTiming, ...]:
        return ()

    def phase_begin(self, name: str) -> None:
        return None

    def phase_end(self, name: str) -> None:
        pass

    def outside_durations(self) -> dict[str, float]:
        return {}

    def finish_step(self, *, lagged: bool = False) -> tuple[StepTiming, ...]:
        samples, start = [], 0.0
        for kind, time_s, energy_j in self._runs:
            samples.append(
                InstructionSample(Instruction(0, 0, 0, kind), start, start + time_s, energy_j=energy_j)
            )
            start += time_s
        return (StepTiming(tuple(samples), start, "modelled", sum(s.energy_j for s in samples)),)


class _PeerComms(PeerComms):
    """The one rank of replica 0 of a one-stage job; replica 1 (when there is one) is scripted.

    Over the data-parallel group the peer sends what this rank sends, except in the exchange of paces (the
    one max of a contribution and its negation), where its contribution is ``peer_s`` (``None``: the same).
    """

    def __init__(self, data_parallel_size: int) -> None:
        super().__init__({"data": data_parallel_size})
        self.peer_s: float | None = None
        self.paces = 0
        """Exchanges of paces the rank joined (their data-parallel link)."""

    def peer(self, values: Sequence[float], op: ReduceOp, group: Group) -> list[float]:
        pace = op == "max" and len(values) == 2 and values[1] == -values[0]
        self.paces += pace
        return [self.peer_s, -self.peer_s] if pace and self.peer_s is not None else list(values)


SAFETY_STEPS = 3


def _session(tmp_path, data_parallel_size: int = 2, can_set_clocks: bool = True, log_interval: int = 1000):
    controller, comms, lines = _Controller(), _PeerComms(data_parallel_size), capture_lines()
    timer = _Timer(controller)
    spec = load_gpu_spec("h100-sxm")
    context = JobContext(
        pipeline_rank=0,
        orders=pipeline_orders(1, 1),
        data_parallel_rank=0,
        data_parallel_size=data_parallel_size,
        log_interval=log_interval,
    )
    config = EnergyConfig(
        optimise=True, dir=tmp_path, profile_iters=1, safety_tolerance=0.05, safety_steps=SAFETY_STEPS
    )
    session = EnergySession(
        config,
        context,
        optimiser=resolve("perseus"),
        controller=controller,
        meter=_Meter(),
        timer=timer,
        comms=comms,
        clocks_mhz=[1980, 1500],
        can_set_clocks=can_set_clocks,
        cache=JobCache(tmp_path, context.job_facts(spec.name)),
        spec=spec,
    )
    return session, timer, comms, controller, lines


def _step(session: EnergySession, step: int) -> None:
    session.on_step_begin(step)
    for kind in ("forward", "backward"):
        session.on_instruction_begin(kind, 0, 0)
        session.on_instruction_end(kind, 0, 0)
    session.on_step_end(step)


def _profile_and_plan(session: EnergySession) -> int:
    step = 0
    while session.phase == "profiling":
        _step(session, step)
        step += 1
    # the stock clock: a settling step, the 4-step baseline pilot (exact, steady figures need no more) and one
    # synchronous profile step; then 1500
    assert step == session.collector.steps_needed == (1 + 4 + 1) + (1 + 1)
    assert session.phase == "planned" and session.plan is not None
    return step


@pytest.mark.slow
def test_the_first_planned_line_speaks_for_planned_steps_only(tmp_path):
    # 10-step log interval: steps 0-7 profile (the last two at 1500 MHz, 39.6 ms, 17.6 J), steps 8-9 run the
    # plan at 1980 MHz (30 ms, 21 J); the line at step 9 must not average the profiling steps in.
    session, _, _, _, lines = _session(tmp_path, data_parallel_size=1, log_interval=10)
    step = _profile_and_plan(session)
    assert step == 8
    _step(session, 8)
    _step(session, 9)
    (line,) = [line for line in lines if line.startswith("[energy] iteration 10 |")]
    assert "| planned |" in line
    assert "s0=21.0 | total=21.0" in line and "| iter 30.0 ms (modelled)" in line


@pytest.mark.slow
def test_a_lone_slow_replica_is_not_reverted_but_every_replica_slow_is(tmp_path):
    session, timer, comms, controller, lines = _session(tmp_path)
    step = _profile_and_plan(session)
    assert session.baseline.iteration_s == pytest.approx(0.030)
    nominal_s = session.run_guard.straggler.nominal_time_s
    # two replicas of one stage, 30 ms iterations: the modelled exchange is cheap, so one begins every step
    # and its verdict comes at the next step's end
    assert sum("exchange their pace every 1 step(s)" in line for line in lines) == 1

    # this replica is throttled, its peer keeps the plan's pace: not the plan's fault
    timer.slowdown = 1.5
    comms.peer_s = nominal_s
    for _ in range(2 * SAFETY_STEPS):
        _step(session, step)
        step += 1
    assert session.phase == "planned"
    assert not any("reverted" in line for line in lines)

    # every replica as slow: the plan is to blame. The first such step's verdict is still the previous
    # step's (the peer at its pace), which excuses it; the net trips once SAFETY_STEPS steps have a verdict
    # that the peer is slow too, one step after the last of them
    comms.peer_s = 1.5 * nominal_s
    for left in range(SAFETY_STEPS + 1, 0, -1):
        assert session.phase == "planned", left
        _step(session, step)
        step += 1
    assert session.phase == "stock (safety net)"
    assert controller.requests[-1] is RESET
    assert sum("clocks reverted to stock" in line for line in lines) == 1

    # reverted ranks keep joining the replicas' exchange (else the other replicas would hang in it)
    before, requests = comms.paces, len(controller.requests)
    _step(session, step)
    assert comms.paces == before + 1
    assert len(controller.requests) == requests  # no more plan clocks
    assert session.phase == "stock (safety net)"


@pytest.mark.slow
def test_a_trip_without_clock_control_says_the_slowdown_came_from_outside_the_plan(tmp_path):
    session, timer, _, _, lines = _session(tmp_path, data_parallel_size=1, can_set_clocks=False)
    step = 0
    while session.phase == "profiling":  # the stock clock only: the others are modelled
        _step(session, step)
        step += 1
    assert session.phase == "planned"
    timer.slowdown = 1.5
    for _ in range(SAFETY_STEPS):
        _step(session, step)
        step += 1
    assert session.phase == "stock (safety net)"
    (tripped,) = [line for line in lines if "consecutive steps" in line]
    assert "no clock had been set, so the slowdown came from outside the plan" in tripped
    assert "clocks reverted" not in tripped


@pytest.mark.slow
def test_a_slowdown_from_outside_reverts_then_the_plan_runs_again_once_stock_steps_recover(tmp_path):
    session, timer, _, controller, lines = _session(tmp_path, data_parallel_size=1)
    told: list[RunningPoint | None] = []
    session.state.follow(SimpleNamespace(follow=told.append))  # a plan follower (the collective runner)
    step = _profile_and_plan(session)
    adopted = session.state.running
    assert told == [None, adopted] and adopted is not None and adopted.index == session.plan.target_index
    timer.slowdown = 1.5  # every clock alike: a slowdown from outside the job
    phases = []
    for _ in range(SAFETY_STEPS + 1 + SAFETY_STEPS):  # the trip, then stock steps just as slow
        _step(session, step)
        phases.append(session.phase)
        step += 1
    assert phases[SAFETY_STEPS - 1 :] == ["stock (safety net)"] * (SAFETY_STEPS + 2)
    assert told == [None, adopted, None]  # the revert is told
    (tripped,) = [line for line in lines if "consecutive steps" in line]
    assert "clocks reverted to stock, until stock steps show the slowdown is not the plan's" in tripped
    timer.slowdown = 1.0
    for _ in range(SAFETY_STEPS):
        _step(session, step)
        step += 1
    assert session.phase == "planned" and session.runner is not None
    assert sum("the plan runs again (1 more re-arm(s) left)" in line for line in lines) == 1
    assert told == [None, adopted, None, adopted]  # and so is the re-arm
    requests = len(controller.requests)
    _step(session, step)
    assert len(controller.requests) > requests  # the plan's clocks are requested again


@pytest.mark.slow
def test_plan_followers_are_told_the_point_a_straggler_selects_and_the_recovery(tmp_path):
    session, _, comms, _, lines = _session(tmp_path)
    told: list[RunningPoint | None] = []
    session.state.follow(SimpleNamespace(follow=told.append))
    step = _profile_and_plan(session)
    target = session.plan.target_index
    comms.peer_s = 1.25 * session.run_guard.straggler.nominal_time_s  # the other replica is slow
    for _ in range(3):
        _step(session, step)
        step += 1
    assert session.phase == "following straggler"
    assert [None if running is None else running.index for running in told] == [None, target, target + 1]
    assert told[-1] == session.state.running and told[-1].plan is session.plan
    comms.peer_s = None  # it keeps this replica's pace again
    for _ in range(3):
        _step(session, step)
        step += 1
    assert session.phase == "planned" and told[-1].index == target and len(told) == 4
    assert sum("moving to the frontier point" in line for line in lines) == 1


@pytest.mark.slow
def test_a_plan_that_was_slow_itself_stays_reverted(tmp_path):
    session, timer, _, _, lines = _session(tmp_path, data_parallel_size=1)
    step = _profile_and_plan(session)
    timer.slowdown = 1.5
    for _ in range(SAFETY_STEPS):
        _step(session, step)
        step += 1
    timer.slowdown = 1.0  # stock clocks run at their pace at once: the plan was to blame
    for _ in range(4 * SAFETY_STEPS):
        _step(session, step)
        step += 1
    assert session.phase == "stock (safety net)" and session.runner is None
    assert not any("runs again" in line for line in lines)


@pytest.mark.slow
def test_the_session_counts_its_host_time_in_run_phase_steps_only_and_reports_it_at_close(tmp_path):
    session, _, _, _, lines = _session(tmp_path, data_parallel_size=1)
    step = _profile_and_plan(session)
    assert session.host_cost.run_steps_s == []  # profiling steps synchronise on purpose: not counted
    for _ in range(3):
        _step(session, step)
        step += 1
    assert len(session.host_cost.run_steps_s) == 3
    assert all(seconds > 0 for seconds in session.host_cost.run_steps_s)
    session.close()
    assert sum("rank 0: plugin host time on the training thread" in line for line in lines) == 1


@pytest.mark.slow
def test_a_single_replica_job_reverts_on_its_own_slowness(tmp_path):
    session, timer, comms, _, lines = _session(tmp_path, data_parallel_size=1)
    step = _profile_and_plan(session)
    timer.slowdown = 1.5
    for _ in range(SAFETY_STEPS):
        _step(session, step)
        step += 1
    assert session.phase == "stock (safety net)"  # no verdict to wait for: it trips on its own steps
    assert comms.started == []  # one rank: every group is of one rank, and no straggler exchange
    assert sum("clocks reverted to stock" in line for line in lines) == 1


@pytest.mark.slow
def test_without_clock_control_only_the_stock_clock_is_measured_and_the_rest_is_modelled(tmp_path):
    session, _, _, controller, lines = _session(tmp_path, data_parallel_size=1, can_set_clocks=False)
    step = 0
    while session.phase == "profiling":
        _step(session, step)
        step += 1
    assert step == session.collector.steps_needed == 1 + 4 + 1  # settling, baseline pilot, one synchronous
    assert set(controller.requests[:step]) == {1980}
    assert session.profile_source == "modelled"
    session.close()  # the plan and its profile are cached by then (a writer thread writes them)
    profile = Profile.from_csv(session.cache.folder / "profile.csv", gpu_name="h100-sxm", source="modelled")
    clocks = {option.clock_mhz for key in profile for option in profile.options(key)}
    assert clocks == {1980, 1500}
    assert any("modelled from a modelled profile" in line for line in lines)


def test_extrapolated_rows_keep_the_stock_time_and_slow_down_at_lower_clocks():
    spec = load_gpu_spec("h100-sxm")
    stock = ProfileRow(work=Work(1, 0, "backward"), clock_mhz=1980, time_s=0.02, energy_j=9.0, samples=3)
    rows = {row.clock_mhz: row for row in extrapolate_rows([stock], spec, [1980, 1500, 1005])}
    assert set(rows) == {1980, 1500, 1005}
    assert rows[1980].time_s == pytest.approx(0.02, rel=1e-9)
    assert rows[1980].energy_j == pytest.approx(
        9.0, rel=1e-9
    )  # anchored: the measured energy, not the model's
    assert rows[1980].time_s <= rows[1500].time_s <= rows[1005].time_s
    assert rows[1005].energy_j < rows[1980].energy_j
    assert rows[1005].time_s > rows[1980].time_s
    assert all((row.work, row.samples) == (Work(1, 0, "backward"), 3) for row in rows.values())


# ---------------------------------------------------------------------------------- the simulated timer


def _simulated_step(timer: SimulatedTimer, session_laps: bool) -> StepTiming:
    """One single-stage step: wait for the device when the session laps at the start, then F and B."""
    if session_laps:
        timer.wait_for_device()
    timer.step_begin()
    for kind in ("forward", "backward"):
        instruction = Instruction(0, 0, 0, kind)
        timer.begin(instruction)
        timer.end(instruction)
    (timing,) = timer.finish_step()
    return timing


@pytest.mark.parametrize("session_laps", [True, False])
def test_the_simulated_timer_runs_the_work_between_schedules_once_and_times_the_whole_iteration(
    tmp_path, session_laps
):
    spec = load_gpu_spec("h100-sxm")
    between = WorkProfile(compute_s=0.002, memory_s=0.008)
    emulation = Emulation(between_steps=between, idle_between_steps_s=0.005)
    gpus = SimulatedGPUs(spec, state_path=tmp_path / "gpus.json", emulation=emulation)
    work = {Work(0, 0, "forward"): WorkProfile(0.01, 0.0), Work(0, 0, "backward"): WorkProfile(0.02, 0.0)}
    timer = SimulatedTimer(gpus, 0, work, LocalComms(), PipelineDag.build(pipeline_orders(1, 1)))
    model = GpuPowerModel(spec)
    clock = spec.default_sm_clock_mhz
    outside_s = model.time_s(between, clock) + 0.005
    outside_j = model.energy_j(between, clock) + 0.005 * spec.idle_power_w
    for _ in range(2):
        before_j = gpus.state(0).energy_mj / 1000
        timing = _simulated_step(timer, session_laps)
        pipeline_s = sum(model.time_s(profile, clock) for profile in work.values())
        assert timing.intrinsic_s == pytest.approx(pipeline_s)
        assert timing.cycle_s == pytest.approx(timing.intrinsic_s + outside_s)
        assert timing.outside_s == pytest.approx(outside_s)
        assert timing.outside_energy_j == pytest.approx(outside_j)
        assert timing.energy_j + timing.outside_energy_j == pytest.approx(
            gpus.state(0).energy_mj / 1000 - before_j
        )
    # a real GPU's view: no energy from the timer, only the counter knows
    hidden = SimulatedGPUs(
        spec,
        state_path=tmp_path / "hidden.json",
        emulation=dataclasses.replace(emulation, exact_energy=False),
    )
    timer = SimulatedTimer(hidden, 0, work, LocalComms(), PipelineDag.build(pipeline_orders(1, 1)))
    timing = _simulated_step(timer, session_laps)
    assert timing.energy_j is None and timing.outside_energy_j is None
    assert all(sample.energy_j is None for sample in timing.samples)
    assert timing.outside_s == pytest.approx(outside_s)


@pytest.mark.slow
def test_the_run_ends_with_the_stock_plan_against_the_measured_stock_steps(tmp_path):
    session, _, _, _, lines = _session(tmp_path, data_parallel_size=1)
    _profile_and_plan(session)
    session.close()
    (line,) = [line for line in lines if line.startswith("[energy] model vs measured at stock clocks")]
    # the simulated timer's stock steps are modelled too: nothing to check the model against
    assert "not checked on simulated GPUs" in line and "modelled vs" not in line
