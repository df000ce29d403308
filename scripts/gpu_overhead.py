r"""Plugin off vs on, same machine, same invocation: iteration time and energy of a small GPT, with intervals.

Runs ``scripts/pretrain_gpt.py`` under torchrun without and with the launcher (``--energy-optimise
--energy-dry-run --energy-trace``) in ``--pairs`` pairs (at least 4), alternating the order inside a pair
(off-on, on-off, off-on, ...) so that a drift over the session hits both sides alike, and reads Megatron's own
per-iteration log (``--log-interval 1``): "elapsed time per iteration (ms)" and, with ``--log-energy``,
Megatron's own "energy per GPU (J/iter/GPU)" (NVML counter). A first, unmeasured plugin run
(``--prime-iters``) profiles and caches the plan, so every measured plugin run is the steady state (a cache
hit) from its first iteration; warm-up iterations are dropped; each run gives the median of its kept
iterations, and the overhead is the mean of the per-pair ratios ``on / off - 1`` with its 95 % Student-t
interval over pairs (``megatron_energy.stats.paired_relative_change``): run-to-run differences (allocator,
cuBLAS choices, GPU temperature) vary from run to run, so the run, not the iteration, is the unit of the
comparison. All figures are *measured*. GPU machines are shared: the plugin runs in dry-run, so no clock
or power setting is changed.
``--deadline-s`` starts no pair that the time left cannot fit (judged by the slowest run so far);
``--resume summary.json`` goes on from the pairs such a session completed.

    python scripts/gpu_overhead.py --pairs 4 --iters 20 --out result_dir
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from megatron_energy.stats import paired_relative_change

ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ .*?elapsed time per iteration \(ms\): ([\d.]+)")
ENERGY = re.compile(r"energy per GPU \(J/iter/GPU\): ([\d.]+)")


def model_args(iters: int, pipeline: int) -> list[str]:
    """A small GPT that runs a few hundred ms per iteration on one H200."""
    return (
        "--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
        "--max-position-embeddings 2048 --micro-batch-size 2 --global-batch-size 32 "
        f"--pipeline-model-parallel-size {pipeline} --train-iters {iters} --lr 1e-4 --bf16 "
        "--mock-data --tokenizer-type NullTokenizer --vocab-size 32000 --log-interval 1 --log-energy "
        "--eval-iters 0 --eval-interval 1000000 --transformer-impl local --no-gradient-accumulation-fusion "
        "--no-masked-softmax-fusion --no-persist-layer-norm --no-rope-fusion"
    ).split()


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
    script = ["scripts/pretrain_gpt.py", *model_args(iters or args.iters, min(gpus, 2))]
    if plugin:
        trace = out / f"trace-{tag}.jsonl"
        command += ["-m", "megatron_energy.launch", *script, "--energy-optimise", "--energy-dry-run"]
        command += ["--energy-trace", str(trace), "--energy-dir", str(out / "energy"), *args.energy_args]
    else:
        command += script
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy(), check=False)
    log = result.stdout + result.stderr
    (out / f"log-{tag}.txt").write_text(log)
    if result.returncode != 0:
        raise SystemExit(f"run {tag} failed ({result.returncode}); tail:\n{log[-4000:]}")
    times = {int(m.group(1)): float(m.group(2)) for m in ITERATION.finditer(log)}
    energies = [float(m.group(1)) for m in ENERGY.finditer(log)]
    kept = [t for i, t in sorted(times.items()) if i > args.warmup]
    kept_energy = energies[args.warmup :]
    return {
        "plugin": plugin,
        "wall_s": time.perf_counter() - started,
        "iterations_kept": len(kept),
        "median_iteration_ms": statistics.median(kept),
        "median_energy_j_per_iter_per_gpu": statistics.median(kept_energy) if kept_energy else None,
        "iteration_ms": kept,
        "energy_j_per_iter_per_gpu": kept_energy,
        "energy_lines": [line for line in log.splitlines() if "[energy]" in line][-12:],
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=4, help="off/on pairs (at least 4), order alternated")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="first iterations dropped")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--deadline-s", type=float, default=None, help="start no pair past this budget")
    parser.add_argument("--out", type=Path, default=Path("build/gpu_overhead"))
    parser.add_argument(
        "--resume", type=Path, default=None, help="summary.json of a session stopped at its deadline: go on"
    )
    parser.add_argument(
        "--prime-iters",
        type=int,
        default=28,
        help="iterations of one unmeasured plugin run first, which profiles and caches the plan (0: none)",
    )
    parser.add_argument("energy_args", nargs="*", help="extra --energy-* flags for the plugin runs")
    args = parser.parse_args()
    if args.pairs < 4:
        parser.error("--pairs must be at least 4: fewer cannot resolve a 0.5 % overhead")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs: list[dict] = json.loads(args.resume.read_text())["runs"] if args.resume else []
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
            runs.append({"pair": pair, **run})
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "energy_lines"}), flush=True)
    if not runs:
        raise SystemExit("no pair fits the deadline")
    summary: dict = {
        "source": "measured (Megatron's iteration timer and NVML energy counter)",
        "statistic": "mean of per-pair ratios on/off - 1 over per-run medians, 95 % Student-t CI over pairs",
        "pairs": len(runs) // 2,
        "iteration_time": summarise(runs, "median_iteration_ms"),
        "runs": runs,
    }
    if all(run["median_energy_j_per_iter_per_gpu"] is not None for run in runs):
        summary["energy_per_iteration"] = summarise(runs, "median_energy_j_per_iter_per_gpu")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    for label, key in (("iteration time", "iteration_time"), ("energy/iteration", "energy_per_iteration")):
        if key in summary:
            result = summary[key]
            print(
                f"plugin on vs off, {label} (measured, {summary['pairs']} pairs): "
                f"{100 * result['change']:+.2f} % "
                f"(95 % CI {100 * result['low']:+.2f} % to {100 * result['high']:+.2f} %): {result['text']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
