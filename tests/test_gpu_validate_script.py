"""lab/gpu_validate.py on the CPU: its steps, their commands and what lands in $OUT (children faked)."""

import importlib.util
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab  # the lab equipment (lab/), not the installed package

LAB = Path(__file__).resolve().parents[1] / "lab"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_validate", LAB / "gpu_validate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def megatron_line(iteration: int, ms: float, joules: float) -> str:
    return (
        f" [2026-12-02] iteration {iteration:8d}/{32:8d} | consumed samples: 64 | elapsed time per iteration "
        f"(ms): {ms:.1f} | energy per GPU (J/iter/GPU): {joules:.1f} | lm loss: 9.8E+00 |"
    )


class FakeChildren:
    """Stands in for subprocess.run: each step prints what the real one would, files included."""

    def __init__(self, work: Path, calibrated: Path) -> None:
        self.commands: list[list[str]] = []
        self.work = work
        self.calibrated = calibrated

    def __call__(self, command, **kwargs):
        self.commands.append(list(command))
        text = ""
        if command[1:3] == ["-c", "import megatron.core, zeus"]:
            return subprocess.CompletedProcess(command, 0, b"", b"")
        if "calibrate" in command:
            self.calibrated.write_text("name: h200.calibrated\n")
            text = "compute 690 W (measured)\nshipped vs calibrated\n  idle_power_w 125 -> 118 (measured)\n"
        elif "megatron_energy.launch" in command:
            (self.work / "energy").mkdir()
            (self.work / "energy" / "plan.json").write_text("{}")
            lines = [megatron_line(i, 1600.0 + i, 1100.0 + i) for i in range(1, 33)]
            phases = ["profiling"] * 21 + ["planned"] * 11
            lines += [
                f"[energy] iteration {i} | {p} (clocks not set) | J/iter" for i, p in enumerate(phases, 1)
            ]
            lines += [
                "[energy] plan for iso-time (perseus): iteration 1705.8 ms vs 1705.8 ms (modelled)",
                "[energy] iteration 32 | planned (clocks not set) | energy vs stock: within noise (±1.7 %)",
                "[energy] model vs measured at stock clocks: iteration time -1.2 % (modelled vs measured)",
            ]
            text = "\n".join(lines)
        elif "report" in command:
            assert command[command.index("--log-file") + 1] == str(self.work / "energy-log.jsonl")
            text = "model vs measured at stock clocks\n  total energy ... (measured) ... (modelled)\n"
        return subprocess.CompletedProcess(command, 0, text, "")


def test_steps_commands_and_out_files(tmp_path, monkeypatch, capsys):
    script = load_script()
    calibrated = tmp_path / "configs" / "gpus" / "h200.calibrated.yaml"
    calibrated.parent.mkdir(parents=True)
    monkeypatch.setattr(script, "REPO", tmp_path)
    work = tmp_path / "work"
    fake = FakeChildren(work, calibrated)
    monkeypatch.setattr(script.subprocess, "run", fake)
    out = tmp_path / "out"
    assert script.main(["--out", str(out), "--work", str(work)]) == 0
    names = [" ".join(command) for command in fake.commands]
    assert not any("pip install" in name for name in names)  # megatron-core importable: nothing installed
    dry_run = next(command for command in fake.commands if "megatron_energy.launch" in command)
    assert dry_run[dry_run.index("--nproc-per-node") + 1] == "1"
    assert {"--energy-optimise", "--energy-dry-run"} <= set(dry_run)
    assert dry_run[dry_run.index("--global-batch-size") + 1] == "32"
    assert dry_run[dry_run.index("--micro-batch-size") + 1] == "2"
    assert dry_run[dry_run.index("--train-iters") + 1] == "32"
    assert dry_run[dry_run.index("--num-layers") + 1] == "16"
    assert dry_run[dry_run.index("--pipeline-model-parallel-size") + 1] == "1"
    report = next(command for command in fake.commands if "report" in command)
    assert report[report.index("--energy-dir") + 1] == str(work / "energy")
    assert not any("bench_overhead.py" in name for name in names)  # only with --overhead-s
    files = sorted(path.name for path in out.iterdir())
    assert files == [
        "energy.tar.gz",
        "h200.calibrated.yaml",
        "key_figures.json",
        "report.txt",
        "validate.log",
    ]
    assert len(files) <= 8  # what $OUT brings back
    with tarfile.open(out / "energy.tar.gz") as tar:
        assert {"dry-run.log", "calibrate.log", "energy/plan.json"} <= set(tar.getnames())
    figures = json.loads((out / "key_figures.json").read_text())
    megatron = figures["megatron (dry run), by phase"]
    assert megatron["profiling"]["iterations"] == "4-21 (18)"
    assert megatron["profiling"]["mean_iteration_ms"] == pytest.approx(1612.5)
    assert megatron["planned"]["mean_energy_j_per_iter_per_gpu"] == pytest.approx(1127.0)
    assert figures["stock plan vs megatron"][0].startswith("stock plan vs Megatron's own log: no plan")
    assert figures["our lines"][0] == "shipped vs calibrated"
    assert any(line.startswith("[energy] model vs measured") for line in figures["our lines"])
    assert figures["our lines"][-1].startswith("[energy] iteration 32")
    printed = capsys.readouterr().out
    assert "=== key figures" in printed and "model vs measured at stock clocks" in printed
    assert (out / "validate.log").read_text() == printed


def test_a_failing_step_fails_the_script_but_the_rest_still_runs(tmp_path, monkeypatch):
    script = load_script()
    monkeypatch.setattr(script, "REPO", tmp_path)
    (tmp_path / "configs" / "gpus").mkdir(parents=True)
    calls = []

    def failing_calibration(command, **kwargs):
        calls.append(command)
        status = 1 if "calibrate" in command else 0
        return subprocess.CompletedProcess(command, status, "", "")

    monkeypatch.setattr(script.subprocess, "run", failing_calibration)
    out = tmp_path / "out"
    assert script.main(["--out", str(out), "--work", str(tmp_path / "w"), "--skip", "dry-run"]) == 1
    assert any("report" in command for command in calls)
    steps = json.loads((out / "key_figures.json").read_text())["steps"]
    assert steps["calibrate"]["status"] == 1 and steps["report"]["status"] == 0


def test_too_few_iterations_are_refused(capsys):
    script = load_script()
    with pytest.raises(SystemExit):
        script.parse_args(["--train-iters", "20"])
    assert "at least 25" in capsys.readouterr().err


def test_no_step_starts_past_the_budget(tmp_path, monkeypatch):
    script = load_script()
    monkeypatch.setattr(script, "REPO", tmp_path)
    calls = []
    monkeypatch.setattr(
        script.subprocess,
        "run",
        lambda command, **kw: calls.append(command) or subprocess.CompletedProcess(command, 0, "", ""),
    )
    out = tmp_path / "out"
    assert script.main(["--out", str(out), "--work", str(tmp_path / "w"), "--budget-s", "20"]) == 1
    assert [command[1:3] for command in calls] == [["-c", "import megatron.core, zeus"]]  # the probe only
    steps = json.loads((out / "key_figures.json").read_text())["steps"]
    assert {result["status"] for result in steps.values()} == {"skipped: budget spent"}
