"""Wall time of ``megatron-energy plan`` on a profile CSV, as a user runs it: a fresh interpreter per run.

Each run is ``python -m megatron_energy.cli plan --profile CSV --stages S --microbatches M ...`` in a new
process, imports included (the offline path imports neither torch nor megatron-core:
``tests/test_offline_imports.py``). Reported figures are *measured*: per run the wall time and the CPU time
(user + system) of the child, then the median of each; and the load average, which says how much the wall
time on a shared machine was the command's own. The default profile is ``tests/data/profile_pp8_h100.csv``
(S=8, the session's 6-clock grid on h100-sxm) at M=32, planned with h100-sxm's blocked and idle power and
instant clock switches (``DEFAULT_EXTRA``); ``-- --gpu-spec h100-sxm`` plans under the spec's 10 ms switch
latency and memory clocks instead, which costs the optimiser several seconds more.

    python lab/bench_plan_command.py [--runs 5] [-- extra plan arguments]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROFILE = ROOT / "tests" / "data" / "profile_pp8_h100.csv"
DEFAULT_EXTRA = ["--blocked-power-w", "115.5", "--idle-power-w", "114.7"]
"""h100-sxm's blocked and idle power (``configs/gpus/h100-sxm.yaml``), given without the spec."""


def plan_command(profile: Path, stages: int, microbatches: int, out: Path, extra: list[str]) -> list[str]:
    """The ``megatron-energy plan`` command line one run executes."""
    return [
        sys.executable,
        "-m",
        "megatron_energy.cli",
        "plan",
        "--profile",
        str(profile),
        "--stages",
        str(stages),
        "--microbatches",
        str(microbatches),
        "--out",
        str(out),
        *extra,
    ]


def timed_run(command: list[str]) -> tuple[float, float]:
    """Run ``command`` once; its wall time and CPU time (user + system of the child), in seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    """Time the runs and print each and the medians."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--stages", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="further plan arguments (default: DEFAULT_EXTRA)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "plan.json"
        command = plan_command(args.profile, args.stages, args.microbatches, out, args.extra or DEFAULT_EXTRA)
        print(" ".join(command[1:]))
        runs = []
        for run in range(args.runs):
            wall, cpu = timed_run(command)
            runs.append((wall, cpu))
            load = os.getloadavg()[0]
            print(f"run {run + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU, load average {load:.1f}")
    walls, cpus = zip(*runs, strict=True)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(f"median of {args.runs}: {wall:.2f} s wall, {cpu:.2f} s CPU")


if __name__ == "__main__":
    main()
