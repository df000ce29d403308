"""`megatron-energy report --csv`: the energy log's iteration records, run totals and power records as CSV."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from megatron_energy.cli import main
from megatron_energy.commands.report import export_csv  # imported here: its import is no test's own time
from megatron_energy.runtime.energy_log.energy_line import EnergyRecord, append_record
from megatron_energy.runtime.energy_log.iteration_swings import IterationSwing
from megatron_energy.runtime.energy_log.power_interval import GpuPowerInterval
from megatron_energy.runtime.energy_log.power_record import PowerRecord
from megatron_energy.runtime.energy_log.run_totals import RunTotals, SavingVsStock


def _log(tmp_path: Path) -> Path:
    path = tmp_path / "energy.jsonl"
    append_record(
        path, EnergyRecord(10, "profiling", "measured", {"energy/j_per_iter_total": 200.0}, "job-a")
    )
    scalars = {
        "energy/j_per_iter_total": 180.0,
        "energy/j_per_iter_stage0": 180.0,
        "energy/change_vs_stock": -0.1,
        "energy/change_vs_stock_high": math.inf,  # an interval without bounds: null in the file
    }
    append_record(
        path, EnergyRecord(20, "planned", "measured", scalars, "job-a", "2026-12-06T11:00:00+00:00")
    )
    saving = SavingVsStock(0.5, 0.4, 0.6, 0.1, True, "measured", 20)
    totals = RunTotals(1, 20, 20, 8, 4.5, "measured", 1000, 4.5, saving, job="job-a", time_utc="t")
    with path.open("a") as handle:
        handle.write(json.dumps(totals.to_json()) + "\n")
        for gpu, swings in ((0, (210.0, 250.0, 230.0)), (1, ())):
            record = PowerRecord(20, 11, "planned", gpu, gpu, _power(swings), "job-a", "t")
            handle.write(json.dumps(record.to_json()) + "\n")
    return path


def _power(swings: tuple[float, ...]) -> GpuPowerInterval:
    """One GPU's interval with an iteration per swing (``()``: none long enough to bin)."""
    iterations = tuple(
        IterationSwing(12 + k, 0.5, 450.0, 450.0 + w / 2, 450.0 - w / 2, w, 900.0, 800.0, 0.4)
        for k, w in enumerate(swings)
    )
    note = "" if swings else "9 iteration(s) without swing figures"
    return GpuPowerInterval(
        "measured", "field 186", 200, 0.05, 0.1, (0.1, 10.0), 455.0, 452.0, 210.0, 690.0, 1980.0, 1755.0,
        iterations, note,
    )  # fmt: skip


def _table(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_the_iterations_and_totals_go_to_a_file_and_its_totals_sibling(tmp_path: Path) -> None:
    out = tmp_path / "run.csv"
    assert main(["report", "--csv", str(out), "--log-file", str(_log(tmp_path))]) == 0
    header, profiling, planned = _table(out.read_text())
    assert header == [
        "iteration",
        "phase",
        "source",
        "job",
        "time_utc",
        "j_per_iter_total",
        "j_per_iter_stage0",
        "change_vs_stock",
        "change_vs_stock_high",
    ]
    assert profiling[:3] == ["10", "profiling", "measured"] and profiling[5:] == ["200.0", "", "", ""]
    assert planned == [
        "20",
        "planned",
        "measured",
        "job-a",
        "2026-12-06T11:00:00+00:00",
        "180.0",
        "180.0",
        "-0.1",
        "",
    ]
    totals_header, run = _table((tmp_path / "run-totals.csv").read_text())
    row = dict(zip(totals_header, run, strict=True))
    assert row["energy_kwh"] == "4.5" and row["gpus"] == "8" and row["source"] == "measured"
    assert row["saving_kwh"] == "0.5" and row["saving_resolved"] == "1" and row["co2_kg"] == ""
    power_header, *gpus = _table((tmp_path / "run-power.csv").read_text())
    first, second = (dict(zip(power_header, gpu, strict=True)) for gpu in gpus)
    assert first["iteration"] == "20" and first["first_iteration"] == "11" and first["gpu"] == "0"
    assert (
        first["source"] == "measured"
        and first["average_w"] == "455.0"
        and first["sm_clock_min_mhz"] == "1755.0"
    )
    assert first["swing_w_median"] == "230.0" and first["swing_w_max"] == "250.0" and first["note"] == ""
    assert second["gpu"] == "1" and second["swing_w_median"] == second["swing_w_max"] == ""
    assert second["note"] == "9 iteration(s) without swing figures"


def test_without_a_file_every_table_goes_to_standard_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--csv", "--log-file", str(_log(tmp_path))]) == 0
    iterations, totals, power = capsys.readouterr().out.split("\n\n")
    assert len(_table(iterations)) == 3 and _table(totals)[0][0] == "first_iteration"
    assert len(_table(power)) == 3 and _table(power)[0][:2] == ["iteration", "first_iteration"]


def test_csv_without_a_log_file_says_what_to_give(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--csv"]) == export_csv(None, "-") == 2
    assert (
        "--csv exports an energy log's records: give the run's --log-file FILE too" in capsys.readouterr().err
    )


def test_a_corrupt_log_is_named_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "energy.jsonl"
    path.write_text("not json\n")
    assert main(["report", "--csv", str(tmp_path / "out.csv"), "--log-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot export" in err and "energy.jsonl:1" in err
