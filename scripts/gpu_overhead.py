r"""Plugin off vs on, same machine, same invocation: iteration time and energy of a small GPT, with intervals.

Runs ``scripts/pretrain_gpt.py`` under torchrun without and with the launcher (``--energy-optimise
--energy-dry-run --energy-trace``) in ``--pairs`` pairs (at least 4), alternating the order inside a pair
(off-on, on-off, off-on, ...) so that a drift over the session hits both sides alike, and reads Megatron's own
per-iteration log (``--log-interval 1``, ``megatron_energy.megatron.training_log``): "elapsed time per
iteration (ms)" and, with ``--log-energy``, Megatron's own "energy per GPU (J/iter/GPU)" (NVML counter). A
first, unmeasured plugin run (``--prime-iters``) profiles and caches the plan, so every measured plugin run is
the steady state (a cache hit) from its first iteration (each kept iteration's phase is recorded, so the JSON
shows it); warm-up iterations are dropped (``--warmup``); each run gives the median of its kept iterations,
and the overhead is the mean of the per-pair ratios ``on / off - 1`` with its 95 % Student-t interval over
pairs (``megatron_energy.stats.paired_relative_change``): run-to-run differences (allocator, cuBLAS choices,
GPU temperature) vary from run to run, so the run, not the iteration, is the unit of the comparison. All
figures are *measured*. GPU machines are shared: the plugin runs in dry-run, so no clock or power setting is
changed.

The default model is the issue's GPT shape (16 layers, hidden 2048, seq 2048, bf16, PP=1) with 4
microbatches of one sequence (``--microbatches``, ``--micro-batch-size``): on one H200 a run spends about
30 s outside its iterations (torchrun, imports, Megatron's initialisation, exit) and about 0.25 s per
iteration (estimated from the 16-microbatch run at ~1.6 s), so a pair of 20-iteration runs takes about
75 s and, after the ~40 s priming run, six pairs fit in about nine minutes. Shorter iterations make the
plugin's fixed per-iteration cost a larger fraction, so the overhead measured here is an upper bound for
the 16-microbatch job. ``--deadline-s`` starts no pair that the time left cannot fit (judged by the slowest
run so far); ``--resume summary.json`` goes on from the pairs such a session completed; ``--json OUT``
writes every iteration's figures (kept or not, with the plugin's phase) and the summary to one file.

    python scripts/gpu_overhead.py --pairs 6 --iters 20 --deadline-s 540 --json overhead.json

``--in-process N`` runs the plugin once with ``--energy-overhead-check N`` instead (the session suspended
and active in alternate blocks of N iterations of one process, ``runtime.overhead_check``), which removes the
run-to-run differences from the comparison, and prints the check's line (the median of the pairs' changes
with its sign-test interval, then the mean with its Student-t interval), with the safety net held off (in a
dry run it can trip only on outside noise, and would leave the plan). On a shared machine, short blocks
pair iterations seconds apart:

    python scripts/gpu_overhead.py --in-process 2 --microbatches 16 --micro-batch-size 2 --iters 210

``--json run.json`` keeps such a run's pairs with the job's shape and a digest of the plugin's sources;
``--pool earlier.json ...`` beside ``--in-process`` adds the earlier runs' pairs to this run's check, and
alone prints each stored run's check and the pooled one without running anything (runs of another job or
code are refused):

    python scripts/gpu_overhead.py --pool tests/data/h200_overhead_run{1,2,3}.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gpt_job import gpt_args

import megatron_energy
from megatron_energy.megatron.training_log import parse_iteration_lines
from megatron_energy.runtime.energy_log import logged_phases
from megatron_energy.runtime.overhead_check import OVERHEAD_PAIRS_FILE, OverheadResult, pooled
from megatron_energy.stats import paired_relative_change


def iteration_records(log: str, warmup: int) -> list[dict]:
    """Every iteration Megatron logged, with its figures, whether it is kept, and the plugin's phase.

    Args:
        log: The run's combined output.
        warmup: Iterations ``1..warmup`` are logged but not kept.

    Returns:
        One dict per iteration: ``iteration``, ``elapsed_ms``, ``energy_j`` (None without ``--log-energy``),
        ``kept``, ``phase`` (our log line's phase; None without the plugin).
    """
    phases = logged_phases(log)
    return [
        {
            "iteration": line.iteration,
            "elapsed_ms": line.elapsed_ms,
            "energy_j": line.energy_j,
            "kept": line.iteration > warmup,
            "phase": phases.get(line.iteration),
        }
        for line in parse_iteration_lines(log)
    ]


def run_once(plugin: bool, args: argparse.Namespace, out: Path, tag: str, iters: int | None = None) -> dict:
    """One run of ``iters`` iterations (default ``--iters``): its per-iteration figures and our log lines."""
    gpus = args.gpus
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={gpus}",
        "--master-port=29517",
    ]
    job = gpt_args(args.microbatches, args.micro_batch_size, iters or args.iters, pipeline=min(gpus, 2))
    script = ["scripts/pretrain_gpt.py", *job]
    if plugin:
        trace = out / f"trace-{tag}.jsonl"
        command += ["-m", "megatron_energy.launch", *script, "--energy-optimise", "--energy-dry-run"]
        command += ["--energy-trace", str(trace), "--energy-dir", str(out / "energy"), *args.energy_args]
    else:
        command += script
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy(), check=False)
    wall_s = time.perf_counter() - started
    log = result.stdout + result.stderr
    (out / f"log-{tag}.txt").write_text(log)
    if result.returncode != 0:
        raise SystemExit(f"run {tag} failed ({result.returncode}); tail:\n{log[-4000:]}")
    iterations = iteration_records(log, args.warmup)
    kept = [record for record in iterations if record["kept"]]
    if not kept:
        raise SystemExit(f"run {tag}: no iteration after the {args.warmup} warm-up ones was logged")
    energies = [record["energy_j"] for record in kept]
    phases = [record["phase"] for record in kept if record["phase"] is not None]
    return {
        "plugin": plugin,
        "wall_s": wall_s,
        "training_s": sum(record["elapsed_ms"] for record in iterations) / 1000.0,
        "iterations_kept": len(kept),
        "kept_phases": {phase: phases.count(phase) for phase in dict.fromkeys(phases)},
        "median_iteration_ms": statistics.median(record["elapsed_ms"] for record in kept),
        "median_energy_j_per_iter_per_gpu": (
            statistics.median(energies) if all(e is not None for e in energies) else None
        ),
        "iterations": iterations,
        "energy_lines": [line for line in log.splitlines() if "[energy]" in line][-12:],
        "host_time_lines": [line for line in log.splitlines() if "plugin host time" in line],
    }


def summarise(runs: list[dict], key: str) -> dict:
    """Per-pair medians of ``key`` (off, on) and the paired relative change with its 95 % interval."""
    pairs = sorted({run["pair"] for run in runs})
    off = [next(r[key] for r in runs if r["pair"] == p and not r["plugin"]) for p in pairs]
    on = [next(r[key] for r in runs if r["pair"] == p and r["plugin"]) for p in pairs]
    change = paired_relative_change(off, on)
    return {
        "off_per_pair": off,
        "on_per_pair": on,
        "change": change.change,
        "low": change.low,
        "high": change.high,
        "resolved": change.excludes_zero,
        "text": change.format(),
    }


def complete_pairs(runs: list[dict]) -> list[dict]:
    """The runs of pairs that have both members (a deadline may stop between the two)."""
    counts = {run["pair"]: sum(1 for r in runs if r["pair"] == run["pair"]) for run in runs}
    return [run for run in runs if counts[run["pair"]] == 2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's flags (see the module docstring); bad values exit with a message."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=6, help="off/on pairs (at least 4), order alternated")
    parser.add_argument("--iters", type=int, default=20, help="training iterations per run")
    parser.add_argument("--warmup", type=int, default=5, help="first iterations dropped")
    parser.add_argument("--microbatches", type=int, default=4, help="microbatches per iteration")
    parser.add_argument("--micro-batch-size", type=int, default=1, help="sequences per microbatch")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--deadline-s", type=float, default=None, help="start no pair past this budget")
    parser.add_argument("--out", type=Path, default=Path("build/gpu_overhead"))
    parser.add_argument("--json", type=Path, default=None, help="every iteration's figures and the summary")
    parser.add_argument(
        "--resume", type=Path, default=None, help="summary.json of a session stopped at its deadline: go on"
    )
    parser.add_argument(
        "--prime-iters",
        type=int,
        default=28,
        help="iterations of one unmeasured plugin run first, which profiles and caches the plan (0: none)",
    )
    parser.add_argument(
        "--in-process",
        type=int,
        default=0,
        metavar="N",
        help="instead of pairs of runs, one plugin run with --energy-overhead-check N: blocks of N iterations"
        " with the session suspended and active in one process (--iters must cover profiling and the pairs)",
    )
    parser.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        default=[],
        metavar="JSON",
        help="earlier runs' --json files of one job and code: with --in-process, also print the check over"
        " all their pairs and this run's; alone, print each stored run's check and their pooled one (no run)",
    )
    parser.add_argument("energy_args", nargs="*", help="extra --energy-* flags for the plugin runs")
    args = parser.parse_args(argv)
    if args.pairs < 4 and not args.in_process:
        parser.error("--pairs must be at least 4: fewer cannot resolve a 0.5 % overhead")
    if args.iters <= args.warmup:
        parser.error(f"--iters ({args.iters}) must exceed --warmup ({args.warmup}): nothing would be kept")
    if min(args.microbatches, args.micro_batch_size, args.gpus) < 1:
        parser.error("--microbatches, --micro-batch-size and --gpus must be at least 1")
    return args


def report_lines(summary: dict) -> list[str]:
    """The closing lines: each figure's change with its interval, and what a pair cost."""
    lines = []
    for label, key in (("iteration time", "iteration_time"), ("energy/iteration", "energy_per_iteration")):
        if key in summary:
            result = summary[key]
            lines.append(
                f"plugin on vs off, {label} (measured, {summary['pairs']} pairs): "
                f"{100 * result['change']:+.2f} % "
                f"(95 % CI {100 * result['low']:+.2f} % to {100 * result['high']:+.2f} %): {result['text']}"
            )
    lines.append(f"one pair took {summary['pair_wall_s']:.0f} s on average (measured wall clock)")
    return lines


def in_process(args: argparse.Namespace) -> int:
    """One plugin run with the in-process check (``runtime.overhead_check``); print the check's lines.

    The safety net is held off (more violating steps needed than the run has): in a dry run no clock
    changes, so it can trip only on disturbances from outside the job, and once tripped the session stops
    running the plan (measured on a shared H200: 81 of 89 kept iterations after such a trip), so the active
    blocks would time a session that only watches, not the plugin's cost of running the plan.
    """
    shape = job_shape(args)  # before the flags below: runs of any length pool
    never_trips = str(args.iters + 1)
    args.energy_args = [
        *args.energy_args,
        *("--energy-overhead-check", str(args.in_process), "--energy-safety-steps", never_trips),
    ]
    pairs_file = args.out / "energy" / OVERHEAD_PAIRS_FILE.format(rank=0)
    pairs_file.unlink(missing_ok=True)  # a previous run's, on a machine that keeps build outputs
    run = run_once(True, args, args.out, "in-process")
    log = (args.out / "log-in-process.txt").read_text()
    lines = [line for line in log.splitlines() if "overhead check" in line or "plugin host time" in line]
    shown = {k: v for k, v in run.items() if k not in ("energy_lines", "iterations")}
    print(json.dumps(shown), flush=True)
    print("\n".join(lines) if lines else "no overhead-check line in the log: see " + str(args.out))
    if not pairs_file.exists():
        return 1
    record = {"code": code_digest(), "job": shape, "pairs": json.loads(pairs_file.read_text())}
    if args.json is not None:
        args.json.write_text(json.dumps({**record, "run": shown}, indent=1))
    if args.pool:
        return print_pooled([record, *(json.loads(path.read_text()) for path in args.pool)], args.pool)
    return 0


def code_digest() -> str:
    """A digest of the package's sources: runs pool only when they ran the same plugin."""
    digest = hashlib.sha256()
    package = Path(megatron_energy.__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def job_shape(args: argparse.Namespace) -> dict:
    """What makes two in-process runs the same measurement (besides the code)."""
    return {
        "microbatches": args.microbatches,
        "micro_batch_size": args.micro_batch_size,
        "gpus": args.gpus,
        "block": args.in_process,
        "energy_args": args.energy_args,
    }


def summarise_stored(paths: list[Path]) -> int:
    """Print the check of each stored ``--json`` run, then over all their pairs (one job and code only)."""
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


def print_pooled(records: list[dict], earlier: list[Path]) -> int:
    """Print the check over this run's pairs and the ``--pool`` runs'; refuse runs of another job or code."""
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pool and not args.in_process:
        return summarise_stored(args.pool)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.in_process:
        return in_process(args)
    started = time.perf_counter()
    runs: list[dict] = json.loads(args.resume.read_text())["runs"] if args.resume else []
    runs = complete_pairs(runs)
    if not args.resume and args.prime_iters > 0:
        # profiling and planning happen once per job (then the plan is cached): prime the cache so that every
        # measured plugin run is the steady state, from its first iteration
        prime = run_once(True, args, args.out, "prime", iters=args.prime_iters)
        print(
            json.dumps({"prime_wall_s": prime["wall_s"], "energy_lines": prime["energy_lines"][-3:]}),
            flush=True,
        )
    for pair in range(len(runs) // 2, args.pairs):
        slowest_s = max((run["wall_s"] for run in runs), default=0.0)
        if args.deadline_s is not None and time.perf_counter() - started + 2.2 * slowest_s > args.deadline_s:
            print(f"deadline: stopping after {pair} pairs", flush=True)
            break
        order = (False, True) if pair % 2 == 0 else (True, False)
        for plugin in order:
            run = run_once(plugin, args, args.out, f"{pair}-{'on' if plugin else 'off'}")
            runs.append({"pair": pair, "order": "off-on" if pair % 2 == 0 else "on-off", **run})
            shown = {k: v for k, v in runs[-1].items() if k not in ("energy_lines", "iterations")}
            print(json.dumps(shown), flush=True)
    if not runs:
        raise SystemExit("no pair fits the deadline")
    if len(runs) < 4:
        print(f"only {len(runs) // 2} pair: no interval (it needs two pairs at least)", flush=True)
    summary: dict = {
        "source": "measured (Megatron's iteration timer and NVML energy counter)",
        "statistic": "mean of per-pair ratios on/off - 1 over per-run medians, 95 % Student-t CI over pairs",
        "pairs": len(runs) // 2,
        "pair_wall_s": 2 * statistics.fmean(run["wall_s"] for run in runs),
        "iteration_time": summarise(runs, "median_iteration_ms"),
    }
    if all(run["median_energy_j_per_iter_per_gpu"] is not None for run in runs):
        summary["energy_per_iteration"] = summarise(runs, "median_energy_j_per_iter_per_gpu")
    document = {**summary, "runs": runs}
    (args.out / "summary.json").write_text(json.dumps(document, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2))
    print(json.dumps(summary, indent=2))
    print("\n".join(report_lines(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
