"""scripts/gpu_overhead.py on the CPU: flags, pairing, order, per-iteration JSON (training runs faked)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_energy.megatron.training_log import parse_iteration_lines

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SCRIPT = SCRIPTS / "gpu_overhead.py"
DATA = Path(__file__).resolve().parent / "data"


def load_script():
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))  # as `python scripts/gpu_overhead.py` has it
    spec = importlib.util.spec_from_file_location("gpu_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def megatron_line(iteration: int, total: int, ms: float, joules: float | None) -> str:
    energy = f" energy per GPU (J/iter/GPU): {joules:.1f} | power per GPU (W/GPU): 600.0 |" if joules else ""
    return (
        f" [2026-12-02 02:44:38.493685] iteration {iteration:8d}/{total:8d} | consumed samples: 96 "
        f"| elapsed time per iteration (ms): {ms:.1f} |{energy} learning rate: 9.0E-05 | lm loss: 9.8E+00 |"
    )


def test_megatron_lines_parse_with_and_without_energy():
    text = "\n".join(
        [
            "noise line",
            megatron_line(2, 30, 1599.9, 1090.1),
            megatron_line(1, 30, 2809.6, None),
            megatron_line(2, 30, 1.0, 1.0),  # a repeat keeps the first
            " iteration        3/      30 | validation loss: 3.0 |",  # no elapsed time: skipped
        ]
    )
    lines = parse_iteration_lines(text)
    assert [(line.iteration, line.elapsed_ms, line.energy_j) for line in lines] == [
        (1, 2809.6, None),
        (2, 1599.9, 1090.1),
    ]
    assert lines[0].train_iters == 30


class FakeTorchrun:
    """Stands in for subprocess.run: a Megatron log whose iterations are 1 % slower with the plugin."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def __call__(self, command, **_kwargs):
        self.commands.append(command)
        iters = int(command[command.index("--train-iters") + 1])
        plugin = "megatron_energy.launch" in command
        run = len(self.commands)
        lines = []
        for i in range(1, iters + 1):
            ms = (1000.0 + 3.0 * (i % 3) + run) * (1.01 if plugin else 1.0)
            lines.append(megatron_line(i, iters, ms, 500.0 + (i % 2)))
            if plugin:
                phase = "profiling" if i <= 8 else "planned" if i < 12 else "stock (safety net)"
                phase += " (clocks not set)"
                lines.append(f"[energy] iteration {i} | {phase} | J/iter measured: s0=500.0 | total=500.0")
        return subprocess.CompletedProcess(command, 0, stdout="\n".join(lines), stderr="")


def test_pairs_alternate_and_json_holds_every_iteration(tmp_path, monkeypatch, capsys):
    script = load_script()
    fake = FakeTorchrun()
    monkeypatch.setattr(script.subprocess, "run", fake)
    out_json = tmp_path / "overhead.json"
    argv = [
        "--pairs",
        "4",
        "--iters",
        "12",
        "--warmup",
        "2",
        "--out",
        str(tmp_path / "o"),
        "--json",
        str(out_json),
    ]
    assert script.main(argv) == 0
    assert len(fake.commands) == 1 + 8
    prime, *measured = fake.commands  # an unmeasured plugin run first caches the plan
    assert "megatron_energy.launch" in prime and prime[prime.index("--train-iters") + 1] == "28"
    plugin_flags = ["megatron_energy.launch" in command for command in measured]
    assert plugin_flags == [False, True, True, False, False, True, True, False]  # order alternated
    assert all(command[command.index("--train-iters") + 1] == "12" for command in measured)
    assert all(command[command.index("--global-batch-size") + 1] == "4" for command in fake.commands)
    document = json.loads(out_json.read_text())
    assert document["pairs"] == 4
    assert len(document["runs"]) == 8
    first = document["runs"][0]["iterations"]
    assert [record["iteration"] for record in first] == list(range(1, 13))
    assert [record["kept"] for record in first] == [False, False] + [True] * 10
    on = next(run for run in document["runs"] if run["plugin"])
    assert on["kept_phases"] == {"profiling": 6, "planned": 3, "stock (safety net)": 1}
    # The plugin's 1 % is found, with an interval that excludes zero (the fake's runs differ by 1 ms only).
    change = document["iteration_time"]
    assert change["change"] == pytest.approx(0.01, abs=2e-3)
    assert change["resolved"] and change["low"] > 0
    assert "plugin on vs off, iteration time (measured, 4 pairs): +1.0" in capsys.readouterr().out


class FakeCheckRun:
    """Stands in for subprocess.run of an in-process check: writes its pairs where the session does."""

    def __init__(self, active_s: float) -> None:
        self.active_s = active_s
        self.commands: list[list[str]] = []

    def __call__(self, command, **_kwargs):
        self.commands.append(command)
        energy_dir = Path(command[command.index("--energy-dir") + 1])
        energy_dir.mkdir(parents=True, exist_ok=True)
        pairs = [[1.0 + 0.001 * (i % 5), self.active_s + 0.001 * ((i + 2) % 5)] for i in range(10)]
        (energy_dir / "overhead-check-rank0.json").write_text(
            json.dumps({"block_steps": 2, "time_pairs_s": pairs, "energy_pairs_j": None})
        )
        line = "[energy] rank 0: overhead check, the plugin's own overhead (clocks not set): 10 pairs"
        return subprocess.CompletedProcess(
            command,
            0,
            stdout="\n".join([*(megatron_line(i, 9, 1.0, None) for i in range(1, 10)), line]),
            stderr="",
        )


def test_in_process_runs_hold_the_safety_net_off_and_pool_only_runs_of_one_job(tmp_path, monkeypatch, capsys):
    script = load_script()
    fake = FakeCheckRun(active_s=1.004)
    monkeypatch.setattr(script.subprocess, "run", fake)
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    argv = ["--in-process", "2", "--iters", "40", "--out", str(tmp_path / "o")]
    assert script.main([*argv, "--json", str(first)]) == 0
    command = fake.commands[-1]
    assert command[command.index("--energy-safety-steps") + 1] == "41"  # more than the run has: never trips
    assert command[command.index("--energy-overhead-check") + 1] == "2"
    assert len(json.loads(first.read_text())["pairs"]["time_pairs_s"]) == 10
    capsys.readouterr()
    longer = ["--in-process", "2", "--iters", "60", "--out", str(tmp_path / "o")]  # another length pools
    assert script.main([*longer, "--json", str(second), "--pool", str(first)]) == 0
    pooled_line = capsys.readouterr().out.splitlines()[-1]
    assert pooled_line.startswith("pooled over 2 runs: ") and "20 pairs of 2-iteration blocks" in pooled_line
    assert "mean +0.40 % (95 % CI +0.28 to +0.52 %)" in pooled_line
    assert script.main([*argv, "--microbatches", "8", "--pool", str(first)]) == 1
    assert f"cannot pool {first}: its job differs" in capsys.readouterr().out
    first.write_text(json.dumps({**json.loads(first.read_text()), "pairs": {"block_steps": 2}}))
    assert script.main([*argv, "--pool", str(first)]) == 1
    assert "cannot pool: not an overhead-check result" in capsys.readouterr().out
    assert script.main(["--pool", str(second), str(first)]) == 1  # alone: the stored runs, nothing runs
    assert f"cannot read {first}: not an overhead-check result" in capsys.readouterr().out


def test_stored_h200_runs_are_summarised_alone_and_pooled(monkeypatch, capsys):
    script = load_script()
    monkeypatch.setattr(script.subprocess, "run", None)  # nothing may run
    runs = [DATA / f"h200_overhead_run{k}.json" for k in (1, 2, 3)]
    assert script.main(["--pool", *map(str, runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == list(map(str, runs))
    # the quiet run (median iteration 1.59 s) resolves the overhead below 0.5 %; the disturbed ones (1.80 s)
    # do not, and pooled with them neither does it
    quiet, pooled = lines[2], lines[3]
    assert "56 pairs" in quiet and "time median of pairs +0.16 % (95 % CI -0.05 to +0.36 %)" in quiet
    assert pooled.startswith("pooled over 3 runs: ") and "169 pairs" in pooled
    assert "time median of pairs +0.15 % (95 % CI -0.29 to +0.59 %): within noise" in pooled


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pairs", "2"], "at least 4"),
        (["--iters", "5", "--warmup", "5"], "must exceed --warmup"),
        (["--microbatches", "0"], "at least 1"),
    ],
)
def test_bad_flags_are_refused(argv, message, capsys):
    script = load_script()
    with pytest.raises(SystemExit):
        script.parse_args(argv)
    assert message in capsys.readouterr().err


def test_script_help_runs():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and "--json" in result.stdout
