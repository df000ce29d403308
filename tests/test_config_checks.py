"""Input checked at parse time: writable output folders, known GPU specs, ranges; the launcher stops before
the script with one message and exit status 2."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from megatron_energy import launch
from megatron_energy.config import (
    EnergyConfig,
    EnergyConfigError,
    add_energy_args,
    unwritable_folder_reason,
)
from megatron_energy.target import parse_target


def _parse(argv: list[str]) -> argparse.Namespace:
    return add_energy_args(argparse.ArgumentParser(prog="pretrain_gpt.py")).parse_args(argv)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        _parse(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "not-a-folder"
    path.write_text("x")
    return path


def test_an_energy_dir_below_a_file_is_refused_saying_what_to_do(
    a_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(["--energy-optimise", "--energy-dir", str(a_file / "energy")], capsys)
    assert f"{a_file} is not a folder" in err and "--energy-dir PATH" in err


def test_an_energy_dir_on_a_read_only_file_system_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["--energy-optimise", "--energy-dir", "/proc/megatron_energy"], capsys)
    assert "cannot write into /proc" in err


def test_the_default_energy_dir_is_checked_when_optimising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "energy").write_text("a file where the default folder would go")
    monkeypatch.chdir(tmp_path)
    err = _refused(["--energy-optimise"], capsys)
    assert "--energy-dir energy" in err and "is not a folder" in err


def test_a_trace_in_an_unwritable_folder_or_naming_a_folder_is_refused(
    a_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(["--energy-trace", str(a_file / "events.jsonl")], capsys)
    assert "--energy-trace" in err and "is not a folder" in err
    err = _refused(["--energy-trace", str(tmp_path)], capsys)
    assert "is a folder; give a file name" in err


def test_a_writable_new_folder_passes_and_the_check_leaves_nothing_behind(tmp_path: Path) -> None:
    before = sorted(tmp_path.iterdir())
    config = EnergyConfig.from_args(
        _parse(["--energy-optimise", "--energy-dir", str(tmp_path / "a" / "b"), "--energy-trace", "t.jsonl"])
    )
    assert config.dir == tmp_path / "a" / "b"
    assert sorted(tmp_path.iterdir()) == before, "no folder created, no probe left"
    assert unwritable_folder_reason(tmp_path) is None


def test_an_unknown_gpu_spec_is_refused_at_parse_time_listing_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _refused(
        ["--energy-optimise", "--energy-backend", "simulated", "--energy-gpu-spec", "h900"], capsys
    )
    assert "unknown GPU spec 'h900'" in err and "h100-sxm" in err and "h200" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--energy-optimise", "--energy-profile-iters", "0"], "must be a whole number >= 1"),
        (["--energy-optimise", "--energy-freq-grid", "1980,-5"], "outside 100-4000 MHz"),
        (["--energy-optimise", "--energy-freq-grid", "1980,0"], "outside 100-4000 MHz"),
    ],
)
def test_ranges_are_checked(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert message in _refused(argv, capsys)


def test_the_launcher_reports_bad_input_once_before_running_the_script(
    tmp_path: Path, a_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "pretrain_gpt.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    for bad in (["--energy-dir", str(a_file / "x")], ["--energy-gpu-spec", "h900"]):
        assert launch.main([str(script), "--num-layers", "2", "--energy-optimise", *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and "Traceback" not in err
    assert not marker.exists()


def test_a_config_built_in_code_is_checked_naming_each_field_its_flag_and_the_fix() -> None:
    with pytest.raises(EnergyConfigError) as error:
        EnergyConfig(mode="bogus", safety_tolerance=-3, profile_iters=0)
    message = str(error.value)
    assert "safety_tolerance=-3 (--energy-safety-tolerance) must be a fraction strictly between 0 and 1" in (
        message
    )
    assert "profile_iters=0 (--energy-profile-iters) must be a whole number >= 1" in message
    assert "unknown --energy-mode 'bogus'; use one of perseus" in message
    with pytest.raises(EnergyConfigError, match=r"freq_grid=\(1980,\) .* fewer than two distinct clocks"):
        EnergyConfig(freq_grid=(1980,))


def test_the_parser_and_the_config_share_one_check_per_value(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["--energy-optimise", "--energy-safety-tolerance", "1.5"], capsys)
    with pytest.raises(EnergyConfigError) as error:
        EnergyConfig(safety_tolerance=1.5)
    problem = str(error.value).split("(--energy-safety-tolerance) ", 1)[1]
    assert f"'1.5' {problem}" in err


@pytest.mark.parametrize("mode", ["kareus", "kernel"])
def test_a_power_budget_for_a_mode_that_keeps_stock_clocks_is_refused_before_profiling(
    mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(["--energy-optimise", "--energy-mode", mode, "--energy-target", "power:400"], capsys)
    assert f"--energy-mode {mode} alone keeps stock clocks; use --energy-mode perseus or all" in err
    with pytest.raises(EnergyConfigError, match="needs a planner that trades time for power"):
        EnergyConfig(mode=mode, target=parse_target("power:400"))


def test_a_power_budget_below_the_gpus_idle_power_is_refused_before_profiling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    simulated = ["--energy-optimise", "--energy-backend", "simulated", "--energy-gpu-spec", "h100-sxm"]
    err = _refused([*simulated, "--energy-target", "power:50"], capsys)
    assert "power:50: no plan can meet it: a GPU draws at least its idle power at any clock, 114.7 W" in err
    assert err.count("error:") == 1
    with pytest.raises(EnergyConfigError, match=r"114\.7 W for h100-sxm"):
        EnergyConfig(target=parse_target("power:50"), backend="simulated", gpu_spec="h100-sxm")
    assert EnergyConfig.from_args(_parse([*simulated, "--energy-target", "power:400"])).target.power_w == 400
