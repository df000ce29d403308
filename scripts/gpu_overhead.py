r"""Plugin off vs on, same machine, same invocation: median iteration time and energy of a small GPT.

Runs ``scripts/pretrain_gpt.py`` under torchrun alternately without and with the launcher
(``--energy-optimise --energy-dry-run --energy-trace``), ``--pairs`` times, and reads Megatron's own
per-iteration log (``--log-interval 1``): "elapsed time per iteration (ms)" and, with ``--log-energy``,
Megatron's own "energy per GPU (J/iter/GPU)" (NVML counter: measured). Warm-up iterations are dropped;
medians are printed as JSON, with our session's log lines. GPU machines are shared: the plugin runs in
dry-run, so no clock or power setting is changed.

    python scripts/gpu_overhead.py --pairs 2 --iters 40 --out result.json
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


def run_once(plugin: bool, args: argparse.Namespace, out: Path, tag: str) -> dict:
    """One training run; returns its per-iteration times and energies and our log lines."""
    gpus = args.gpus
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={gpus}",
        "--master-port=29517",
    ]
    script = ["scripts/pretrain_gpt.py", *model_args(args.iters, min(gpus, 2))]
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
        "energy_lines": [line for line in log.splitlines() if "[energy]" in line][-12:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=2, help="off/on pairs, alternated")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="first iterations dropped")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("build/gpu_overhead"))
    parser.add_argument("energy_args", nargs="*", help="extra --energy-* flags for the plugin runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for pair in range(args.pairs):
        for plugin in (False, True):
            runs.append(run_once(plugin, args, args.out, f"{pair}-{'on' if plugin else 'off'}"))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "energy_lines"}), flush=True)
    summary = {"source": "measured (Megatron's iteration timer and NVML energy counter)", "runs": runs}
    for plugin in (False, True):
        mine = [run for run in runs if run["plugin"] is plugin]
        summary["on" if plugin else "off"] = {
            "median_iteration_ms": statistics.median(r["median_iteration_ms"] for r in mine),
            "median_energy_j_per_iter_per_gpu": statistics.median(
                r["median_energy_j_per_iter_per_gpu"] for r in mine
            ),
        }
    off, on = summary["off"]["median_iteration_ms"], summary["on"]["median_iteration_ms"]
    summary["overhead_percent"] = 100 * (on / off - 1)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
