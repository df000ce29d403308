r"""The power swing of a real Megatron job on one GPU, read-only: Megatron alone, then with the plugin.

**What it runs.** For each job of ``--jobs`` (default both of :data:`JOBS`, ``lab/gpt_job.py``'s GPT on
``--script``, default ``upstream/pretrain_gpt.py``):

- ``gpu-bound``: 8 microbatches of 2 sequences (~935 ms a step on an H100);
- ``host-bound``: 4 microbatches of 1 sequence (~300 ms a step);

two processes, one after the other: Megatron alone (``python -m torch.distributed.run --nproc-per-node 1
SCRIPT ARGS``), then the same with the plugin (``-m megatron_energy.launch SCRIPT ARGS --energy-optimise
--energy-dry-run --energy-power-trace csv --energy-power-sample-ms PLUGIN_MS``; the dry run sets no clock).
Throughout both, a thread of this process reads NVML device 0 every ``--period-ms`` (default 10 ms) with the
plugin's own reader (``dvfs.power_reader``: averaged power, the instant-power field 186, SM clock; every NVML
setter is replaced by a tripwire that raises, ``dvfs.calibration_nvml.SetterTripwires``). Megatron prints a
line per iteration (``--log-interval 1``); each line is stamped as it arrives, on ``time.monotonic``, the
clock the plugin's trace uses too, so the stamps are the iterations' ends.

**Figures (all measured).** Over each run's iterations after ``--warmup`` (and, with the plugin, after its
last profiling iteration: its synchronous profile steps wait for the device), per iteration
(``runtime.energy_log.power_interval.interval_power`` on ``power_swing.swing_figures``): swing from peak to
trough, the largest ramps up and down, the share of fluctuation energy in the grid band up to what the
reads resolve (5 Hz at the field's ~100 ms refresh); for the run, the instant power's range and mean, the SM
clock's median and minimum. For the plugin's run, the same twice: from this script's 10 ms reads, and from
the plugin's own trace (its reads every ``PLUGIN_MS``, its iteration ends), so the two can be compared; and
the count of power records the plugin wrote to its energy log, and the plugin's closing line of its own cost
(the power sampler's CPU time per step among its threads').

**Files** (``--out``, default ``build/power_swing``; at most 8): ``power_swing.json`` (every figure, rewritten
after each run), ``runs.log`` (every run's output), and per job ``JOB-plain.csv`` and ``JOB-plugin.csv``
(this script's reads and the iteration ends, ``runtime.energy_log.power_trace_file``'s CSV) and
``JOB-plugin-own.csv`` (the plugin's trace). The plugin's energy dirs go under ``--work``.

**Cost.** A run starts in ~25 s, then ``--iters`` iterations (default 30: ~30 s gpu-bound, ~10 s
host-bound); the four runs take ~3 min on one H100. ``--deadline-s`` starts no run that the time left cannot
fit, judged by the slowest run so far (:data:`FIRST_RUN_S` before the first)::

    python lab/power_swing_trace.py --script upstream/pretrain_gpt.py --deadline-s 480
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench_overhead import MASTER_PORT, Finished, child_env, run_streaming
from gpt_job import gpt_args

from megatron_energy.dvfs.calibration_nvml import SetterTripwires
from megatron_energy.dvfs.power_reader import PowerReader
from megatron_energy.dvfs.power_sampler import PowerSampler, PowerSamples
from megatron_energy.megatron.training_log import parse_iteration_lines
from megatron_energy.runtime.energy_log.energy_line import logged_phases
from megatron_energy.runtime.energy_log.power_interval import GpuPowerInterval, interval_power
from megatron_energy.runtime.energy_log.power_record import read_power_records
from megatron_energy.runtime.energy_log.power_trace_file import PowerTraceWriter, read_power_trace
from megatron_energy.runtime.session_phase import SessionPhase

HOST_COST = "plugin host time on the training thread"
"""The plugin's closing line of its own cost, its background threads' CPU time included
(``runtime.energy_log.host_cost``)."""
FIRST_RUN_S = 120.0
"""What a run is assumed to take before one has run (start-up ~25 s, 30 gpu-bound iterations, exit)."""


@dataclass(frozen=True)
class Job:
    """One of the jobs: its batch."""

    name: str
    microbatches: int
    micro_batch_size: int


JOBS = {job.name: job for job in (Job("gpu-bound", 8, 2), Job("host-bound", 4, 1))}
"""The jobs of ``lab/bench_overhead.py``'s runs (module docstring)."""


def iteration_ends(lines: Sequence[tuple[float, str]]) -> list[tuple[int, float]]:
    """Each iteration Megatron logged and when its line arrived (its end), oldest first, first line kept."""
    ends: dict[int, float] = {}
    for stamp, text in lines:
        for line in parse_iteration_lines(text):
            ends.setdefault(line.iteration, stamp)
    return sorted(ends.items())


def kept_after(text: str, warmup: int) -> int:
    """The last iteration left out: ``warmup``, or the plugin's last profiling iteration if later.

    The plugin's synchronous profiling steps wait for the device, which changes the power they draw; its
    ``[energy]`` line of each iteration (``--log-interval 1``) names the phase.
    """
    profiling = [i for i, phase in logged_phases(text).items() if phase.startswith(SessionPhase.PROFILING)]
    return max([warmup, *profiling])


def run_figures(samples: PowerSamples, ends: Sequence[tuple[int, float]], warmup: int) -> dict[str, Any]:
    """The figures of the iterations after ``warmup`` (module docstring), JSON-ready; ``{}`` without any.

    Args:
        samples: The reads over the run.
        ends: Each iteration's end, oldest first.
        warmup: Iterations ``1..warmup`` are left out; the last of them starts the first kept one.
    """
    start = [time_s for iteration, time_s in ends if iteration == warmup]
    kept = [(iteration, time_s) for iteration, time_s in ends if iteration > warmup]
    power = interval_power(samples, start[0], kept) if start and kept else None
    if power is None:
        return {}
    return {"figures": asdict(power), "summary": summary(power)}


def summary(power: GpuPowerInterval) -> dict[str, float | int | None]:
    """Medians and extremes over the iterations of ``power``."""
    swings = power.iterations

    def median(name: str) -> float | None:
        return statistics.median(getattr(s, name) for s in swings) if swings else None

    return {
        "iterations": len(swings),
        "iteration_s_median": median("duration_s"),
        "swing_w_median": median("swing_w"),
        "swing_w_max": max((s.swing_w for s in swings), default=None),
        "trough_w_median": median("trough_w"),
        "peak_w_median": median("peak_w"),
        "ramp_up_w_per_s_max": max((s.ramp_up_w_per_s for s in swings), default=None),
        "ramp_down_w_per_s_max": max((s.ramp_down_w_per_s for s in swings), default=None),
        "band_share_median": median("band_share"),
    }


def summary_line(label: str, figures: dict[str, Any]) -> str:
    """One line of a run's figures, each marked measured."""
    if not figures:
        return f"{label}: no kept iteration was read"
    power, brief = figures["figures"], figures["summary"]
    low, high = power["band_hz"]
    share = "n/a" if brief["band_share_median"] is None else f"{brief['band_share_median']:.3f}"

    def watts(name: str, unit: str = "W") -> str:
        value = brief[name]
        return "n/a" if value is None else f"{value:.0f} {unit}"

    return (
        f"{label} (measured, {power['instant_source']}, reads every {1e3 * power['resolution_s']:.0f} ms): "
        f"{brief['iterations']} iterations of {1e3 * (brief['iteration_s_median'] or 0):.0f} ms; instant "
        f"{power['instant_min_w']:.0f}-{power['instant_max_w']:.0f} W, mean {power['instant_mean_w']:.0f} W, "
        f"averaged {power['average_w']:.0f} W; per iteration swing median {watts('swing_w_median')} (max "
        f"{watts('swing_w_max')}), trough {watts('trough_w_median')}, peak {watts('peak_w_median')}; largest "
        f"ramps up {watts('ramp_up_w_per_s_max', 'W/s')}, down {watts('ramp_down_w_per_s_max', 'W/s')} "
        f"(bins of {1e3 * power['band_resolution_s']:.0f} ms); band share {low:g}-{high:g} Hz median "
        f"{share}; "
        f"SM clock median {power['sm_clock_median_mhz']:.0f} MHz, min {power['sm_clock_min_mhz']:.0f} MHz"
    )


def command(args: argparse.Namespace, job: Job, plugin: bool) -> list[str]:
    """The torchrun command of one run: Megatron alone, or with the plugin in a dry run tracing power."""
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=1",
        f"--master-port={MASTER_PORT}",
    ]
    megatron = [str(args.script), *gpt_args(job.microbatches, job.micro_batch_size, args.iters)]
    if not plugin:
        return [*torchrun, *megatron]
    flags = ["--energy-optimise", "--energy-dry-run", "--energy-dir", str(energy_dir(args, job))]
    flags += ["--energy-power-trace", "csv", "--energy-power-sample-ms", str(args.plugin_ms)]
    flags += ["--energy-log-file", str(energy_dir(args, job) / "energy.jsonl")]
    return [*torchrun, "-m", "megatron_energy.launch", *megatron, *flags]


def energy_dir(args: argparse.Namespace, job: Job) -> Path:
    """The plugin's ``--energy-dir`` of ``job`` (emptied first: its files stay out of ``--out``)."""
    return args.work / f"energy-{job.name}"


class Reads:
    """NVML device 0 read every period on a thread, read-only (setters wired to raise)."""

    def __init__(self, period_s: float) -> None:
        import pynvml

        pynvml.nvmlInit()
        SetterTripwires().install(pynvml)
        self.reader = PowerReader(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
        self.period_s = period_s

    def during(self, argv: list[str], env: dict[str, str]) -> tuple[Finished, PowerSamples]:
        """Run ``argv`` while reading; its stamped output and the reads over it."""
        sampler = PowerSampler(self.reader, self.period_s)
        sampler.start()
        try:
            finished = run_streaming(argv, env, time.monotonic)
        finally:
            sampler.close()
        if sampler.error:
            print(sampler.error, flush=True)
        return finished, sampler.samples(finished.started_s, finished.ended_s)


def traced_run(
    args: argparse.Namespace, reads: Reads, job: Job, plugin: bool, log: Any
) -> tuple[Finished, dict[str, Any]]:
    """One run: its output appended to ``log``, this script's reads written as ``JOB-plain|plugin.csv``."""
    tag = f"{job.name}-{'plugin' if plugin else 'plain'}"
    argv = command(args, job, plugin)
    finished, samples = reads.during(argv, child_env(args.script))
    log.write(f"== {tag}: {' '.join(argv)}\n{finished.text}\n== exit {finished.returncode}\n")
    log.flush()
    ends = iteration_ends(finished.lines)
    path = args.out / f"{tag}.csv"
    path.unlink(missing_ok=True)
    if len(samples):
        PowerTraceWriter(path, "csv", rank=0, gpu=0).append(samples, ends)
    warmup = kept_after(finished.text, args.warmup)
    figures = run_figures(samples, ends, warmup)
    print(summary_line(f"{tag}, this script's reads", figures), flush=True)
    cost = [text.strip() for _, text in finished.lines if HOST_COST in text]
    for line in cost:  # the sampler's CPU time is in it ("power sampler ... ms"), measured
        print(f"{tag}: {line}", flush=True)
    return finished, {
        "warmup": warmup,
        "host_cost": cost,
        "tag": tag,
        "returncode": finished.returncode,
        "wall_s": finished.ended_s - finished.started_s,
        **figures,
    }


def plugin_own(args: argparse.Namespace, job: Job, warmup: int) -> dict[str, Any]:
    """The plugin's own trace of ``job`` (copied to ``JOB-plugin-own.csv``) and its energy log's records."""
    traces = sorted(energy_dir(args, job).glob("*/power_trace.rank0.csv"))
    if not traces:
        print(f"{job.name}-plugin: the plugin wrote no power trace", flush=True)
        return {}
    copy = args.out / f"{job.name}-plugin-own.csv"
    shutil.copyfile(traces[-1], copy)
    trace = read_power_trace(copy)
    figures = run_figures(trace.samples, trace.ends, warmup)
    log_file = energy_dir(args, job) / "energy.jsonl"
    records = read_power_records(log_file) if log_file.exists() else []
    print(summary_line(f"{job.name}-plugin, the plugin's own trace", figures), flush=True)
    print(f"{job.name}-plugin: {len(records)} power records in its energy log", flush=True)
    return {"tag": f"{job.name}-plugin-own", "records": len(records), **figures}


def ensure_dataset_makefile() -> None:
    """An empty Makefile where Megatron's start-up runs one, as ``lab/gpu_graphs_check.sh`` writes.

    The megatron-core wheel ships the compiled dataset helpers but not their Makefile.
    """
    import megatron.core.datasets as datasets

    makefile = Path(datasets.__file__).parent / "Makefile"
    if not makefile.exists():
        makefile.write_text("default:\n\t@true\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ensure_dataset_makefile()
    reads = Reads(args.period_ms / 1000.0)
    began, slowest_s, results = time.monotonic(), FIRST_RUN_S, []
    with (args.out / "runs.log").open("w") as log:
        for name in args.jobs:
            job = JOBS[name]
            shutil.rmtree(energy_dir(args, job), ignore_errors=True)
            for plugin in (False, True):
                if args.deadline_s is not None and time.monotonic() - began + slowest_s > args.deadline_s:
                    print(f"deadline: {name} {'plugin' if plugin else 'plain'} run not started", flush=True)
                    continue
                finished, figures = traced_run(args, reads, job, plugin, log)
                slowest_s = max(slowest_s if results else 0.0, finished.ended_s - finished.started_s)
                results.append(figures)
                if plugin:
                    results.append(plugin_own(args, job, figures["warmup"]))
                stored = {"args": vars_json(args), "runs": results}
                (args.out / "power_swing.json").write_text(json.dumps(stored, indent=1))
    return 0 if all(run.get("returncode", 0) == 0 for run in results) else 1


def vars_json(args: argparse.Namespace) -> dict[str, Any]:
    """The script's flags, JSON-ready."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's flags (see the module docstring); bad values exit with a message."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--script", type=Path, default=Path("upstream/pretrain_gpt.py"), help="pretrain script"
    )
    parser.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated, of {', '.join(JOBS)}")
    parser.add_argument("--iters", type=int, default=30, help="training iterations per run")
    parser.add_argument("--warmup", type=int, default=8, help="first iterations of a run not kept")
    parser.add_argument("--period-ms", type=float, default=10.0, help="this script's NVML read period")
    parser.add_argument("--plugin-ms", type=float, default=20.0, help="the plugin's --energy-power-sample-ms")
    parser.add_argument("--deadline-s", type=float, default=None, help="start no run past this many seconds")
    parser.add_argument("--out", type=Path, default=Path("build/power_swing"), help="figures, traces, log")
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "power_swing", help="energy dirs"
    )
    args = parser.parse_args(argv)
    args.jobs = [name.strip() for name in args.jobs.split(",") if name.strip()]
    unknown = [name for name in args.jobs if name not in JOBS]
    if unknown:
        parser.error(f"unknown job(s) {', '.join(unknown)}; give some of {', '.join(JOBS)}")
    if not 1 <= args.warmup < args.iters - 1:
        parser.error(f"--warmup ({args.warmup}) must be at least 1 and leave two of --iters ({args.iters})")
    if not 10 <= args.period_ms <= 1000 or not 10 <= args.plugin_ms <= 1000:
        parser.error(
            "--period-ms and --plugin-ms must be 10-1000 ms (NVML refreshes the field every ~100 ms)"
        )
    return args


if __name__ == "__main__":
    sys.exit(main())
