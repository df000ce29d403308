"""What ``megatron-energy estimate``'s search budgets cost and buy: time against each row's saving.

Plans every mode of a job YAML at iso-time, ``slowdown:0.05`` and ``min-energy`` (``estimate_job``, as
``estimate`` does, its targets in forked workers) once per setting of Perseus's frontier deadlines
(``--points``), Kareus's trials per stage (``--trials``) and the switch-latency post-pass's evaluations
(``--switch-evaluations``). The first setting is the reference (by default plan's budgets: 100, 24, 2000);
each later one prints its wall and CPU time (*measured*, workers included) and every row's saving and time
change against stock (*modelled*) with its difference from the reference's, in percentage points.

    python lab/bench_estimate_effort.py [--config JOB.yaml] [--setting 100,24,2000 --setting 10,24,200 ...]

(the 70B example, ``configs/examples/llama-70b-pp8-tp8-a100.yaml``, by default).
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from megatron_energy.commands.estimate_modes import JobEstimate, estimate_job
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.interface import SWITCH_EVALUATIONS
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.target import parse_target

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "examples" / "llama-70b-pp8-tp8-a100.yaml"
TARGETS = ("iso-time", "slowdown:0.05", "min-energy")
Setting = tuple[int, int, int]
"""Frontier points, Kareus trials per stage, switch-latency post-pass evaluations."""


def setting(text: str) -> Setting:
    """``points,trials,evaluations`` as three positive integers."""
    values = [int(part) for part in text.split(",")]
    if len(values) != 3 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': give points,trials,evaluations, each at least 1")
    points, trials, evaluations = values
    return points, trials, evaluations


def cpu_s() -> float:
    """CPU time (user + system) of this process and its finished workers."""
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def figures(estimate: JobEstimate) -> dict[str, tuple[float, float]]:
    """Each row's energy and time change against stock, in percent (rows without a plan left out)."""
    return {
        f"{row.target} {row.mode}": (100 * row.saving, 100 * row.time_change)
        for row in estimate.rows
        if row.plan is not None
    }


def main() -> None:
    """Run every setting and print its time and rows against the first's."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="job YAML")
    parser.add_argument(
        "--setting",
        type=setting,
        action="append",
        help="points,trials,evaluations (repeatable; the first is the reference)",
    )
    args = parser.parse_args()
    settings = args.setting or [(100, 24, SWITCH_EVALUATIONS), (10, 24, SWITCH_EVALUATIONS), (10, 24, 200)]
    job = JobConfig.load(args.config)
    targets = [parse_target(text) for text in TARGETS]
    reference: dict[str, tuple[float, float]] = {}
    print(f"{args.config.name}: times measured, savings modelled (percent against stock clocks)")
    for points, trials, evaluations in settings:
        started_wall, started_cpu = time.perf_counter(), cpu_s()
        estimate = estimate_job(
            job, targets, SearchBudget(trials=trials), points, switch_evaluations=evaluations
        )
        wall_s, used_s = time.perf_counter() - started_wall, cpu_s() - started_cpu
        rows = figures(estimate)
        reference = reference or rows
        budgets = f"--points {points} --trials {trials} --switch-evaluations {evaluations}"
        print(f"\n{budgets}: {wall_s:.1f} s wall, {used_s:.1f} s CPU")
        for name, (energy, iteration) in rows.items():
            energy_ref, iteration_ref = reference[name]
            print(
                f"  {name:24s} energy {energy:+8.3f} % ({energy - energy_ref:+.3f} pp)"
                f"   time {iteration:+8.3f} % ({iteration - iteration_ref:+.3f} pp)"
            )


if __name__ == "__main__":
    main()
