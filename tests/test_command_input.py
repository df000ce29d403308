"""`megatron-energy plan|simulate|report` on bad input: one line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from demo_run import DemoRun

from megatron_energy.cli import main

EXAMPLE_JOB = Path(__file__).resolve().parents[1] / "configs" / "examples" / "gpt3-xl-pp4-h100.yaml"
TRUNCATED_PROFILE = "stage,instruction,frequency,time,energy\n0,forward,1980,0.0125,12.5\n0,backward,19"


def _status_and_err(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exit_info:  # argparse refused the input
        status = int(exit_info.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err


def _one_error_line(err: str, command: str) -> str:
    """The one line of ours (third-party import warnings, e.g. torch's about CUDA, may precede it)."""
    lines = [line for line in err.splitlines() if line.startswith("megatron-energy")]
    assert len(lines) == 1 and lines[0].startswith(f"megatron-energy {command}: error: "), err
    return lines[0]


@pytest.fixture
def truncated_profile(tmp_path: Path) -> Path:
    path = tmp_path / "profile.csv"
    path.write_text(TRUNCATED_PROFILE)
    return path


def _plan_args(profile: Path, out: Path, *extra: str) -> list[str]:
    return [
        "plan",
        "--profile",
        str(profile),
        "--profile-source",
        "measured",
        "--stages",
        "1",
        "--microbatches",
        "1",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpu-spec", "h900"], "unknown GPU spec 'h900'; known: "),
        (["--gpu-spec", "h200", "--stages", "0"], "must be a whole number >= 1"),
        (["--gpu-spec", "h200", "--points", "-3"], "must be a whole number >= 1"),
        (["--gpu-spec", "h200", "--switch-latency-ms", "-1"], "must be a number >= 0"),
        (["--gpu-spec", "h200", "--activation-bytes", "-8"], "must be a whole number >= 0"),
    ],
)
def test_plan_refuses_bad_arguments_while_parsing(
    truncated_profile: Path,
    tmp_path: Path,
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, err = _status_and_err(_plan_args(truncated_profile, tmp_path / "plan.json", *extra), capsys)
    assert status == 2 and message in err


def test_plan_refuses_a_missing_profile_and_an_unwritable_output(
    truncated_profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = _status_and_err(_plan_args(tmp_path / "none.csv", tmp_path / "p.json"), capsys)
    assert status == 2 and "none.csv is not a file" in err
    status, err = _status_and_err(_plan_args(truncated_profile, truncated_profile / "p.json"), capsys)
    assert status == 2 and "is not a folder" in err


def test_plan_explains_a_truncated_profile_in_one_line(
    truncated_profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = _status_and_err(
        _plan_args(truncated_profile, tmp_path / "p.json", "--gpu-spec", "h200"), capsys
    )
    assert status == 2
    assert "profile.csv:3" in _one_error_line(err, "plan")
    assert not (tmp_path / "p.json").exists()


def test_simulate_explains_an_unknown_gpu_and_a_truncated_plan_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(EXAMPLE_JOB.read_text().replace("gpu: h100-sxm", "gpu: h900"))
    status, err = _status_and_err(["simulate", "--config", str(job)], capsys)
    assert status == 2 and "unknown GPU spec 'h900'" in _one_error_line(err, "simulate")

    plan = tmp_path / "plan.json"
    plan.write_text('{"schema_version": 2, "stages": [')
    status, err = _status_and_err(["simulate", "--config", str(EXAMPLE_JOB), "--plan", str(plan)], capsys)
    assert status == 2
    _one_error_line(err, "simulate")
    status, err = _status_and_err(["simulate", "--config", str(tmp_path / "none.yaml")], capsys)
    assert status == 2 and "none.yaml is not a file" in err


def _copy_latest_job(energy_dir: Path, tmp_path: Path) -> Path:
    copy = Path(shutil.copytree(energy_dir, tmp_path / "energy"))
    fingerprint = json.loads((copy / "last_job.json").read_text())["fingerprint"]
    return copy / fingerprint


@pytest.mark.world
@pytest.mark.parametrize("damage", ["truncated profile", "unknown GPU"])
def test_report_explains_a_damaged_job_in_one_line(
    demo: DemoRun, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.status == 0, demo.out[-3000:]  # the session's one demo run (conftest.demo)
    job = _copy_latest_job(demo.energy_dir, tmp_path)
    if damage == "truncated profile":
        profile = job / "profile.csv"
        profile.write_text(profile.read_text().rsplit(",", 2)[0])  # the last line loses two fields
    else:
        record = json.loads((job / "job.json").read_text())
        record["parts"]["gpu"] = "h900"
        (job / "job.json").write_text(json.dumps(record))
    capsys.readouterr()
    status, err = _status_and_err(["report", "--energy-dir", str(job.parent)], capsys)
    line = _one_error_line(err, "report")
    assert status == 2 and f"cannot report on {job}" in line and "rerun the job" in line


@pytest.mark.world
def test_the_energy_log_is_strict_json_naming_its_job_and_report_refuses_another_jobs_log(
    demo: DemoRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.status == 0, demo.out[-3000:]  # the session's one demo run (conftest.demo)
    job = _copy_latest_job(demo.energy_dir, tmp_path)
    log = demo.energy_dir / "demo" / "energy_log.jsonl"

    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    records = [json.loads(line, parse_constant=no_constants) for line in log.read_text().splitlines()]
    assert records and all(record["job"] == job.name for record in records)
    assert all(record["time_utc"].endswith("+00:00") for record in records)

    foreign = tmp_path / "other_job_log.jsonl"
    other = [json.dumps({**record, "job": "0123456789abcdef"}) for record in records]
    foreign.write_text("\n".join(other) + "\n")
    capsys.readouterr()
    status, err = _status_and_err(
        ["report", "--energy-dir", str(job.parent), "--job", job.name, "--log-file", str(foreign)], capsys
    )
    line = _one_error_line(err, "report")
    assert status == 2 and "0123456789abcdef" in line and job.name in line
    status, _ = _status_and_err(
        ["report", "--energy-dir", str(job.parent), "--job", job.name, "--log-file", str(log)], capsys
    )
    assert status == 0


def test_report_hints_only_flags_that_were_not_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = _status_and_err(["report", "--energy-dir", str(tmp_path)], capsys)
    line = _one_error_line(err, "report")
    assert status == 2 and str(tmp_path) in line and "--energy-dir" not in line
    monkeypatch.chdir(tmp_path)  # no ./energy here
    status, err = _status_and_err(["report"], capsys)
    line = _one_error_line(err, "report")
    assert (
        status == 2
        and "no job recorded under energy " in line
        and line.endswith("pass the job's --energy-dir")
    )


def test_ctrl_c_in_a_command_ends_with_one_line_and_status_130(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from megatron_energy.commands import report

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "latest_job_folder", interrupted)  # Ctrl-C while the report is made
    status, err = _status_and_err(["report", "--energy-dir", str(tmp_path)], capsys)
    assert status == 130
    assert err.strip().splitlines()[-1] == "megatron-energy report: interrupted"
