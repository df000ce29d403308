"""`megatron-energy demo`, the README's main job without GPUs, through the command line and the launcher path.

The session's one demo run (``demo_run``: PP=2 of GPT-3 1.3B stage work on simulated H100s, 4 microbatches,
a 2-clock grid with two measured iterations per clock, 3 iterations with the plan, ``--energy-mode all``) and
the tests read what it printed and wrote.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest
from demo_run import PIPELINE_SIZE, RUN_ITERS, DemoRun

from megatron_energy.cli import main
from megatron_energy.commands.comparison_output import all_vs_perseus_line, modes_table
from megatron_energy.commands.optimiser_comparison import MODES, compare_job_folder
from megatron_energy.demo_model import TRAINING_SCRIPT
from megatron_energy.plan import CollectiveAction
from megatron_energy.plan_file import load_plan
from megatron_energy.plan_outcome import band_ends, change_text, plan_saving, run_band, saving_text
from megatron_energy.runtime.energy_log.energy_line import read_records
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.stats import relative_change

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

# stock: settling, a 4-iteration baseline pilot, 2 synchronous steps; the next clock (1230 MHz): 1 + 2
PROFILING_ITERS = (1 + 4 + 2) + (1 + 2)
TRAIN_ITERS = PROFILING_ITERS + RUN_ITERS
MEGATRON_LINE = re.compile(
    r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration +(\d+)/ +(\d+) \| consumed samples: +\d+ \| "
    r"elapsed time per iteration \(ms, CPU stand-in, measured\): \d+\.\d \|"
)
ENERGY_LINE = re.compile(r"^\[energy\] iteration (\d+) \| ([^|]+) \| J/iter modelled: ")


def test_the_demo_runs_the_launcher_command_a_gpu_job_runs(demo: DemoRun) -> None:
    assert demo.status == 0, demo.out[-3000:]
    (command,) = [line for line in demo.lines if line.startswith("launcher command: ")]
    assert f"-m torch.distributed.run --nnodes 1 --nproc-per-node {PIPELINE_SIZE}" in command
    assert (
        f"-m megatron_energy.launch {TRAINING_SCRIPT} --pipeline-model-parallel-size {PIPELINE_SIZE}"
        in command
    )
    assert "--num-layers 24 --hidden-size 2048" in command  # GPT-3 1.3B, whose stage work is timed
    assert (
        "--energy-optimise --energy-mode all --energy-backend simulated --energy-gpu-spec h100-sxm" in command
    )
    assert f"--train-iters {TRAIN_ITERS}" in command


def test_the_ranks_log_like_megatron_one_based_with_timestamps(demo: DemoRun) -> None:
    megatron = [MEGATRON_LINE.match(line) for line in demo.lines]
    assert [(int(m[1]), int(m[2])) for m in megatron if m] == [
        (i, TRAIN_ITERS) for i in range(1, TRAIN_ITERS + 1)
    ]
    energy = [ENERGY_LINE.match(line) for line in demo.lines]
    phases = [(int(m[1]), m[2]) for m in energy if m]
    expected = [(i, "profiling") for i in range(1, PROFILING_ITERS + 1)]
    expected += [(i, "planned") for i in range(PROFILING_ITERS + 1, TRAIN_ITERS + 1)]
    assert phases == expected
    compared = [int(m[1]) for m, line in zip(energy, demo.lines, strict=True) if m and "vs stock" in line]
    # not while profiling, and not the plan's settling iteration alone: the planned iterations after it
    assert compared == list(range(PROFILING_ITERS + 2, TRAIN_ITERS + 1))


def test_cpu_noise_stays_out_and_megatrons_arguments_go_to_the_log(demo: DemoRun) -> None:
    assert "Apex" not in demo.out and "Transformer Engine" not in demo.out  # a CPU run's "not installed"
    assert "end of arguments" not in demo.out
    ranks_log = demo.energy_dir / "demo" / "ranks.log"
    assert f"(Megatron's arguments: in {ranks_log})" in demo.lines
    log = ranks_log.read_text()
    assert "-------------------- end of arguments ---------------------" in log
    assert re.search(rf"^  pipeline_model_parallel_size \.+ {PIPELINE_SIZE}$", log, flags=re.MULTILINE)


def test_one_summary_table_with_the_figures_of_the_run_and_of_the_plan_file(demo: DemoRun) -> None:
    assert demo.out.count("┃ stock clocks ┃") == 1
    plan = load_plan(demo.job / "plan.json", expected_fingerprint=demo.job.name)
    target, predicted_stock = plan.target_point, plan.baseline

    def row(label: str) -> list[str]:
        (line,) = [line for line in demo.lines if line.startswith(f"│ {label} ")]
        return [cell.strip() for cell in line.strip("│").split("│")]

    prediction = row(f"energy per iteration, {PIPELINE_SIZE} GPUs, plan file's prediction (modelled)")
    saving = target.energy_j / predicted_stock.energy_j - 1
    assert plan.saving_band is not None and plan.saving_band.holds(saving)
    assert prediction[1:] == [
        f"{predicted_stock.energy_j:.1f} J",
        f"{target.energy_j:.1f} J",
        f"{100 * saving:+.2f} % {band_ends(plan.saving_band)}",
    ]
    time_row = row("iteration time, plan file's prediction (modelled)")
    assert time_row[1:3] == [
        f"{1e3 * predicted_stock.iteration_time_s:.1f} ms",
        f"{1e3 * target.iteration_time_s:.1f} ms",
    ]

    # the run's figures: stock steps measured while profiling, planned iterations less the settling one
    baseline = StockBaseline.from_json((demo.job / "baseline.json").read_text())
    assert len(baseline.step_energy_j) == 4  # the stock baseline's pilot: exact energies need no more
    records = [r for r in read_records(demo.energy_dir / "demo" / "energy_log.jsonl") if r.phase == "planned"]
    assert [r.iteration for r in records] == list(range(PROFILING_ITERS + 1, TRAIN_ITERS + 1))
    planned = [r.scalars["energy/j_per_iter_total"] for r in records[1:]]
    planned_j = statistics.mean(planned)
    run = row(f"energy per iteration, {PIPELINE_SIZE} GPUs, run (modelled)")
    run_change = planned_j / statistics.mean(baseline.step_energy_j) - 1
    stated = relative_change(baseline.step_energy_j, planned, source="modelled")
    # a stated change carries the plan's band around it; "too few samples" (this short run) states none
    band = f" {band_ends(run_band(plan, run_change), digits=1)}" if stated.excludes_zero else ""
    assert run[1:] == [
        f"{statistics.mean(baseline.step_energy_j):.1f} J",
        f"{planned_j:.1f} J",
        f"{stated.format()}{band}",
    ]
    settling = f"left out of the run's figures: iteration {PROFILING_ITERS + 1}, the first under the plan"
    assert settling in demo.out
    # the log's last record compares the same iterations with the same stock steps, with its interval
    change = relative_change(baseline.step_energy_j, planned, source="modelled")
    last = records[-1].scalars
    assert last["energy/change_vs_stock"] == pytest.approx(change.change)
    assert (last["energy/change_vs_stock_low"], last["energy/change_vs_stock_high"]) == pytest.approx(
        (change.low, change.high)
    )
    assert last["energy/change_vs_stock_resolved"] == float(change.excludes_zero)
    assert last["energy/window_iterations"] == len(planned)
    assert "energy/change_vs_stock" not in records[0].scalars  # the settling iteration alone: no window

    # what ran is what the plan file predicted: the stock run is the plan's baseline, the plan its target
    assert statistics.mean(baseline.step_energy_j) == pytest.approx(predicted_stock.energy_j, rel=0.005)
    assert planned_j == pytest.approx(target.energy_j, rel=0.01)
    assert planned_j < statistics.mean(baseline.step_energy_j)


def test_all_mode_prints_perseus_kareus_and_both_planned_from_the_measured_profile(demo: DemoRun) -> None:
    plan = load_plan(demo.job / "plan.json", expected_fingerprint=demo.job.name)
    # the pipeline's p2p, if Kareus schedules it, at NCCL's budget: the demo job's own setting
    for rank in plan.target_point.ranks:
        actions = [a for a in rank.actions if isinstance(a, CollectiveAction)]
        assert all((str(a.collective), a.max_ctas) == ("pp.send_recv", None) for a in actions)
    (plan_line,) = [line for line in demo.lines if line.startswith("[energy] plan for iso-time")]
    assert all(note in plan_line for note in plan.notes)  # what `all` left out, and why
    assert not any("collective actions are not applied" in line for line in demo.lines)
    start = demo.lines.index(
        "Perseus only vs Kareus only vs both (--energy-mode all), each planned again from the profile this "
        "run measured on simulated GPUs with the job's own collective settings: every figure modelled"
    )
    printed = demo.lines[start:]
    comparison = compare_job_folder(demo.job, f"gpt3-1.3b on {PIPELINE_SIZE} simulated h100-sxm")
    assert printed[1].strip() == modes_table(comparison).title
    for mode in MODES:
        result = comparison.row(mode)
        line = next(line for line in printed if line.startswith(f"│ {mode} "))  # the modes table comes first
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        assert cells[2:6] == [
            f"{result.iteration_time_s:.4f}",
            f"{result.total_energy_j:,.1f}",
            f"{result.static_j:,.1f}",
            f"{result.dynamic_j:,.1f}",
        ]
    assert all_vs_perseus_line(comparison) in demo.lines
    assert "static / dynamic energy per stage GPU (modelled, J)" in printed


def test_all_in_the_demo_is_its_plan_file_no_slower_than_stock_and_no_costlier_than_perseus_alone(
    demo: DemoRun,
) -> None:
    """Issue 33: the demo's ``all`` plan predicted +1.54 % time and more energy than Perseus alone."""
    plan = load_plan(demo.job / "plan.json", expected_fingerprint=demo.job.name)
    comparison = compare_job_folder(demo.job, "demo")
    both, perseus = comparison.row("all"), comparison.row("perseus")
    target = plan.target_point
    # the comparison's row is the plan file's (latency-aware) prediction, figure for figure
    assert both.iteration_time_s == pytest.approx(target.iteration_time_s, rel=1e-12)
    assert both.total_energy_j == pytest.approx(target.energy_j, rel=1e-12)
    assert target.iteration_time_s <= plan.baseline.iteration_time_s * (1 + 1e-9)  # iso-time, switches paid
    assert target.energy_j <= perseus.total_energy_j * (1 + 1e-12)
    for row in comparison.rows:
        assert row.iteration_time_s <= row.deadline_s * (1 + 1e-9), row.mode


def test_one_saving_in_the_plan_line_the_summary_the_comparison_and_the_report(
    demo: DemoRun, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 33: one output gave -12.0 %, -11.76 % and -15.94 % for the same plan; issue 41: with its band."""
    plan = load_plan(demo.job / "plan.json", expected_fingerprint=demo.job.name)
    assert re.fullmatch(r"-\d+\.\d\d %", change_text(plan_saving(plan)))
    saving = saving_text(plan)
    assert re.fullmatch(r"-\d+\.\d\d % \([+-]\d+\.\d\d to [+-]\d+\.\d\d %, modelled\)", saving)
    (plan_line,) = [line for line in demo.lines if line.startswith("[energy] plan for ")]
    assert f"({saving} vs stock)" in plan_line
    (summary,) = [line for line in demo.lines if "energy per iteration" in line and "plan file's" in line]
    assert summary.strip("│ ").endswith(saving)
    (compared,) = [line for line in demo.lines if line.startswith("│ all ")]
    assert [cell.strip() for cell in compared.strip("│").split("│")][8] == saving
    assert (
        main(["report", "--energy-dir", str(demo.energy_dir), "--job", demo.job.name, "--out", str(tmp_path)])
        == 0
    )
    (reported,) = [line for line in capsys.readouterr().out.splitlines() if "energy per pipeline" in line]
    assert reported.strip("│ ").endswith(saving)


def test_the_report_files_are_written_and_named_on_one_line_each(demo: DemoRun) -> None:
    frontier = demo.job / "frontier.png"
    timeline = demo.job / "timeline.json"
    assert f"frontier plot (modelled): {frontier}" in demo.lines
    assert f"Perfetto timeline of the plan (modelled; open in ui.perfetto.dev): {timeline}" in demo.lines
    assert frontier.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert timeline.stat().st_size > 0
    (scalars_line,) = [line for line in demo.lines if line.startswith("TensorBoard scalars: ")]
    runs = Path(scalars_line.removeprefix("TensorBoard scalars: "))
    # a folder of this run's own under the demo's TensorBoard runs, so a second run never adds to it
    assert runs.parent == demo.energy_dir / "demo" / "tensorboard" and runs.name.endswith("Z")
    assert any(path.name.startswith("events.out.tfevents") for path in runs.rglob("*"))


def test_an_indivisible_pipeline_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["demo", "--pipeline-model-parallel-size", "5", "--energy-dir", str(tmp_path)])
    assert status == 2
    assert "gpt3-1.3b has 24 layers, which 5 pipeline stages do not divide" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_the_demo_takes_the_launchers_flag_names_and_checks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["demo", "--energy-target", "fast"])
    assert refused.value.code == 2
    assert "is not a target" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--target", "iso-time"])
    assert "unrecognized arguments: --target" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--run-iters", "1"])
    assert "the first iteration under the plan settles" in capsys.readouterr().err


def test_every_demo_option_has_a_line_and_a_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = capsys.readouterr().out
    assert "`" not in text
    options = re.findall(r"^  (--[\w-]+)", text, flags=re.MULTILINE)
    assert "--energy-target" in options and "--model" in options
    blocks = re.split(r"^  (?=--)", text, flags=re.MULTILINE)[1:]
    assert len(blocks) == len(options)
    for block in blocks:
        assert "default: " in " ".join(block.split()), block
    assert "gpt3-1.3b" in text and "llama-70b" in text  # the models it accepts
    assert "h100-sxm" in text and "h200" in text  # the GPU specs it accepts


PLAN_LINE = re.compile(
    r"^\[energy\] plan for iso-time \(([^)]*)\): iteration ([\d.]+) ms vs ([\d.]+) ms at stock"
)


def test_the_composed_plan_predicts_no_slower_an_iteration_than_stock_at_iso_time(demo: DemoRun) -> None:
    (match,) = [m for line in demo.lines if (m := PLAN_LINE.match(line))]
    assert float(match[2]) <= float(match[3])  # the demo's PP=4 `all` plan once predicted 127.6 vs 125.7 ms
    plan = load_plan(demo.job / "plan.json", expected_fingerprint=demo.job.name)
    assert plan.target_point.iteration_time_s <= plan.baseline.iteration_time_s * (1 + 1e-9)
    assert ", ".join(plan.optimisers) == match[1]
