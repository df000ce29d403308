"""The launcher's messages: one line per problem, printed once, and the noise of a Megatron run set aside."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from launcher_world import run_launcher

from megatron_energy import launch
from megatron_energy.launch_errors import ERROR_FILE_ENV, LaunchError, refuse
from megatron_energy.launch_output import AsideFile, RankOutput, rank_output

ARGUMENTS = (
    "------------------------ arguments ------------------------\n"
    "  num_layers ...................................... 2\n"
    "-------------------- end of arguments ---------------------\n"
)
"""Megatron's list of arguments, as ``_print_args`` prints it (shortened)."""


class _Writes:
    """A console that keeps each ``write`` call apart."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        """Nothing is held."""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """A training script that leaves a marker file when it runs."""
    path = tmp_path / "pretrain_gpt.py"
    path.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    return path


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("megatron_energy.launch: error: ")
    return line


@pytest.mark.parametrize("where", ["after", "before"])
def test_a_misspelt_energy_flag_is_refused_naming_the_nearest_before_megatron_runs(
    script: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(script), "--num-layers", "2", "--energy-optimse"]
    if where == "before":
        argv = ["--energy-optimse", str(script), "--num-layers", "2"]
    assert launch.main(argv) == 2
    line = _one_line(capsys)
    assert "unknown flag --energy-optimse: did you mean --energy-optimise?" in line
    assert not (script.parent / "ran").exists()


def test_a_misspelt_flag_with_its_value_names_the_flag(
    script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert launch.main([str(script), "--energy-optimise", "--energy-profile-iter=3"]) == 2
    assert "unknown flag --energy-profile-iter: did you mean --energy-profile-iters?" in _one_line(capsys)


@pytest.mark.parametrize("energy_flags", [[], ["--energy-optimise"]])
def test_a_missing_script_is_named_plainly(
    tmp_path: Path, energy_flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "pretrain_gtp.py"
    assert launch.main([str(missing), "--num-layers", "2", *energy_flags]) == 2
    assert f"no training script at {missing}: give the path of the Megatron pretrain script" in _one_line(
        capsys
    )


def test_tensor_parallelism_without_a_gpu_is_refused_naming_the_estimate(
    script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    argv = [
        str(script), "--tensor-model-parallel-size", "2", "--energy-optimise",
        "--energy-backend", "simulated", "--energy-gpu-spec", "h100-sxm", "--energy-dir", str(tmp_path / "e"),
    ]  # fmt: skip
    assert launch.main(argv) == 2
    line = _one_line(capsys)
    assert "--tensor-model-parallel-size 2 needs CUDA GPUs and this machine has none" in line
    assert "`megatron-energy estimate -- <your Megatron arguments>`" in line
    assert not (tmp_path / "ran").exists()


def test_a_refusal_is_printed_by_rank_0_only_and_is_the_root_cause_torchrun_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {}
    for rank in (0, 1):
        error_file = tmp_path / f"error{rank}.json"
        monkeypatch.setenv(ERROR_FILE_ENV, str(error_file))
        assert refuse(LaunchError("unknown flag --energy-optimse"), rank) == 2
        failures[rank] = ProcessFailure(
            local_rank=rank, pid=100 + rank, exitcode=2, error_file=str(error_file)
        )
    line = "megatron_energy.launch: error: unknown flag --energy-optimse"
    assert capsys.readouterr().err == line + "\n"
    report = ChildFailedError("megatron_energy.launch", failures).format_msg()
    root_cause = report.split("Root Cause (first observed failure):")[1]
    assert f"traceback : {line}" in root_cause and "To enable traceback" not in report
    assert json.loads((tmp_path / "error1.json").read_text())["message"]["message"] == line


def test_rank_output_writes_each_line_whole_in_one_write() -> None:
    console = _Writes()
    stream = RankOutput(console, None)  # type: ignore[arg-type]
    print("[energy] rank 1: a message", file=stream)  # two writes: the text, then the newline
    stream.write("two lines\nat ")
    stream.write("once\n")
    assert console.calls == ["[energy] rank 1: a message\n", "two lines\n", "at once\n"]


def test_megatrons_argument_list_goes_to_the_ranks_file_with_one_line_saying_where(tmp_path: Path) -> None:
    console = _Writes()
    aside = AsideFile(tmp_path / "megatron-output" / "rank0.log", console)  # type: ignore[arg-type]
    stream = RankOutput(console, aside)  # type: ignore[arg-type]
    stream.write("> building the model\n" + ARGUMENTS + "> done\n")
    aside.close()
    assert console.calls == [
        "> building the model\n",
        f"[energy] Megatron's argument list and known warnings: in {aside.path} "
        "(--energy-show-megatron-log shows them here)\n",
        "> done\n",
    ]
    assert aside.path.read_text() == ARGUMENTS


def test_known_warnings_go_to_the_file_and_others_stay(tmp_path: Path) -> None:
    aside_path = tmp_path / "rank0.log"
    with warnings.catch_warnings(record=True) as shown:  # what would be shown on the console
        warnings.simplefilter("always")
        with rank_output(aside_path):
            warnings.warn("Apex is not installed. Falling back to Torch Norm", UserWarning, stacklevel=1)
            warnings.warn("something the user must see", UserWarning, stacklevel=1)
    assert [str(warning.message) for warning in shown] == ["something the user must see"]
    assert "Apex is not installed" in aside_path.read_text()


@pytest.mark.world
def test_on_the_ranks_of_a_world_a_bad_flag_is_printed_once_and_megatrons_list_set_aside(
    tmp_path: Path,
) -> None:
    bad = run_launcher(
        ["no_such_script.py", "--energy-optimise", "--energy-log-rank", "all"], 2, tmp_path / "bad"
    )
    assert bad.statuses == (2, 2)
    assert bad.log(0).read_text() == (
        "megatron_energy.launch: error: unknown flag --energy-log-rank: did you mean --energy-log-ranks? "
        "(Megatron has no --energy-* flags of its own)\n"
    )
    assert bad.log(1).read_text() == ""

    folder = tmp_path / "quiet"
    folder.mkdir()
    script = folder / "pretrain_gpt.py"
    script.write_text(
        f"import sys\nif sys.argv[1:] == ['--num-layers', '2']:\n    print({ARGUMENTS!r}, end='')\n"
    )
    energy_dir = folder / "energy"
    argv = [
        str(script),
        "--num-layers",
        "2",
        "--energy-trace",
        str(folder / "t.jsonl"),
        "--energy-dir",
        str(energy_dir),
    ]
    quiet = run_launcher(argv, 2, folder)
    assert quiet.statuses == (0, 0)
    assert "arguments ---" not in quiet.output
    assert f"Megatron's argument list and known warnings: in {energy_dir / 'megatron-output'}" in quiet.output
    assert (energy_dir / "megatron-output" / "rank0.log").read_text() == ARGUMENTS


@pytest.mark.parametrize(("argv", "status"), [(["--help"], 0), ([], 2)])
def test_the_launchers_help_is_printed_by_rank_0_only(
    argv: list[str], status: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    printed = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as stop:
            launch.split_command(argv)
        assert stop.value.code == status
        printed[rank] = capsys.readouterr().out
    assert "--energy-optimise" in printed["0"] and printed["1"] == ""
