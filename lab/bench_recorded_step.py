r"""What the recorded step costs against a normal step, in three GPT jobs on one GPU (kernel mode, dry run).

**What it runs.** Each job of ``--jobs`` (default all three of :data:`JOBS`) is one process,
``python -m torch.distributed.run --nproc-per-node 1 -m megatron_energy.launch SCRIPT ARGS --energy-optimise
--energy-dry-run --energy-mode kernel --energy-dir OUT/energy-JOB --energy-profile-iters 1`` with
``lab/gpt_job.py``'s GPT (16 layers, hidden 2048, seq 2048, local transformer implementation):

- ``gpu-bound``: 8 microbatches of 2 sequences (~940 ms a step on an H100);
- ``user-shaped``: the same batch with :data:`gpt_job.USER_SHAPED` (GQA, SwiGLU, RMSNorm, RoPE, the
  distributed optimizer, ``--overlap-grad-reduce``, ``--manual-gc``);
- ``host-bound``: 4 microbatches of 1 sequence (~300 ms a step).

The energy dir is emptied first, so the plugin profiles: a settling step, the stock baseline's pilot of 4
lagged steps (more if their spread asks for it: ``runtime.profiling.baseline_length``), one synchronous
profile step (``--energy-profile-iters 1``, the fewest), then the recorded step
(``runtime.profiling.torch_recorder``): iteration 7 when the pilot suffices. The dry run sets no clock.

**Figures (all measured).** Megatron's own per-iteration log (``--log-interval 1``, read by
``megatron_energy.megatron.training_log``) and the plugin's line for the recorded step
(``runtime.profiling.recorded_step``: rank 0 logs it once the trace is written; it names the iteration):

- the recorded step: Megatron's elapsed time of the iteration the line names;
- the normal step: the median over the other iterations after ``--warmup`` (the first iterations: CUDA and
  allocator warm-up, cuBLAS choices, the settling step; the session is built in iteration 1), leaving out the
  recorded step and the one after it;
- their ratio, the target being at most 1.3;
- the step after the recorded one, and its ratio, apart: the writer thread may still be stopping the
  profiler or exporting the trace (which holds the GIL) then, and the reading child starts, so whatever the
  recorded step sheds onto it shows;
- from the plugin's line: the profiler's start and the collection toggles (training thread), the profiler's
  stop and the trace's export (writer thread), in ms, and the trace's size;
- whether the timelines were read into phases before the run ended (the plugin's ``phases inside
  instructions`` line), so a run also shows that the recording still serves the phase planner.

**Cost.** A job starts in ~25 s, then ``--iters`` iterations (default 24: the recorded step, a few after it,
and room for a stock baseline that grows past its pilot; 16 held no recorded step in either job of the first
H100 run); the three jobs take ~3 min on one H100. ``--deadline-s`` starts no job that the time left cannot
fit, judged by the slowest job so far (:data:`FIRST_JOB_S` before the first); ``--json`` is rewritten after
every job::

    python lab/bench_recorded_step.py --script upstream/pretrain_gpt.py --deadline-s 420 --json recorded.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_overhead import MASTER_PORT, Harness, RunFailedError, launch, run_streaming, session_clock
from gpt_job import gpt_args

from megatron_energy.megatron.training_log import parse_iteration_lines
from megatron_energy.runtime.profiling.recorded_step import logged_recorded_steps

TARGET_RATIO = 1.3
"""The most a recorded step may cost, in normal steps."""
FIRST_JOB_S = 90.0
"""What a job is assumed to take before one has run (start-up ~25 s and the iterations of the slowest job)."""
TIMELINES_LINE = "phases inside instructions"
"""What the plugin's line about the phase planner's split starts with (``kernel_timeline.timelines_line``)."""


@dataclass(frozen=True)
class Job:
    """One of the benchmark's jobs: its batch and whether it has the user shape."""

    name: str
    microbatches: int
    micro_batch_size: int
    user_shaped: bool = False


JOBS = {
    job.name: job
    for job in (
        Job("gpu-bound", 8, 2),
        Job("user-shaped", 8, 2, user_shaped=True),
        Job("host-bound", 4, 1),
    )
}
"""The jobs, by name (module docstring)."""


def job_command(args: argparse.Namespace, job: Job) -> list[str]:
    """The torchrun command of ``job``: the plugin in kernel mode, dry run, the fewest profile steps."""
    megatron = gpt_args(job.microbatches, job.micro_batch_size, args.iters, user_shaped=job.user_shaped)
    plugin = ["--energy-optimise", "--energy-dry-run", "--energy-mode", "kernel"]
    plugin += ["--energy-dir", str(energy_dir(args, job)), "--energy-profile-iters", "1"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1"]
    launcher = [f"--master-port={MASTER_PORT}", "-m", "megatron_energy.launch", str(args.script)]
    return [*torchrun, *launcher, *megatron, *plugin]


def energy_dir(args: argparse.Namespace, job: Job) -> Path:
    """The job's ``--energy-dir`` (emptied before the job: the plugin profiles, reusing no plan)."""
    return args.out / f"energy-{job.name}"


def job_figures(text: str, warmup: int) -> dict[str, Any]:
    """The recorded step against the normal step in one run's output (module docstring; all measured).

    Args:
        text: The run's combined output.
        warmup: Iterations ``1..warmup`` are not normal steps.

    Returns:
        The figures, JSON-ready.

    Raises:
        RunFailedError: If the output names no recorded step, Megatron logged no time for it, or no normal
            step is left.
    """
    elapsed = {line.iteration: line.elapsed_ms for line in parse_iteration_lines(text)}
    recorded = logged_recorded_steps(text)
    if not recorded:
        raise RunFailedError("no recorded step was logged: raise --iters (the baseline may have grown)")
    cost = recorded[0]
    if cost.iteration not in elapsed:
        raise RunFailedError(f"Megatron logged no time for iteration {cost.iteration}, the recorded step")
    after = cost.iteration + 1
    normal = {i: ms for i, ms in elapsed.items() if i > warmup and i not in (cost.iteration, after)}
    if not normal:
        raise RunFailedError(f"no normal step after the {warmup} warm-up iterations")
    normal_ms = statistics.median(normal.values())
    recorded_ms = elapsed[cost.iteration]
    timelines = [line.strip() for line in text.splitlines() if TIMELINES_LINE in line]
    return {
        "recorded_iteration": cost.iteration,
        "recorded_ms": recorded_ms,
        "normal_median_ms": normal_ms,
        "normal_iterations": sorted(normal),
        "ratio": recorded_ms / normal_ms,
        "next_ms": elapsed.get(after),
        "next_ratio": elapsed[after] / normal_ms if after in elapsed else None,
        "recorded_line": {
            "instances": cost.instances,
            "start_ms": cost.start_ms,
            "toggles": cost.toggles,
            "toggles_ms": cost.toggles_ms,
            "stop_ms": cost.stop_ms,
            "export_ms": cost.export_ms,
            "trace_mib": cost.trace_mib,
            "error": cost.error,
        },
        "timelines": timelines[0] if timelines else None,
    }


def report_line(name: str, figures: dict[str, Any]) -> str:
    """One job's figures in words."""
    line = figures["recorded_line"]
    verdict = "within" if figures["ratio"] <= TARGET_RATIO else "OVER"
    after = (
        "not logged"
        if figures["next_ms"] is None
        else f"{figures['next_ms']:.1f} ms ({figures['next_ratio']:.2f}x)"
    )
    timelines = figures["timelines"] or "timelines not read before the run ended"
    return (
        f"{name}: recorded step (iteration {figures['recorded_iteration']}) {figures['recorded_ms']:.1f} ms, "
        f"normal step {figures['normal_median_ms']:.1f} ms (median of {len(figures['normal_iterations'])}): "
        f"{figures['ratio']:.2f}x, {verdict} the {TARGET_RATIO}x target; the step after it {after}. "
        f"Training thread: profiler start {line['start_ms']:.1f} ms, {line['toggles']} toggles "
        f"{line['toggles_ms']:.1f} ms; writer thread: stop {line['stop_ms']:.1f} ms, export "
        f"{line['export_ms']:.1f} ms, {line['trace_mib']:.1f} MiB, {line['instances']} instances"
        + ("" if line["error"] is None else f" (not written: {line['error']})")
        + f". {timelines} (all measured)"
    )


def run_job(args: argparse.Namespace, harness: Harness, job: Job, walls: list[float]) -> dict[str, Any]:
    """Run ``job`` on an emptied energy dir, print its figures and return them (or why there are none).

    Appends the run's wall clock to ``walls``.
    """
    shutil.rmtree(energy_dir(args, job), ignore_errors=True)
    try:
        finished = launch(args, harness, job_command(args, job), job.name)
        walls.append(finished.ended_s - finished.started_s)
        figures = job_figures(finished.text, args.warmup)
    except RunFailedError as failure:
        print(f"{job.name}: {failure}", flush=True)
        return {"failed": str(failure)[-2000:]}
    print(report_line(job.name, figures), flush=True)
    return {"wall_s": walls[-1], **figures}


def run_jobs(args: argparse.Namespace, harness: Harness) -> dict[str, Any]:
    """Run every job of ``--jobs`` that fits before ``--deadline-s``; rewrite ``--json`` after each."""
    results: dict[str, Any] = {"iters": args.iters, "warmup": args.warmup, "script": str(args.script)}
    jobs: dict[str, Any] = results.setdefault("jobs", {})
    walls: list[float] = []
    for name in args.jobs:
        job = JOBS[name]
        expected_s = max(walls, default=FIRST_JOB_S)
        if args.deadline_s is not None and harness.clock() + expected_s > args.deadline_s:
            print(f"deadline: {name} not run", flush=True)
            jobs[name] = {"skipped": "deadline"}
        else:
            jobs[name] = run_job(args, harness, job, walls)
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=1))
    return results


def job_list(text: str) -> tuple[str, ...]:
    """``--jobs``: names of :data:`JOBS`, comma-separated, each once."""
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in JOBS]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct names of {', '.join(JOBS)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's flags (see the module docstring); bad values exit with a message."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--script", type=Path, default=Path("scripts/pretrain_gpt.py"), help="pretrain script"
    )
    parser.add_argument("--jobs", type=job_list, default=tuple(JOBS), help="comma-separated job names")
    parser.add_argument("--iters", type=int, default=24, help="training iterations per job")
    parser.add_argument("--warmup", type=int, default=3, help="first iterations that are not normal steps")
    parser.add_argument("--deadline-s", type=float, default=None, help="start no job past this many seconds")
    parser.add_argument(
        "--out", type=Path, default=Path("build/bench_recorded_step"), help="logs, energy dirs"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.iters <= args.warmup + 2:
        parser.error("--warmup must be at least 1 and --iters leave normal steps after it")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = run_jobs(args, Harness(session_clock(), None, run_streaming))
    print(json.dumps(results, indent=1))
    return 0 if all("ratio" in figures for figures in results["jobs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
