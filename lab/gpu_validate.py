r"""One H200 check in one call (about 4 minutes): calibration, the launcher dry run, the job report.

Steps, each under its own time limit, every output under ``$OUT`` (or ``--out``):

1. installs the carried wheels (megatron-core, zeus and their needs, ``--wheels``, default ``.whl``) into
   ``--site`` with ``pip install --no-index --no-deps`` when megatron-core is not importable;
2. ``megatron-energy calibrate`` (read-only, stock clocks): writes ``configs/gpus/h200.calibrated.yaml`` next
   to the shipped spec and prints "shipped vs calibrated" per value;
3. the launcher dry run of the issue's job: ``python -m torch.distributed.run --nproc-per-node 1 -m
   megatron_energy.launch scripts/pretrain_gpt.py`` with a 16-layer GPT (hidden 2048, seq 2048, 16
   microbatches, bf16, PP=1, mock data, NullTokenizer) ``--energy-optimise --energy-dry-run`` for
   ``--train-iters`` iterations (default 32: the stock baseline takes up to 21 profiling iterations, so 20
   would leave no planned one);
4. ``megatron-energy report`` on the dry run's energy folder;
5. optionally (``--overhead-s S``), ``lab/bench_overhead.py`` (plugin loaded vs not, separate processes,
   ``--energy-mode perseus``, ``--script`` as above) with as many pairs as fit in ``S`` seconds;
6. prints the key figures (each labelled measured or modelled) and writes them to ``key_figures.json``.

Nothing on the GPU is changed: the calibration only reads NVML, the training runs in ``--energy-dry-run``.
``$OUT`` takes at most 8 files, so the energy folder, the trace and the logs travel as ``energy.tar.gz``.

    python3 lab/gpu_validate.py            # $OUT set by the device tool; else --out build/gpu_validate
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpt_job import gpt_args  # noqa: E402  (lab/, the folder of this script)
from megatron_log_check import megatron_stock_lines  # noqa: E402

from megatron_energy.megatron.training_log import parse_iteration_lines  # noqa: E402
from megatron_energy.plan_file import load_plan  # noqa: E402
from megatron_energy.runtime.energy_log.energy_line import logged_phases  # noqa: E402

KEY_LINES = ("model vs measured", "plan for")
"""Our ``[energy]`` lines worth repeating at the end (their figures say measured or modelled themselves)."""
COMPARISON_HEADER = "shipped vs calibrated"
"""The calibration script's closing block starts with a line holding this."""
PACKING_S = 15.0
"""Seconds kept back from the budget for the closing summary and the archive."""
GPU_QUERY = "name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's flags; bad values exit with a message."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "build/gpu_validate")))
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl", help="folder of carried wheels")
    parser.add_argument("--site", type=Path, default=Path("/tmp/site"), help="where the wheels go")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_validate"), help="scratch (emptied)")
    parser.add_argument("--train-iters", type=int, default=32)
    parser.add_argument("--loop-s", type=float, default=3.0, help="seconds per calibration loop (>= 2)")
    parser.add_argument("--overhead-s", type=float, default=0.0, help="seconds for overhead pairs (0: none)")
    parser.add_argument("--budget-s", type=float, default=570.0, help="no step runs past this (one call)")
    parser.add_argument(
        "--script",
        type=Path,
        default=Path("scripts/pretrain_gpt.py"),
        help="the pretrain script the launcher runs, e.g. Megatron-LM's own pretrain_gpt.py (its folder "
        "goes on PYTHONPATH for its gpt_builders/model_provider imports)",
    )
    parser.add_argument("--skip", action="append", default=[], choices=("calibrate", "dry-run", "report"))
    args = parser.parse_args(argv)
    if args.train_iters < 25:
        parser.error("--train-iters must be at least 25: profiling takes up to 21 iterations")
    if args.loop_s < 2.0:
        parser.error("--loop-s must be at least 2 s: the energy counter updates every ~100 ms")
    return args


class Steps:
    """Runs the steps as child processes, each with a time limit, logging to one file and the console."""

    def __init__(self, env: dict[str, str], budget_s: float) -> None:
        self.env = env
        self.budget_s = budget_s
        self.results: dict[str, dict] = {}
        self.started = time.perf_counter()

    def run(self, name: str, command: list[str], limit_s: float, log: Path | None = None) -> str:
        """Run ``command``; record its status and wall time; return its output.

        The whole output goes to ``log`` when given (the console then gets its last 3000 characters).
        """
        limit_s = min(limit_s, self.budget_s - self.elapsed_s() - PACKING_S)
        if limit_s < 10:
            print(f"\n=== {name}: skipped, {self.budget_s:.0f} s budget spent", flush=True)
            self.results[name] = {"status": "skipped: budget spent", "wall_s": 0.0}
            return ""
        print(f"\n=== {name} (at most {limit_s:.0f} s): {' '.join(command)}", flush=True)
        began = time.perf_counter()
        try:
            done = subprocess.run(
                command, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=limit_s, check=False
            )
            output, status = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as expired:
            output = _text(expired.stdout) + _text(expired.stderr)
            status = f"timed out after {limit_s:.0f} s"
        wall_s = time.perf_counter() - began
        self.results[name] = {"status": status, "wall_s": round(wall_s, 1)}
        if log is not None:
            log.write_text(output)
        print(output if log is None else output[-3000:], flush=True)
        print(f"=== {name}: status {status}, {wall_s:.1f} s (measured wall clock)", flush=True)
        return output

    def elapsed_s(self) -> float:
        """Seconds since the steps began."""
        return time.perf_counter() - self.started


def _text(data: bytes | str | None) -> str:
    """A timed-out child's partial output as text."""
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def install_wheels(args: argparse.Namespace, env: dict[str, str]) -> str:
    """Install the carried wheels into ``args.site`` unless megatron-core imports; say what was done."""
    probe = [sys.executable, "-c", "import megatron.core, zeus"]
    if subprocess.run(probe, env=env, capture_output=True, check=False).returncode == 0:
        return "megatron-core and zeus already importable: no wheels installed"
    wheels = sorted(str(path) for path in args.wheels.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"megatron-core is not importable and {args.wheels} holds no wheels: carry .whl")
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--no-cache-dir", "--upgrade", "--target", str(args.site), *wheels]
    subprocess.run(command, check=True)
    return f"installed {len(wheels)} wheels from {args.wheels} into {args.site}"


def dry_run_command(args: argparse.Namespace, work: Path) -> list[str]:
    """The launcher dry run of the issue's job, its energy folder, log file and trace under ``work``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "1",
        "--master-port",
        "29519",
        "-m",
        "megatron_energy.launch",
        str(args.script),
        *gpt_args(microbatches=16, micro_batch_size=2, train_iters=args.train_iters),
        "--energy-optimise",
        "--energy-dry-run",
        "--energy-dir",
        str(work / "energy"),
        "--energy-log-file",
        str(work / "energy-log.jsonl"),
        "--energy-trace",
        str(work / "trace.jsonl"),
    ]


def megatron_figures(log: str, warmup: int = 3) -> dict:
    """Means of Megatron's own iteration time and energy per phase of our log, after ``warmup`` (measured)."""
    phases = logged_phases(log)
    figures: dict[str, dict] = {}
    for phase in dict.fromkeys(phases.values()):
        lines = [
            line
            for line in parse_iteration_lines(log)
            if line.iteration > warmup and phases.get(line.iteration) == phase
        ]
        energies = [line.energy_j for line in lines if line.energy_j is not None]
        if lines:
            figures[phase] = {
                "source": "measured (Megatron's iteration timer, --log-energy NVML counter)",
                "iterations": f"{lines[0].iteration}-{lines[-1].iteration} ({len(lines)})",
                "mean_iteration_ms": round(statistics.fmean(line.elapsed_ms for line in lines), 1),
                "mean_energy_j_per_iter_per_gpu": round(statistics.fmean(energies), 1) if energies else None,
            }
    return figures


def stock_check_lines(log: str, energy_dir: Path) -> list[str]:
    """The run's plan's stock prediction against Megatron's own log (``lab/megatron_log_check.py``)."""
    try:
        fingerprint = json.loads((energy_dir / "last_job.json").read_text())["fingerprint"]
        plan = load_plan(energy_dir / fingerprint / "plan.json")
    except (OSError, ValueError, KeyError) as problem:
        return [f"stock plan vs Megatron's own log: no plan to compare ({problem})"]
    return megatron_stock_lines(log, plan)


def key_lines(training_log: str, calibration_log: str) -> list[str]:
    """The lines that carry the key figures: the calibration's closing comparison, our plan and model lines.

    Args:
        training_log: The dry run's output.
        calibration_log: The calibration's output.

    Returns:
        The calibration's block from its "shipped vs calibrated" line on, our ``[energy]`` lines naming the
        plan or the model against measurement, and our last per-iteration line, in that order.
    """
    calibration = calibration_log.splitlines()
    start = next((i for i, line in enumerate(calibration) if COMPARISON_HEADER in line), len(calibration))
    ours = [line.strip() for line in training_log.splitlines() if line.strip().startswith("[energy]")]
    wanted = [line for line in ours if any(key in line for key in KEY_LINES)]
    last_iteration = [line for line in ours if line.startswith("[energy] iteration")][-1:]
    return calibration[start:] + list(dict.fromkeys(wanted)) + last_iteration


def pack(out: Path, work: Path) -> Path:
    """The energy folder, trace, energy log and the training log as one archive (``$OUT`` takes 8 files)."""
    archive = out / "energy.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(work.iterdir()):
            tar.add(path, arcname=path.name)
    return archive


class Tee:
    """Writes what the script prints to the console and to ``validate.log`` (the console's tail is cut)."""

    def __init__(self, console: TextIO, log: TextIO) -> None:
        self.console, self.log = console, log

    def write(self, text: str) -> int:
        """Write to both."""
        self.log.write(text)
        return self.console.write(text)

    def flush(self) -> None:
        """Flush both."""
        self.log.flush()
        self.console.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    console = sys.stdout
    with (args.out / "validate.log").open("w", encoding="utf-8") as log:
        sys.stdout = Tee(console, log)  # type: ignore[assignment]
        try:
            return validate(args)
        finally:
            sys.stdout = console


def validate(args: argparse.Namespace) -> int:
    """The steps of the module docstring; 1 when a step failed or timed out, else 0."""
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    paths = [str(args.script.resolve().parent), str(args.site), str(REPO), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(paths).rstrip(":")
    steps = Steps(env, args.budget_s)
    print(install_wheels(args, env), flush=True)
    steps.run("gpu", ["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv"], 30)
    calibrated = REPO / "configs" / "gpus" / "h200.calibrated.yaml"
    if "calibrate" not in args.skip:
        command = [sys.executable, "-m", "megatron_energy.cli", "calibrate", "--loop-s", str(args.loop_s)]
        command += ["--out", str(calibrated), "--json", str(args.out / "calibration.json")]
        steps.run("calibrate", command, 120, log=work / "calibrate.log")
        if calibrated.exists():
            shutil.copy(calibrated, args.out / calibrated.name)
    training_log = ""
    if "dry-run" not in args.skip:
        training_log = steps.run("dry-run", dry_run_command(args, work), 480, log=work / "dry-run.log")
    if "report" not in args.skip:
        report = [sys.executable, "-m", "megatron_energy.cli", "report", "--energy-dir", str(work / "energy")]
        report += ["--log-file", str(work / "energy-log.jsonl")]
        steps.run("report", report, 120, log=args.out / "report.txt")
    if args.overhead_s > 0:
        # bench_overhead starts no pair past its deadline; the margin lets the pair in flight finish
        deadline_s = min(args.overhead_s, args.budget_s - steps.elapsed_s() - PACKING_S - 60)
        command = [sys.executable, "lab/bench_overhead.py", "--modes", "perseus"]
        command += ["--script", str(args.script), "--deadline-s", f"{deadline_s:.0f}"]
        command += ["--out", str(work / "overhead"), "--json", str(args.out / "overhead.json")]
        steps.run("overhead", command, deadline_s + 60, log=work / "overhead.log")
    calibration_log = work / "calibrate.log"
    figures = {
        "steps": steps.results,
        "megatron (dry run), by phase": megatron_figures(training_log),
        "stock plan vs megatron": stock_check_lines(training_log, work / "energy"),
        "our lines": key_lines(training_log, calibration_log.read_text() if calibration_log.exists() else ""),
    }
    (args.out / "key_figures.json").write_text(json.dumps(figures, indent=2))
    pack(args.out, work)
    print("\n=== key figures (each line says measured or modelled)")
    print(json.dumps(figures["steps"]))
    print(f"Megatron's own figures, dry run, by phase: {json.dumps(figures['megatron (dry run), by phase'])}")
    print("\n".join(figures["stock plan vs megatron"]))
    print("\n".join(figures["our lines"]))
    if (args.out / "report.txt").exists():
        print((args.out / "report.txt").read_text())
    print(f"total {steps.elapsed_s():.0f} s (measured wall clock); files in {args.out}")
    failed = [name for name, result in steps.results.items() if result["status"] != 0 and name != "gpu"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
