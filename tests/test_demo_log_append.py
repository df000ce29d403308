"""The demo appends to its energy log, as --energy-log-file says, and sums up its own run's records only."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_energy.cli import main
from megatron_energy.commands import demo
from megatron_energy.energy_dir import JobFiles
from megatron_energy.report.demo_summary import SummaryError
from megatron_energy.report.model_vs_measured import savings_lines
from megatron_energy.runtime.energy_log.energy_line import (
    EnergyRecord,
    ForeignLogError,
    append_record,
    read_job_records,
)

EARLIER_RUN = EnergyRecord(40, "planned", "modelled", {"energy/j_per_iter_total": 99.0}, job="an-earlier-job")


def test_the_demo_keeps_earlier_runs_records_and_reads_from_where_its_run_began(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "demo" / "energy_log.jsonl"
    append_record(log, EARLIER_RUN)
    earlier = log.read_text()
    job_folder = tmp_path / "0123456789abcdef"
    job_folder.mkdir()
    JobFiles(job_folder).plan.write_text("{}")
    asked: list[tuple[Path, int]] = []

    def ranks(*args: object) -> int:
        append_record(log, EnergyRecord(1, "planned", "modelled", {}, job=job_folder.name))  # this run's
        return 0

    def summary(folder: Path, log_file: Path, log_start_byte: int = 0) -> None:
        asked.append((log_file, log_start_byte))
        raise SummaryError("stop here")

    monkeypatch.setattr(demo, "run_ranks", ranks)
    monkeypatch.setattr(demo, "latest_job_folder", lambda energy_dir: job_folder)
    monkeypatch.setattr(demo, "load_summary", summary)
    assert main(["demo", "--energy-dir", str(tmp_path)]) == 2
    assert log.read_text().startswith(earlier)  # appended, not deleted
    assert asked == [(log, len(earlier.encode()))]
    (record,) = read_job_records(log, job_folder.name, len(earlier.encode()))
    assert record.job == job_folder.name


def test_records_before_the_start_byte_are_neither_read_nor_checked(tmp_path: Path) -> None:
    log = tmp_path / "energy_log.jsonl"
    append_record(log, EARLIER_RUN)
    start = log.stat().st_size
    append_record(log, EnergyRecord(2, "planned", "modelled", {}, job="this-job"))
    assert [record.iteration for record in read_job_records(log, "this-job", start)] == [2]
    with log.open("a") as handle:
        handle.write("not json\n")
    with pytest.raises(ValueError, match=r"energy_log.jsonl:3 is not an energy log record"):
        read_job_records(log, "this-job", start)  # line numbers count the whole file


def test_a_log_several_jobs_appended_to_gives_each_job_its_own_records(tmp_path: Path) -> None:
    log = tmp_path / "energy_log.jsonl"
    for iteration, job in ((40, "an-earlier-job"), (2, "this-job"), (41, "an-earlier-job"), (3, "this-job")):
        append_record(log, EnergyRecord(iteration, "planned", "modelled", {}, job=job))
    assert [record.iteration for record in read_job_records(log, "this-job")] == [2, 3]
    assert [record.iteration for record in read_job_records(log, "an-earlier-job")] == [40, 41]
    with pytest.raises(ForeignLogError, match="an-earlier-job, this-job, not of job a-third-job"):
        read_job_records(log, "a-third-job")


def test_report_takes_the_savings_of_its_job_from_a_shared_log(tmp_path: Path) -> None:
    log = tmp_path / "energy_log.jsonl"
    for job, iteration, window in (("this-job", 60, 20.0), ("another-job", 90, 30.0)):
        scalars = {
            "energy/change_vs_stock": -0.12,
            "energy/change_vs_stock_low": -0.13,
            "energy/change_vs_stock_high": -0.11,
            "energy/window_iterations": window,
        }
        append_record(log, EnergyRecord(iteration, "planned", "measured", scalars, job=job))
    heading = savings_lines(log, "this-job")[0]
    assert "(iteration 60, last window of 20 planned iterations" in heading
