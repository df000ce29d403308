r"""The plugin's overhead against Megatron itself: the same job in separate processes, plugin loaded or not.

**What it measures.** For each optimiser mode of ``--modes`` (default ``perseus,kareus,kernel,all``) the job
(``lab/gpt_job.py``'s GPT, run by ``--script``, default ``scripts/pretrain_gpt.py``) runs in pairs of
processes:

- *off*: ``python -m torch.distributed.run ... SCRIPT ARGS``: Megatron alone, the plugin not loaded;
- *on*: ``python -m torch.distributed.run ... -m megatron_energy.launch SCRIPT ARGS --energy-optimise
  --energy-dry-run --energy-mode MODE --energy-dir OUT/energy-MODE``.

So everything the plugin costs is inside the difference: the training thread's hooks, and also its
background threads (energy meter, frequency controller, phase switcher) and anything it leaves running,
which the in-process check (``--energy-overhead-check``, ``runtime.energy_log.overhead_check``) cannot see,
since they run in its suspended blocks too. The dry run sets no clock or power limit, so the plan's own
effect is not in the figures either: what remains is the cost of having the plugin in the job.

**Schedule.** One priming plugin run per mode comes first (``--prime-iters``; unmeasured, its log kept): it
profiles and caches the plan in the mode's ``--energy-dir``, so every measured plugin run is a cache hit
from its first iteration (the summary counts the hits); a mode whose energy dir already holds a plan (an
earlier call on the same machine, ``--resume``) is not primed again. Then ``--pairs`` rounds (at least 6):
round ``r`` holds pair ``r`` of every mode, the modes rotated by ``r``, two plugin runs after each plain
run (``off, a, b, off, c, d, ..., off``). Each plugin run is paired with the plain run next to it, the first
of the two with the one before it (off-on), the second with the one after it (on-off), so a plain run is a
side of two pairs (``run_order``): 6 pairs of 4 modes take 37 processes instead of 48, each mode's order
alternates from round to round, and a drift over the session hits every mode, and both sides, alike.

**Figures (all measured).** Megatron's own per-iteration log (``--log-interval 1 --log-energy``, read by
``megatron_energy.megatron.training_log``): "elapsed time per iteration (ms)" and "energy per GPU
(J/iter/GPU)" (Megatron's reading of the NVML energy counter). A run's first ``--warmup`` iterations are
dropped and its figure is the median of the others. Per mode, the overhead is the **median over pairs of
on/off − 1** with its distribution-free sign-test 95 % interval (``stats.paired_median_change``, widened to
be symmetric; 6 pairs give one), for the iteration time and the energy per iteration, and beside them for
the run's wall clock (the plugin's start-up and exit included). The process, not the iteration, is the
unit: allocator state, cuBLAS choices and GPU temperature differ from one process to the next, and those
differences are part of what a pair compares.

**NVML trace (measured, read-only).** Beside it, a thread of this process polls ``nvmlDeviceGetPowerUsage``,
``nvmlDeviceGetUtilizationRates`` and ``nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)`` of NVML devices
``0..--gpus-1`` every 0.5 s (every NVML setter is replaced by a tripwire that raises,
``dvfs.calibration_nvml.SetterTripwires``). Every output line of a run is time-stamped as it arrives, so
each run's samples are those of its kept iterations (from the line of the last warm-up iteration to the
last line); per mode the report gives the median over off runs and over on runs of each run's median
power, utilisation and SM clock, and their difference. Without a GPU (or pynvml) the trace is absent and
one line says so.

**Cost.** On one H200 a run spends ~27 s outside its iterations (torchrun, imports ~12 s, Megatron's
initialisation ~10 s, exit) and ~0.3 s per iteration of the default 4 microbatches of one sequence
(measured 2026-12-04), so a 14-iteration run takes ~32 s and the default four modes of six pairs (37 runs)
~20 min, with the primes ~23 min: more than one 10-minute device call. ``--deadline-s`` starts no run (nor
priming run) that the time left cannot fit, judged by the slowest run so far, and still prints the summary
of what completed; ``--json`` is rewritten after every run, and ``--resume`` goes on from such a file (the
same job and code only; a mode is primed again unless its energy dir, under ``--out``, still holds the
plan):

    python lab/bench_overhead.py --script Megatron-LM/pretrain_gpt.py --deadline-s 540 --json bench.json
    python lab/bench_overhead.py --script Megatron-LM/pretrain_gpt.py --deadline-s 540 \
        --resume bench.json --json bench.json

**In one process.** ``--in-process N --modes MODE`` runs the plugin once with ``--energy-overhead-check N``
instead (blocks of N iterations with the session suspended and active,
``runtime.energy_log.overhead_check``), the safety net held off (in a dry run it can trip only on outside
noise, and would leave the plan), and prints the check's line; ``--json`` keeps its pairs with the job's
shape and a digest of the plugin's sources, and ``--pool earlier.json ...`` adds earlier runs' pairs (alone,
it prints each stored run's check and the pooled one, running nothing; runs of another job or code are
refused):

    python lab/bench_overhead.py --in-process 2 --modes perseus --microbatches 16 --micro-batch-size 2 \
        --iters 210
    python lab/bench_overhead.py --pool tests/data/h200_overhead_run{1,2,3}.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpt_job import gpt_args

import megatron_energy
from megatron_energy.dvfs.calibration_nvml import SetterTripwires
from megatron_energy.energy_dir import overhead_pairs_path
from megatron_energy.megatron.training_log import IterationLine, parse_iteration_lines
from megatron_energy.runtime.energy_log.energy_line import logged_phases
from megatron_energy.runtime.energy_log.overhead_check import OverheadResult, pooled
from megatron_energy.stats import paired_median_change

REPO = Path(__file__).resolve().parents[1]
MODES = ("perseus", "kareus", "kernel", "all")
"""The released optimiser modes (``--energy-mode``), measured by default."""
MIN_PAIRS = 6
"""Fewest pairs per mode: the sign test's 95 % interval needs 6."""
SAMPLE_PERIOD_S = 0.5
"""Seconds between NVML samples."""
CACHE_HIT = "energy cache hit"
"""What the plugin logs when it finds a cached plan (``runtime.planning_round.cache``); a run reused it if it
also kept no profiling iteration."""
MASTER_PORT = "29517"
GPU_FIGURES = ("power_w", "utilisation_pct", "sm_clock_mhz")
"""What the NVML trace samples, as :class:`GpuSample` names them."""
CHANGES = (
    ("iteration time", "iteration_time"),
    ("energy/iteration", "energy_per_iteration"),
    ("run wall clock (start-up and exit included)", "run_wall_clock"),
)
"""The paired changes of a mode's summary: label and key."""
STATISTIC = (
    "median over pairs of on/off - 1 of each run's median over its kept iterations; distribution-free "
    "sign-test 95 % interval (megatron_energy.stats.paired_median_change, widened to be symmetric)"
)

HEADLINE = "median over pairs of on/off - 1, sign-test 95 % interval; all figures measured"

Clock = Callable[[], float]


class RunFailedError(RuntimeError):
    """A run exited with an error or logged no kept iteration."""


# --- the schedule ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One side of a pair that a run is: the pair's mode and index, and which of its runs came first."""

    mode: str
    """The ``--energy-mode`` the pair measures."""
    pair: int
    """The pair's index within its mode."""
    order: str
    """``off-on`` or ``on-off``."""


@dataclass(frozen=True)
class Planned:
    """One run of the schedule: a plugin run is one side of one pair, a plain run of one or two pairs.

    Attributes:
        plugin: Whether the plugin is loaded.
        sides: The pairs the run is a side of: one for a plugin run; for a plain run, the plugin runs next
            to it (the one just before it and the one just after it).
    """

    plugin: bool
    sides: tuple[Side, ...]

    @property
    def mode(self) -> str | None:
        """The plugin's ``--energy-mode``; None for a plain run."""
        return self.sides[0].mode if self.plugin else None

    @property
    def tag(self) -> str:
        """A name for the run's log file."""
        if self.plugin:
            return f"{self.sides[0].mode}-{self.sides[0].pair}-on"
        return "off-" + "+".join(f"{side.mode}-{side.pair}" for side in self.sides)


def run_order(modes: Sequence[str], pairs: int) -> list[Planned]:
    """The runs in the order they run: round ``r`` holds pair ``r`` of every mode.

    A round is the modes rotated left by ``r``, two at a time, each two after a plain run: ``off, a, b, off,
    c, d``; one more plain run ends the schedule. Every plugin run is paired with the plain run next to it:
    the first of each two with the plain run before it (``off-on``), the second with the one after it
    (``on-off``), so every plain run but the first and the last is a side of two pairs, and the rotation
    alternates each mode's order from round to round. 6 pairs of 4 modes take 37 runs instead of 48.

    Args:
        modes: The modes measured.
        pairs: Pairs per mode.

    Returns:
        The runs, in order.
    """
    order: list[Planned] = []
    waiting: Side | None = None  # the plugin run before the next plain run, which is its pair's other side
    for pair in range(pairs):
        shift = pair % len(modes)
        rotated = [*modes[shift:], *modes[:shift]]
        for start in range(0, len(rotated), 2):
            first, *second = rotated[start : start + 2]
            after = Side(first, pair, "off-on")
            order.append(Planned(False, (*([waiting] if waiting else []), after)))
            order.append(Planned(True, (after,)))
            waiting = Side(second[0], pair, "on-off") if second else None
            if waiting:
                order.append(Planned(True, (waiting,)))
    if waiting:
        order.append(Planned(False, (waiting,)))
    return order


# --- running a job ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finished:
    """A finished child process: its status and every output line, stamped when it was received.

    Attributes:
        returncode: The exit status.
        lines: ``(received_s, text)`` per line of stdout and stderr together, on the session's clock.
        started_s: When it was started, on the session's clock.
        ended_s: When it had exited.
    """

    returncode: int
    lines: tuple[tuple[float, str], ...]
    started_s: float
    ended_s: float

    @property
    def text(self) -> str:
        """The whole output."""
        return "\n".join(text for _, text in self.lines)


def run_streaming(command: list[str], env: dict[str, str], clock: Clock) -> Finished:
    """Run ``command`` and stamp each output line as it arrives (the children flush every line).

    Args:
        command: The command line.
        env: Its environment (``PYTHONUNBUFFERED=1`` keeps lines from waiting in a buffer).
        clock: The session's clock.

    Returns:
        The exit status and the stamped lines.
    """
    started = clock()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env
    ) as child:
        assert child.stdout is not None  # stdout=PIPE
        lines = tuple((clock(), line.rstrip("\n")) for line in iter(child.stdout.readline, ""))
        returncode = child.wait()
    return Finished(returncode, lines, started, clock())


@dataclass(frozen=True)
class GpuSample:
    """One NVML poll, averaged over the job's GPUs (all measured).

    Attributes:
        time_s: When it was taken, on the session's clock.
        power_w: ``nvmlDeviceGetPowerUsage``, watts.
        utilisation_pct: ``nvmlDeviceGetUtilizationRates(...).gpu``, per cent.
        sm_clock_mhz: ``nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)``, MHz.
    """

    time_s: float
    power_w: float
    utilisation_pct: float
    sm_clock_mhz: float


class Trace(Protocol):
    """What the benchmark needs of a GPU trace: the samples taken in a time window."""

    def window(self, start_s: float, end_s: float) -> list[GpuSample]:
        """The samples taken in ``[start_s, end_s]`` (the session's clock)."""
        ...


@dataclass(frozen=True)
class Harness:
    """What the benchmark runs with: the session's clock, the child runner and the GPU trace (if any).

    Attributes:
        clock: Seconds since the session began.
        trace: The NVML trace; None without a GPU.
        runner: Runs one command (:func:`run_streaming`; tests give a fake).
    """

    clock: Clock
    trace: Trace | None = None
    runner: Callable[[list[str], dict[str, str], Clock], Finished] = run_streaming

    def run(self, command: list[str], env: dict[str, str]) -> Finished:
        """Run ``command`` on the session's clock."""
        return self.runner(command, env, self.clock)


def session_clock() -> Clock:
    """A clock reading seconds since this call (``perf_counter``)."""
    origin = time.perf_counter()
    return lambda: time.perf_counter() - origin


def child_env(script: Path) -> dict[str, str]:
    """The runs' environment: unbuffered output; the script's folder and the repository on ``PYTHONPATH``.

    The script's folder is there for Megatron-LM's ``pretrain_gpt.py``, which imports ``gpt_builders`` and
    ``model_provider`` from beside it.
    """
    paths = [str(script.resolve().parent), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def energy_dir(args: argparse.Namespace, mode: str) -> Path:
    """The mode's ``--energy-dir``: its priming run caches the plan there for the measured runs."""
    return args.out / f"energy-{mode}"


def primed(args: argparse.Namespace, mode: str) -> bool:
    """Whether the mode's energy dir holds a cached plan (an earlier call on the same machine primed it)."""
    return any(energy_dir(args, mode).glob("*/plan.json"))


def job_command(
    args: argparse.Namespace, mode: str | None, iters: int, extra: Sequence[str] = ()
) -> list[str]:
    """The torchrun command of one run.

    Args:
        args: The script's flags (the job's shape, ``--script``, ``--gpus``, extra ``--energy-*`` flags).
        mode: The plugin's ``--energy-mode``; None runs Megatron alone (the plugin not loaded).
        iters: Training iterations.
        extra: More plugin flags.

    Returns:
        The command line.
    """
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={args.gpus}",
        f"--master-port={MASTER_PORT}",
    ]
    job = gpt_args(args.microbatches, args.micro_batch_size, iters, pipeline=min(args.gpus, 2))
    script = [str(args.script), *job, *args.megatron_args.split()]
    if mode is None:
        return [*command, *script]
    plugin = ["--energy-optimise", "--energy-dry-run", "--energy-mode", mode]
    plugin += ["--energy-dir", str(energy_dir(args, mode)), *args.energy_args, *extra]
    return [*command, "-m", "megatron_energy.launch", *script, *plugin]


def launch(args: argparse.Namespace, harness: Harness, command: list[str], tag: str) -> Finished:
    """Run ``command``, keep its output as ``OUT/log-TAG.txt``; RunFailedError if it exits with an error."""
    finished = harness.run(command, child_env(args.script))
    (args.out / f"log-{tag}.txt").write_text(finished.text)
    if finished.returncode != 0:
        raise RunFailedError(f"run {tag} failed ({finished.returncode}); tail:\n{finished.text[-4000:]}")
    return finished


# --- one run's figures --------------------------------------------------------------------------------


def stamped_iterations(finished: Finished) -> list[tuple[float, IterationLine]]:
    """Megatron's per-iteration lines of a run with the time each was received, in iteration order.

    A repeated iteration keeps its first line (as :func:`parse_iteration_lines` does).
    """
    found: dict[int, tuple[float, IterationLine]] = {}
    for received_s, text in finished.lines:
        for line in parse_iteration_lines(text):
            found.setdefault(line.iteration, (received_s, line))
    return [found[i] for i in sorted(found)]


def iteration_records(finished: Finished, warmup: int) -> list[dict[str, Any]]:
    """Every iteration Megatron logged, with its figures, when it was logged, whether it is kept, its phase.

    Args:
        finished: The run.
        warmup: Iterations ``1..warmup`` are logged but not kept.

    Returns:
        One dict per iteration: ``iteration``, ``logged_s`` (the session's clock), ``elapsed_ms``,
        ``energy_j`` (None without ``--log-energy``), ``kept``, ``phase`` (the plugin's; None without it).
    """
    phases = logged_phases(finished.text)
    return [
        {
            "iteration": line.iteration,
            "logged_s": received_s,
            "elapsed_ms": line.elapsed_ms,
            "energy_j": line.energy_j,
            "kept": line.iteration > warmup,
            "phase": phases.get(line.iteration),
        }
        for received_s, line in stamped_iterations(finished)
    ]


def kept_window(records: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """When the kept iterations ran: from the last warm-up iteration's line to the last kept one's.

    Megatron prints an iteration's line when the iteration ends, so the window starts where the first kept
    iteration starts. None when no warm-up or no kept iteration was logged.
    """
    warm = [record["logged_s"] for record in records if not record["kept"]]
    kept = [record["logged_s"] for record in records if record["kept"]]
    return (warm[-1], kept[-1]) if warm and kept else None


def window_figures(samples: Sequence[GpuSample]) -> dict[str, float] | None:
    """The median of each NVML figure over ``samples`` and their number; None without samples."""
    if not samples:
        return None
    medians = {name: statistics.median(getattr(sample, name) for sample in samples) for name in GPU_FIGURES}
    return {"samples": len(samples), **medians}


def run_figures(finished: Finished, warmup: int, trace: Trace | None) -> dict[str, Any]:
    """One run's figures (all measured): medians over its kept iterations, its NVML window, its iterations.

    Raises:
        RunFailedError: If no iteration after the warm-up was logged.
    """
    records = iteration_records(finished, warmup)
    kept = [record for record in records if record["kept"]]
    if not kept:
        raise RunFailedError(f"no iteration after the {warmup} warm-up ones was logged")
    energies = [record["energy_j"] for record in kept]
    phases = [record["phase"] for record in kept if record["phase"] is not None]
    window = kept_window(records)
    return {
        "wall_s": finished.ended_s - finished.started_s,
        "started_s": finished.started_s,
        "kept_window_s": window,
        "iterations_kept": len(kept),
        "kept_phases": {phase: phases.count(phase) for phase in dict.fromkeys(phases)},
        "cache_hit": CACHE_HIT in finished.text and "profiling" not in phases,
        "median_iteration_ms": statistics.median(record["elapsed_ms"] for record in kept),
        "median_energy_j_per_iter_per_gpu": (
            statistics.median(energies) if all(e is not None for e in energies) else None
        ),
        "nvml": window_figures(trace.window(*window)) if trace is not None and window else None,
        "iterations": records,
    }


# --- the summary --------------------------------------------------------------------------------------


def complete_pairs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of pairs that have both sides (a failure may stop between the two)."""
    sides: dict[tuple[str, int], set[bool]] = {}
    for run in runs:
        sides.setdefault((run["mode"], run["pair"]), set()).add(run["plugin"])
    return [run for run in runs if len(sides[run["mode"], run["pair"]]) == 2]


def _finite(value: float) -> float | None:
    """``value``, or None when infinite (no interval yet): JSON has no infinity."""
    return value if math.isfinite(value) else None


def paired_change(off: Sequence[dict[str, Any]], on: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """The median of the per-pair changes ``on/off - 1`` of ``key`` with its sign-test 95 % interval."""
    before, after = [run[key] for run in off], [run[key] for run in on]
    change = paired_median_change(before, after)
    return {
        "off_per_pair": before,
        "on_per_pair": after,
        "median_change": change.change,
        "low": _finite(change.low),
        "high": _finite(change.high),
        "resolved": change.excludes_zero,
    }


def trace_summary(off: Sequence[dict[str, Any]], on: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Median over the off runs and over the on runs of each run's NVML medians, and on minus off.

    None unless some off run and some on run have samples in their kept windows.
    """
    off_figures = [run["nvml"] for run in off if run["nvml"]]
    on_figures = [run["nvml"] for run in on if run["nvml"]]
    if not off_figures or not on_figures:
        return None
    summary: dict[str, Any] = {"runs_off": len(off_figures), "runs_on": len(on_figures)}
    for name in GPU_FIGURES:
        median_off = statistics.median(figures[name] for figures in off_figures)
        median_on = statistics.median(figures[name] for figures in on_figures)
        summary[name] = {"off": median_off, "on": median_on, "difference": median_on - median_off}
    return summary


def mode_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One mode's complete pairs: the paired changes, the plugin runs' cache hits and the NVML trace."""
    pairs = sorted({run["pair"] for run in runs})
    off = [next(r for r in runs if r["pair"] == pair and not r["plugin"]) for pair in pairs]
    on = [next(r for r in runs if r["pair"] == pair and r["plugin"]) for pair in pairs]
    summary: dict[str, Any] = {
        "pairs": len(pairs),
        "cache_hits": sum(run["cache_hit"] for run in on),
        "iteration_time": paired_change(off, on, "median_iteration_ms"),
    }
    if all(run["median_energy_j_per_iter_per_gpu"] is not None for run in [*off, *on]):
        summary["energy_per_iteration"] = paired_change(off, on, "median_energy_j_per_iter_per_gpu")
    summary["run_wall_clock"] = paired_change(off, on, "wall_s")
    summary["nvml"] = trace_summary(off, on)
    return summary


def summarise(runs: Sequence[dict[str, Any]], modes: Sequence[str]) -> dict[str, Any]:
    """The summary of every mode with a complete pair, in ``modes`` order."""
    complete = complete_pairs(runs)
    measured = [mode for mode in modes if any(run["mode"] == mode for run in complete)]
    return {
        "source": "measured (Megatron's iteration timer and NVML energy counter; NVML trace read-only)",
        "statistic": STATISTIC,
        "modes": {mode: mode_summary([run for run in complete if run["mode"] == mode]) for mode in measured},
    }


def change_text(change: dict[str, Any], pairs: int) -> str:
    """A paired change as the report states it: the median, its interval and whether it excludes zero."""
    median = f"{100 * change['median_change']:+.2f} %"
    if change["low"] is None:
        return f"{median} (no 95 % interval from {pairs} pairs: it needs {MIN_PAIRS})"
    verdict = "resolved" if change["resolved"] else "within noise"
    return f"{median} (95 % CI {100 * change['low']:+.2f} to {100 * change['high']:+.2f} %, {verdict})"


def trace_text(trace: dict[str, Any]) -> str:
    """The NVML trace's medians of one mode, off vs on."""
    power, busy, clock = (trace[name] for name in GPU_FIGURES)
    return (
        f"power {power['off']:.0f} W off, {power['on']:.0f} W on ({power['difference']:+.0f} W); "
        f"utilisation {busy['off']:.0f} % vs {busy['on']:.0f} % ({busy['difference']:+.0f} points); "
        f"SM clock {clock['off']:.0f} vs {clock['on']:.0f} MHz ({clock['difference']:+.0f} MHz)"
    )


def report_lines(summary: dict[str, Any], traced: bool) -> list[str]:
    """The closing lines: per mode the paired changes, then (when traced) the NVML trace."""
    if not summary["modes"]:
        return ["no complete pair: nothing to compare"]
    lines = [f"plugin on vs Megatron alone, separate processes, per mode ({HEADLINE}):"]
    for mode, figures in summary["modes"].items():
        pairs = figures["pairs"]
        changes = [f"{label} {change_text(figures[key], pairs)}" for label, key in CHANGES if key in figures]
        hits = f"{figures['cache_hits']} of {pairs} plugin runs reused the cached plan"
        lines.append(f"{mode} (measured, {pairs} pairs; {hits}): " + "; ".join(changes))
        if traced:
            trace = figures["nvml"]
            described = trace_text(trace) if trace else "no sample inside the kept iterations"
            lines.append(
                f"{mode} NVML trace (measured, read-only, medians over kept iterations): {described}"
            )
    return lines


# --- the NVML trace -----------------------------------------------------------------------------------


class NvmlTrace:
    """A thread polling power, utilisation and SM clock of some GPUs every period (read-only NVML calls).

    Args:
        nvml: The ``pynvml`` module, initialised (or a stand-in with the same functions).
        handles: The devices sampled; a sample is their mean.
        period_s: Seconds between samples.
        clock: The session's clock.
    """

    def __init__(self, nvml: Any, handles: Sequence[object], period_s: float, clock: Clock) -> None:
        self._nvml = nvml
        self._handles = list(handles)
        self._period_s = period_s
        self._clock = clock
        self.samples: list[GpuSample] = []
        self.error: str | None = None
        """Why sampling stopped early (an NVML error), if it did."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="nvml-trace", daemon=True)

    def __enter__(self) -> NvmlTrace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._nvml.nvmlShutdown()

    def _read(self) -> GpuSample:
        """One sample: each figure's mean over the devices."""
        nvml, now = self._nvml, self._clock()
        readings = [
            (
                nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            )
            for handle in self._handles
        ]
        power, busy, clock = (statistics.fmean(values) for values in zip(*readings, strict=True))
        return GpuSample(now, power, busy, clock)

    def _poll(self) -> None:
        try:
            while not self._stop.is_set():
                self.samples.append(self._read())
                self._stop.wait(self._period_s)
        except self._nvml.NVMLError as problem:
            self.error = f"NVML trace stopped after {len(self.samples)} samples: {problem}"

    def window(self, start_s: float, end_s: float) -> list[GpuSample]:
        """The samples taken in ``[start_s, end_s]``."""
        return [sample for sample in list(self.samples) if start_s <= sample.time_s <= end_s]


def open_trace(gpus: int, clock: Clock) -> tuple[NvmlTrace | None, str]:
    """The NVML trace of devices ``0..gpus-1`` (not started), or None without pynvml or a GPU; and a line."""
    try:
        import pynvml
    except ImportError as problem:
        return None, f"NVML trace: absent (pynvml does not import: {problem})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as problem:
        return None, f"NVML trace: absent, no GPU to sample (NVML: {problem})"
    count = min(gpus, pynvml.nvmlDeviceGetCount())
    if count == 0:
        pynvml.nvmlShutdown()
        return None, "NVML trace: absent, NVML sees no GPU"
    SetterTripwires().install(pynvml)  # a setter reached by mistake raises before it changes the GPU
    handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
    line = (
        f"NVML trace (measured, read-only): power, utilisation and SM clock of NVML device(s) 0..{count - 1} "
        f"every {SAMPLE_PERIOD_S} s, attributed to each run's kept iterations"
    )
    return NvmlTrace(pynvml, handles, SAMPLE_PERIOD_S, clock), line


# --- the session --------------------------------------------------------------------------------------


def code_digest() -> str:
    """A digest of the package's sources: stored runs are reused only when they ran the same plugin."""
    digest = hashlib.sha256()
    package = Path(megatron_energy.__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def bench_job(args: argparse.Namespace) -> dict[str, Any]:
    """What makes two sessions' runs the same measurement: the job, its script and the code."""
    return {
        "script": str(args.script),
        "microbatches": args.microbatches,
        "micro_batch_size": args.micro_batch_size,
        "iters": args.iters,
        "warmup": args.warmup,
        "gpus": args.gpus,
        "megatron_args": args.megatron_args,
        "energy_args": args.energy_args,
        "code": code_digest(),
    }


def stored_runs(path: Path | None, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The complete pairs' runs of a ``--resume`` file (none without one).

    Raises:
        SystemExit: If the file's runs are of another job or code.
    """
    if path is None:
        return []
    document = json.loads(path.read_text())
    if document.get("job") != job:
        raise SystemExit(f"cannot resume {path}: its job differs ({document.get('job')} vs {job})")
    return complete_pairs(document["runs"])


class Session:
    """The measured runs of one invocation, the stored ones they add to, and the file that keeps them.

    Args:
        args: The script's flags.
        harness: Clock, runner and trace.
    """

    def __init__(self, args: argparse.Namespace, harness: Harness) -> None:
        self.args = args
        self.harness = harness
        self.job = bench_job(args)
        self.runs = stored_runs(args.resume, self.job)
        self.primes: list[dict[str, Any]] = []
        self.path: Path = args.json or args.out / "bench.json"

    def fits(self, runs: int) -> bool:
        """Whether ``runs`` more runs fit before ``--deadline-s``, judged by the slowest run so far."""
        if self.args.deadline_s is None:
            return True
        slowest_s = max((run["wall_s"] for run in [*self.runs, *self.primes]), default=0.0)
        return self.harness.clock() + runs * slowest_s <= self.args.deadline_s

    def prime(self, mode: str) -> None:
        """The mode's unmeasured plugin run: it profiles and caches the plan; its log is kept."""
        tag = f"prime-{mode}"
        command = job_command(self.args, mode, self.args.prime_iters)
        finished = launch(self.args, self.harness, command, tag)
        wall_s = finished.ended_s - finished.started_s
        energy_lines = [line for line in finished.text.splitlines() if "[energy]" in line][-3:]
        self.primes.append(
            {"mode": mode, "wall_s": wall_s, "log": f"log-{tag}.txt", "energy_lines": energy_lines}
        )
        print(f"primed {mode}: {wall_s:.0f} s (measured wall clock; not one of the pairs)", flush=True)

    def measure(self, planned: Planned, done: set[tuple[str, int]]) -> None:
        """Run one side of one or two pairs, keep its figures and rewrite the JSON file.

        A plain run that is a side of two pairs is kept once per pair still to do, with the same figures.
        """
        command = job_command(self.args, planned.mode, self.args.iters)
        finished = launch(self.args, self.harness, command, planned.tag)
        try:
            figures = run_figures(finished, self.args.warmup, self.harness.trace)
        except RunFailedError as problem:
            raise RunFailedError(f"run {planned.tag}: {problem}") from problem
        for side in planned.sides:
            if (side.mode, side.pair) not in done:
                run = {"mode": side.mode, "pair": side.pair, "plugin": planned.plugin, "order": side.order}
                self.runs.append({**run, "run": planned.tag, **figures})
        energy = figures["median_energy_j_per_iter_per_gpu"]
        print(
            f"{planned.tag}: median {figures['median_iteration_ms']:.1f} ms"
            + ("" if energy is None else f", {energy:.1f} J/iter/GPU")
            + f" over {figures['iterations_kept']} kept iterations, {figures['wall_s']:.0f} s (measured)",
            flush=True,
        )
        self.save()

    def save(self) -> dict[str, Any]:
        """Write the job, the primes, every run and the summary to the JSON file; return the summary."""
        summary = summarise(self.runs, self.args.modes)
        document = {"summary": summary, "job": self.job, "primes": self.primes, "runs": self.runs}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(document, indent=1))
        return summary


def run_session(session: Session) -> None:
    """Prime every mode with pairs left, then run the runs left, in order, while they fit.

    Raises:
        RunFailedError: If a run fails (what completed is kept).
    """
    args = session.args
    done = {(run["mode"], run["pair"]) for run in session.runs}
    left = [
        planned
        for planned in run_order(args.modes, args.pairs)
        if any((side.mode, side.pair) not in done for side in planned.sides)
    ]
    if args.prime_iters > 0:
        for mode in dict.fromkeys(planned.mode for planned in left if planned.mode):
            if primed(args, mode):
                print(f"{mode}: its energy dir holds a plan already; not primed again", flush=True)
                continue
            if not session.fits(1):
                print(f"deadline: {mode} not primed; no pair run", flush=True)
                return
            session.prime(mode)
    for count, planned in enumerate(left):
        if not session.fits(1):
            print(f"deadline: {count} of the {len(left)} runs left were run", flush=True)
            return
        session.measure(planned, done)


def benchmark(args: argparse.Namespace, harness: Harness) -> int:
    """The pairs of runs of the module docstring; print the summary of what completed.

    Returns:
        0, or 1 when a run failed (the summary then covers the pairs completed before it).
    """
    args.out.mkdir(parents=True, exist_ok=True)
    session = Session(args, harness)
    status = 0
    try:
        run_session(session)
    except RunFailedError as failure:
        print(failure, flush=True)
        status = 1
    summary = session.save()
    print(json.dumps(summary, indent=1))
    print("\n".join(report_lines(summary, traced=harness.trace is not None)))
    print(f"every run's iterations and the summary: {session.path}")
    return status


# --- in one process, and stored runs ------------------------------------------------------------------


def in_process_job(args: argparse.Namespace) -> dict[str, Any]:
    """What makes two in-process runs the same measurement (besides the code); runs of any length pool."""
    return {
        "microbatches": args.microbatches,
        "micro_batch_size": args.micro_batch_size,
        "gpus": args.gpus,
        "block": args.in_process,
        "mode": args.modes[0],
        "energy_args": args.energy_args,
    }


def in_process(args: argparse.Namespace, harness: Harness) -> int:
    """One plugin run with the in-process check (``runtime.energy_log.overhead_check``); print its lines.

    The safety net is held off (more violating steps needed than the run has): in a dry run no clock
    changes, so it can trip only on disturbances from outside the job, and once tripped the session stops
    running the plan (measured on a shared H200: 81 of 89 kept iterations after such a trip), so the active
    blocks would time a session that only watches, not the plugin's cost of running the plan.
    """
    args.out.mkdir(parents=True, exist_ok=True)
    mode = args.modes[0]
    pairs_file = overhead_pairs_path(energy_dir(args, mode), 0)
    pairs_file.unlink(missing_ok=True)  # a previous run's, on a machine that keeps build outputs
    check = ["--energy-overhead-check", str(args.in_process), "--energy-safety-steps", str(args.iters + 1)]
    finished = launch(args, harness, job_command(args, mode, args.iters, check), "in-process")
    run = {
        k: v for k, v in run_figures(finished, args.warmup, None).items() if k not in ("iterations", "nvml")
    }
    lines = [
        line for line in finished.text.splitlines() if "overhead check" in line or "plugin host time" in line
    ]
    print(json.dumps(run), flush=True)
    print("\n".join(lines) if lines else f"no overhead-check line in the log: see {args.out}")
    if not pairs_file.exists():
        return 1
    record = {"code": code_digest(), "job": in_process_job(args), "pairs": json.loads(pairs_file.read_text())}
    if args.json is not None:
        args.json.write_text(json.dumps({**record, "run": run}, indent=1))
    if args.pool:
        return print_pooled([record, *(json.loads(path.read_text()) for path in args.pool)], args.pool)
    return 0


def summarise_stored(paths: list[Path]) -> int:
    """Print the check of each stored in-process run, then over all their pairs (one job and code only)."""
    records = []
    for path in paths:
        try:
            record = json.loads(path.read_text())
            result = OverheadResult.from_json(record.get("pairs", {}))
        except (OSError, ValueError) as problem:
            print(f"cannot read {path}: {problem}")
            return 1
        print(f"{path}: {result.describe(clocks_set=False)}")
        records.append(record)
    return print_pooled(records, paths[1:])


def print_pooled(records: list[dict[str, Any]], earlier: list[Path]) -> int:
    """Print the check over the first record's pairs and the others'; refuse runs of another job or code."""
    for record, path in zip(records[1:], earlier, strict=True):
        for key in ("code", "job"):
            if record.get(key) != records[0][key]:
                print(f"cannot pool {path}: its {key} differs ({record.get(key)} vs {records[0][key]})")
                return 1
    try:
        result = pooled([OverheadResult.from_json(record.get("pairs", {})) for record in records])
    except ValueError as problem:
        print(f"cannot pool: {problem}")
        return 1
    print(f"pooled over {len(records)} runs: {result.describe(clocks_set=False)}")
    return 0


# --- the command line ---------------------------------------------------------------------------------


def mode_list(text: str) -> tuple[str, ...]:
    """``--modes``: comma-separated, non-empty, each once."""
    modes = tuple(mode.strip() for mode in text.split(","))
    if not all(modes) or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct mode names separated by commas")
    return modes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's flags (see the module docstring); bad values exit with a message."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", type=mode_list, default=MODES, help="comma-separated --energy-mode values")
    parser.add_argument("--pairs", type=int, default=MIN_PAIRS, help=f"pairs per mode (at least {MIN_PAIRS})")
    parser.add_argument(
        "--script", type=Path, default=Path("scripts/pretrain_gpt.py"), help="pretrain script"
    )
    parser.add_argument("--microbatches", type=int, default=4, help="microbatches per iteration")
    parser.add_argument("--micro-batch-size", type=int, default=1, help="sequences per microbatch")
    parser.add_argument("--iters", type=int, default=20, help="training iterations per run")
    parser.add_argument("--warmup", type=int, default=5, help="first iterations of a run not kept")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of the job (pipeline-parallel up to 2)")
    parser.add_argument(
        "--megatron-args",
        default="",
        help="more Megatron flags for both sides of every pair, e.g. '--cuda-graph-impl full_iteration'",
    )
    parser.add_argument(
        "--prime-iters", type=int, default=28, help="iterations of each mode's priming run (0: none)"
    )
    parser.add_argument("--deadline-s", type=float, default=None, help="start no run past this many seconds")
    parser.add_argument("--out", type=Path, default=Path("build/bench_overhead"), help="logs, energy dirs")
    parser.add_argument("--json", type=Path, default=None, help="runs and summary (default OUT/bench.json)")
    parser.add_argument("--resume", type=Path, default=None, help="a --json file of this job: go on from it")
    parser.add_argument(
        "--in-process",
        type=int,
        default=0,
        metavar="N",
        help="instead of pairs of runs, one plugin run of one mode with --energy-overhead-check N",
    )
    parser.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        default=[],
        metavar="JSON",
        help="in-process runs' --json files: with --in-process, also the check over all their pairs; alone, "
        "each stored run's check and the pooled one (nothing runs)",
    )
    parser.add_argument(
        "energy_args", nargs="*", help="extra --energy-* flags for the plugin runs (after --)"
    )
    args = parser.parse_args(argv)
    if args.pairs < MIN_PAIRS:
        parser.error(f"--pairs must be at least {MIN_PAIRS}: fewer give no 95 % interval for the median")
    if args.warmup < 1 or args.iters <= args.warmup:
        parser.error(f"--iters ({args.iters}) must exceed --warmup ({args.warmup}), which must be at least 1")
    if min(args.microbatches, args.micro_batch_size, args.gpus) < 1 or args.prime_iters < 0:
        parser.error(
            "--microbatches, --micro-batch-size and --gpus must be at least 1, --prime-iters 0 or more"
        )
    if args.in_process and (len(args.modes) != 1 or args.resume):
        parser.error("--in-process checks one mode (--modes MODE) and resumes nothing")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pool and not args.in_process:
        return summarise_stored(args.pool)
    clock = session_clock()
    if args.in_process:
        return in_process(args, Harness(clock, None, run_streaming))
    trace, line = open_trace(args.gpus, clock)
    print(line, flush=True)
    with trace or contextlib.nullcontext():
        status = benchmark(args, Harness(clock, trace, run_streaming))
    if trace is not None and trace.error:
        print(trace.error)
    return status


if __name__ == "__main__":
    sys.exit(main())
