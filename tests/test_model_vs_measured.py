"""Model vs measured at stock clocks: the stock plan's prediction against the measured stock steps."""

import json

import pytest
from rich.console import Console

from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.plan import Baseline, Boundary, ClockAction, Plan, PlanPoint, RankPlan
from megatron_energy.report.demo_summary import DemoSummary, JobFigures, summary_table
from megatron_energy.report.model_vs_measured import model_vs_measured_lines
from megatron_energy.runtime.energy_log.energy_line import EnergyRecord, append_record
from megatron_energy.runtime.energy_log.stock_check import compare_stock, comparison_line, comparison_lines
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline


def two_stage_plan(stage_energy_j=(600.0, 500.0), time_s=1.70) -> Plan:
    ranks = tuple(
        RankPlan((ClockAction(Boundary(Instruction(stage, 0, 0, "forward")), 1980),), energy_j=e, busy_s=1.0)
        for stage, e in enumerate(stage_energy_j)
    )
    point = PlanPoint("iso-time", time_s, time_s, sum(stage_energy_j) - 1.0, ranks)
    return Plan(
        fingerprint="f" * 16,
        gpu_name="h200",
        provenance="modelled",
        target="iso-time",
        optimisers=("perseus",),
        switch_latency_s=0.01,
        baseline=Baseline(time_s, sum(stage_energy_j), tuple(stage_energy_j)),
        points=(point,),
        target_index=0,
    )


def baseline(**changes) -> StockBaseline:
    """Two stages, two data-parallel replicas: ranks 0, 1 on stage 0 and 2, 3 on stage 1."""
    fields = dict(
        iteration_s=1.68,
        energy_by_rank={0: 590.0, 1: 610.0, 2: 515.0, 3: 505.0},
        step_iteration_s=(1.66, 1.70, 1.68, 1.68),
        step_energy_j=(2210.0, 2230.0, 2220.0, 2220.0),
        stage_by_rank={0: 0, 1: 0, 2: 1, 3: 1},
        source="measured",
    )
    return StockBaseline(**(fields | changes))


def test_per_stage_and_total_errors_against_the_stage_means():
    comparison = compare_stock(two_stage_plan(), baseline())
    figures = {figure.name: figure for figure in comparison.figures}
    assert list(figures) == ["iteration time", "energy, all stages", "energy, stage 0", "energy, stage 1"]
    assert figures["energy, stage 0"].measured == pytest.approx(600.0)  # mean of the stage's two GPUs
    assert figures["energy, stage 1"].error == pytest.approx(500.0 / 510.0 - 1)
    assert figures["energy, all stages"].measured == pytest.approx(1110.0)
    assert figures["iteration time"].error == pytest.approx(1.70 / 1.68 - 1)
    assert figures["iteration time"].within_target  # +1.2 % inside 3 %
    assert figures["energy, all stages"].within_target and figures["energy, stage 1"].within_target
    assert figures["iteration time"].halfwidth == pytest.approx(0.0150, abs=0.002)  # t(3)·s/√4 over the mean
    line = comparison_line(comparison)
    assert line.startswith("[energy] model vs measured at stock clocks (4 stock steps): iteration time ")
    assert "1700.0 ms modelled vs 1680.0 ms measured" in line
    assert "energy, stage 1 500.0 J modelled vs 510.0 J measured: -1.96 % (within the ±2 % target)" in line


def test_a_miss_says_outside_and_simulated_gpus_check_nothing_against_the_model():
    line = comparison_line(compare_stock(two_stage_plan(time_s=1.80), baseline()))
    assert "1800.0 ms modelled vs 1680.0 ms measured" in line and "(OUTSIDE the ±3 % target)" in line
    simulated = compare_stock(two_stage_plan(time_s=1.80), baseline(source="modelled"))
    line = comparison_line(simulated)
    assert line.startswith("[energy] model vs measured at stock clocks: not checked on simulated GPUs")
    assert "ms modelled vs" not in line and "target" not in line
    assert comparison_lines(simulated) == [line.removeprefix("[energy] ")]


def test_an_old_baseline_without_stages_compares_the_total_or_nothing():
    one_gpu_per_stage = baseline(energy_by_rank={0: 600.0, 1: 510.0}, stage_by_rank={})
    names = [figure.name for figure in compare_stock(two_stage_plan(), one_gpu_per_stage).figures]
    assert names == ["iteration time", "energy, all stages"]
    names = [figure.name for figure in compare_stock(two_stage_plan(), baseline(stage_by_rank={})).figures]
    assert names == ["iteration time"]  # four GPUs, stages unknown: no energy to set against the plan's
    assert compare_stock(two_stage_plan(), StockBaseline()) is None


def record(
    iteration: int,
    phase: str,
    change: float,
    low: float,
    high: float,
    resolved: bool,
    source: str = "measured",
) -> EnergyRecord:
    scalars = {"energy/j_per_iter_total": 1000.0, "energy/iteration_s": 1.7, "energy/window_iterations": 12.0}
    for prefix in ("energy/change_vs_stock", "energy/iteration_change_vs_stock"):
        scalars |= {
            prefix: change,
            f"{prefix}_low": low,
            f"{prefix}_high": high,
            f"{prefix}_resolved": float(resolved),
        }
    return EnergyRecord(iteration, phase, source, scalars)


def test_the_report_section_states_the_stock_check_and_the_logged_savings(tmp_path):
    (tmp_path / "baseline.json").write_text(baseline().to_json())
    log = tmp_path / "log.jsonl"
    append_record(log, record(30, "planned", -0.12, -0.14, -0.10, True))
    append_record(log, record(40, "stock (safety net)", 0.0, -0.01, 0.01, False))  # not the plan's window
    lines = model_vs_measured_lines(tmp_path, two_stage_plan(), log)
    assert lines[0].startswith("model vs measured at stock clocks (the stock plan simulated from the")
    assert "measured over 4 stock steps" in lines[0]
    assert any("energy, stage 0 600.0 J modelled vs 600.0 J measured" in line for line in lines)
    savings = lines[lines.index(next(line for line in lines if line.startswith("measured savings"))) :]
    assert "iteration 30, last window of 12 planned iterations, 95 % CI" in savings[0]
    assert savings[1] == "  energy per iteration: -12.0 % (saving; 95 % CI -14.0 % to -10.0 %, measured)"
    # a dry run's window reads within noise
    append_record(log, record(50, "planned (clocks not set)", 0.004, -0.011, 0.019, False))
    lines = model_vs_measured_lines(tmp_path, two_stage_plan(), log)
    assert "  energy per iteration: within noise (±1.5 %, measured)" in lines
    # identical figures (simulated GPUs) read no change, not a zero-width noise band
    append_record(log, record(55, "planned", 0.0, 0.0, 0.0, False))
    assert "  energy per iteration: no change (measured)" in model_vs_measured_lines(
        tmp_path, two_stage_plan(), log
    )
    # a dry run disturbed from outside: resolved, but not called a saving or a slowdown
    append_record(log, record(60, "planned (clocks not set)", 0.078, 0.011, 0.145, True))
    lines = model_vs_measured_lines(tmp_path, two_stage_plan(), log)
    outside = "+7.8 % (no clock was set: a change from outside the plan; 95 % CI +1.1 % to +14.5 %, measured)"
    assert f"  iteration time: {outside}" in lines and not any("slower" in line for line in lines)
    # without the log the report says how to get the savings
    assert "pass --log-file FILE" in model_vs_measured_lines(tmp_path, two_stage_plan(), None)[-1]


def test_savings_on_simulated_gpus_are_headed_modelled(tmp_path):
    (tmp_path / "baseline.json").write_text(baseline(source="modelled").to_json())
    log = tmp_path / "log.jsonl"
    append_record(log, record(30, "planned", -0.12, -0.14, -0.10, True, source="modelled"))
    lines = model_vs_measured_lines(tmp_path, two_stage_plan(), log)
    assert not any("measured savings" in line for line in lines)
    assert any(line.startswith("modelled savings against stock clocks (iteration 30") for line in lines)
    no_log = model_vs_measured_lines(tmp_path, two_stage_plan(), None)[-1]
    assert no_log.startswith("savings against stock clocks: not shown")


def test_baseline_json_round_trips_stages_and_source():
    loaded = StockBaseline.from_json(baseline(source="modelled").to_json())
    assert loaded.stage_by_rank == {0: 0, 1: 0, 2: 1, 3: 1} and loaded.source == "modelled"
    old = json.loads(baseline().to_json())
    del old["stage_by_rank"], old["source"]
    assert StockBaseline.from_json(json.dumps(old)).stage_by_rank == {}


def test_the_stock_plan_against_megatrons_own_log_of_the_stock_iterations():
    from megatron_log_check import megatron_stock_lines

    def megatron(i: int, ms: float, joules: float) -> str:
        return f" [t] iteration {i:8d}/{12:8d} | elapsed time per iteration (ms): {ms:.1f} | energy per GPU (J/iter/GPU): {joules:.1f} |"  # noqa: E501

    output = [megatron(1, 2800.0, 1200.0)]  # warm-up, left out
    output += [megatron(i, 1600.0 + (i % 2) * 20, 550.0 + (i % 2) * 10) for i in range(2, 11)]
    output += [megatron(11, 9999.0, 9999.0), megatron(12, 9999.0, 9999.0)]  # planned: not stock
    phases = ["profiling"] * 10 + ["planned"] * 2
    output += [f"[energy] iteration {i} | {phase} (clocks not set) | x" for i, phase in enumerate(phases, 1)]
    lines = megatron_stock_lines("\n".join(output), two_stage_plan(time_s=1.62), settle=1)
    assert lines[0].startswith("stock plan vs Megatron's own log (measured by Megatron's timer")
    assert "mean of 9 stock iterations 2-10; energy per GPU x 2 stage(s)" in lines[0]
    assert lines[1].startswith("  iteration time 1620.0 ms modelled vs 1608.9 ms measured (±")
    assert "energy, all stages 1100.0 J modelled vs 1108.9 J measured" in lines[2]  # 2 x 554.4 J per GPU
    assert "within the ±2 % target" in lines[2]
    assert "0 stock iteration(s)" in megatron_stock_lines("no log", two_stage_plan())[0]


def test_the_demo_table_says_no_change_where_plan_and_stock_predict_the_same_figure():
    plan = two_stage_plan()  # its target point predicts the stock time and energy
    figures = JobFigures((1.7, 1.7, 1.7), (1100.0, 1100.0, 1100.0))
    settling = EnergyRecord(1, "planned", "modelled", {})
    table = summary_table(DemoSummary(figures, figures, settling, plan, "modelled"), "stock vs plan", 2)
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert text.count("no change (modelled)") == 2 and text.count("no change") == 4  # run rows too
    assert "±0.00" not in text and "+0.00 %" not in text
