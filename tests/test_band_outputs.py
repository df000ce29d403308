"""Every printed modelled saving carries its band, in one notation; measured changes keep their interval.

The band notation is ``-5.90 % (-4.80 to -6.70 %, modelled)``: the change, then the band's ends (the one
nearer zero first), then the word modelled. A measured change is ``-12.1 % ± 0.8 % (measured, 95 % CI, ..)``
and never takes the band. Each output below is rendered as a user sees it and read like a grep would.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from megatron_energy.cli import main
from megatron_energy.commands import plan_command
from megatron_energy.commands.latency_sweep import EXAMPLES
from megatron_energy.commands.optimiser_comparison import MODES
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.optimisers.saving_band import with_saving_band
from megatron_energy.plan import Plan
from megatron_energy.plan_band import SavingBand
from megatron_energy.plan_file import load_plan, plan_text
from megatron_energy.plan_outcome import band_ends, plan_saving, run_band, saving_text
from megatron_energy.report.demo_summary import DemoSummary, JobFigures, summary_table
from megatron_energy.report.job_report import plan_table
from megatron_energy.runtime.energy_log.energy_line import (
    EnergyRecord,
    JobInterval,
    StockSamples,
    format_energy_line,
)
from megatron_energy.runtime.planning_round.planning import plan_summary
from tests.banded_plans import SPEC, small_job, small_profile

pytestmark = pytest.mark.slow  # plans and simulates every mode (the module's plan alone takes seconds)

BAND = re.compile(r"\(([+-]\d+\.\d+) to ([+-]\d+\.\d+) %, modelled\)")
"""A band after a change (or after the change's statistical interval)."""
BARE = re.compile(r"[+-]\d+\.\d+ % \(modelled\)")
"""The old notation: a modelled change without a band."""


@pytest.fixture(scope="module")
def plan() -> Plan:
    job = small_job()
    return with_saving_band(PerseusOptimiser().plan(small_profile(), job), small_profile(), job)


def _text(renderable: Table | str) -> str:
    out = io.StringIO()
    Console(file=out, width=250).print(renderable)
    return out.getvalue()


def _bands(text: str) -> list[tuple[float, float]]:
    assert not BARE.search(text), text
    return [(float(a), float(b)) for a, b in BAND.findall(text)]


def test_the_notation_puts_the_end_nearer_zero_first():
    assert band_ends(SavingBand(-0.067, -0.048, ("x",))) == "(-4.80 to -6.70 %, modelled)"
    assert band_ends(SavingBand(0.01, 0.02, ())) == "(+1.00 to +2.00 %, modelled)"
    assert "no band" in band_ends(None)


def test_the_plan_line_and_the_report_give_the_band(plan):
    band = plan.saving_band
    expected = (round(100 * band.high, 2), round(100 * band.low, 2))
    assert _bands(plan_summary(plan, plan_text(plan))) == [expected]
    assert _bands(_text(plan_table(plan))) == [expected]
    assert saving_text(plan).startswith(f"{100 * plan_saving(plan):+.2f} % (")


def test_simulate_compare_gives_every_mode_its_band_against_stock_and_perseus(capsys):
    argv = ["simulate", "--compare", "--config", str(EXAMPLES / "gpt3-xl-pp4-h100.yaml"), "--points", "8"]
    assert main([*argv, "--trials", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cells = {
        row[0]: row[8:10]
        for line in lines
        if line.startswith("│ ")
        and (row := [cell.strip() for cell in line.strip("│").split("│")])[0] in MODES
    }
    assert cells["stock"][0] == "no change" and cells["perseus"][1] == "no change"
    banded = [cells["stock"][1], cells["perseus"][0], *cells["kareus"], *cells["all"]]
    assert all(len(_bands(cell)) == 1 for cell in banded), cells
    low, high = _bands(cells["perseus"][0])[0]
    assert low > float(cells["perseus"][0].split(" %")[0]) > high  # the saving lies in its band
    (versus,) = [line for line in lines if line.startswith("all vs perseus: energy ")]
    assert len(_bands(versus)) == 1


def test_the_demo_table_gives_the_run_and_the_prediction_their_bands(plan):
    stock = JobFigures((0.100, 0.101, 0.099), (100.0, 101.0, 99.0))
    planned = JobFigures((0.100, 0.100, 0.101), (90.0, 90.5, 89.5))
    settling = EnergyRecord(
        23, "planned", "modelled", {"energy/iteration_s": 0.2, "energy/j_per_iter_total": 95.0}
    )
    text = _text(summary_table(DemoSummary(stock, planned, settling, plan, "modelled"), "demo", 4))
    (run_row,) = [line for line in text.splitlines() if "energy per iteration, 4 GPUs, run" in line]
    assert "(modelled, 95 % CI, n=3 vs 3)" in run_row  # the statistical interval, in its own notation
    (run_band,) = _bands(run_row)
    width = plan.saving_band.high - plan.saving_band.low
    assert abs(run_band[1] - run_band[0]) == pytest.approx(100 * width, abs=0.11)
    assert run_band[0] >= -10.0 >= run_band[1]  # around the run's own -10.0 %
    assert len(_bands(text)) == 2
    measured = _text(summary_table(DemoSummary(stock, planned, settling, plan, "measured"), "demo", 4))
    (run_row,) = [line for line in measured.splitlines() if "energy per iteration, 4 GPUs, run" in line]
    assert "(measured, 95 % CI" in run_row and not BAND.search(run_row)


def _energy_line(source: str, band: SavingBand | None) -> str:
    job = JobInterval((45.0, 45.0), 90.0, 0.1, (90.0, 90.2, 89.8, 90.1), (0.1,) * 4, 2)
    stock = StockSamples((100.0, 100.3, 99.7, 100.1), (0.1,) * 4)
    line, _ = format_energy_line(32, job, source, "planned", stock, band=band)  # type: ignore[arg-type]
    return line


def test_the_energy_line_bands_a_modelled_change_and_never_a_measured_one(plan):
    band = run_band(plan, 0.0)  # the band around zero, as the session hands it to the log
    modelled = _energy_line("modelled", band)
    assert "(modelled, 95 % CI" in modelled and len(_bands(modelled)) == 1
    measured = _energy_line("measured", band)
    assert "(measured, 95 % CI" in measured and not BAND.search(measured)
    assert not BAND.search(_energy_line("modelled", None))


def test_the_plan_command_prints_the_band(tmp_path, capsys):
    csv = tmp_path / "profile.csv"
    csv.write_text(small_profile().to_csv_text())
    argv = ["--profile", str(csv), "--stages", "4", "--microbatches", "8", "--gpu-spec", SPEC.name]
    argv += ["--points", "12", "--out", str(tmp_path / "plan.json")]
    parser = plan_command.argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    assert args.func(args) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "energy per iteration" in line]
    assert len(_bands(row)) == 1
    assert load_plan(tmp_path / "plan.json").saving_band is not None


def test_the_readmes_modelled_savings_have_their_bands():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## What to expect", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ")]
    figures = [row[1] for row in rows if len(row) > 2 and row[2] == "**modelled**"]
    assert len(figures) >= 2
    for figure in figures:
        savings = re.findall(r"[+-]?\d+\.\d+ %( \([^)]*\))?", figure)
        assert savings and all(BAND.fullmatch(band.strip()) for band in savings), figure
