"""Bench: each example job's power swing: stock, iso-time plan, ``smooth:`` plan, filler floor (modelled).

Stock clocks, an iso-time plan, a ``smooth:`` plan and a filler floor of the same bound, per GPU and at scale.

For each job of ``configs/examples/`` (its GPU spec's time/power model, the spec's switch latency): one
Perseus planner serves the iso-time point and the ``smooth:`` point (``perseus.smooth_point``, filler
included where the clocks alone do not meet the bound); the filler floor meets the same bound on the stock
clocks by filler alone (``sim.filler``: the same rule the plan's filler follows, so both are read alike).
Each case is one replica's power (``sim.job_power.replica_power``); the table gives, per GPU (the replica's
mean GPU) and for the job at ``--gpus`` GPUs with its replicas in phase (the worst case), the swing, the
largest ramp, the share of the fluctuation in the 0.1–20 Hz band, and the iteration's time and energy per
replica, all read on the bins the bound is met on: the iteration split into whole bins nearest 20 ms, aligned
with its start (a meter at another phase sees a bin's inside, which the bound does not cover). The sweep is
the slow part (the 70B job's DAG has ~3,900 instructions): ``--points`` deadlines (default 6) keep the
bench under two minutes on two cores; the iso-time point is solved at its own deadline whatever the count.

    PYTHONPATH=. python lab/bench_power_swing.py [--bound floor=0.8] [--gpus 16384] [--points 6] [--jobs gpt3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from megatron_energy.job import JobConfig
from megatron_energy.optimisers.perseus.smooth_point import smooth_point
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.pipeline.fused_profile import with_fused_steps
from megatron_energy.plan_smoothing import smoothing_cost_text
from megatron_energy.power_swing import DEFAULT_RESOLUTION_S, PowerTrace
from megatron_energy.sim.filler import bound_problems, filled_traces, iteration_bin_s, pipeline_filler
from megatron_energy.sim.job_power import JobScale, replica_power
from megatron_energy.sim.power_timeline import stage_power_traces
from megatron_energy.sim.simulator import Simulator
from megatron_energy.sim.swing_cases import SwingCase
from megatron_energy.target import EnergyTarget, parse_target

EXAMPLES = Path(__file__).resolve().parents[1] / "configs" / "examples"

HEADER = (
    "| job | case | iteration (s) | energy / replica (kJ) | per GPU: swing (W) | ramp (W/s) | band share "
    "| at {gpus} GPUs: swing (MW) | ramp (MW/s) | band share |"
)


def bench_job(path: Path, target: EnergyTarget, gpus: int, points: int) -> tuple[list[str], list[str]]:
    """The table rows of one job, and the comparison line of its smooth plan."""
    config = JobConfig.load(path)
    spec = config.spec()
    dag, profile = config.build_dag(spec=spec), config.synthetic_profile(spec)
    profile = with_fused_steps(profile, config.orders())
    planner = Planner(dag, profile, num_points=points, switch_latency_s=spec.switch_latency_s)
    simulator = Simulator(dag, profile)
    stock_result = simulator.run()
    stock = stage_power_traces(stock_result, simulator.powers)
    iso = planner.point(EnergyTarget("iso-time"))
    iso_traces = stage_power_traces(simulator.run(iso.clocks, spec.switch_latency_s), simulator.powers)
    choice = smooth_point(planner, target)
    smooth_result = simulator.run(choice.point.clocks, spec.switch_latency_s)
    smooth_traces = filled_traces(
        stage_power_traces(smooth_result, simulator.powers), choice.smoothing.filler
    )
    bound = choice.smoothing.bound
    stock_filler = pipeline_filler(stock, bound)
    floor_traces = filled_traces(stock, [stock_filler.windows(stage) for stage in range(len(stock))])
    for name, traces, filler in (
        ("smooth plan", smooth_traces, choice.filler),
        ("filler floor", floor_traces, stock_filler),
    ):
        problems = bound_problems(traces, bound, filler.bin_s)
        if problems:
            raise AssertionError(f"{config.name}: the {name} breaks {target}: {problems}")
    cases = [
        ("stock", stock, 0.0),
        ("iso-time plan", iso_traces, 0.0),
        (str(target), smooth_traces, choice.filler.energy_j),
        ("filler floor", floor_traces, stock_filler.energy_j),
    ]
    rows = [_row(config.name, name, traces, config.tensor_parallel, gpus) for name, traces, _ in cases]
    planned_j = smooth_result.total_energy_j + choice.filler.energy_j
    cost = smoothing_cost_text(choice.smoothing, planned_j, stock_result.total_energy_j)
    return rows, [f"{config.name}: {cost}"]


def _row(job: str, name: str, traces: list[PowerTrace], tp: int, gpus: int) -> str:
    """One table row (every figure modelled), read on the case's iteration bins (``iteration_bin_s``)."""
    case = SwingCase(name, replica_power(traces, tp), len(traces) * tp)
    bin_s = iteration_bin_s(case.iteration_s, DEFAULT_RESOLUTION_S)
    one = case.per_gpu(iterations=4, resolution_s=bin_s)
    job_power = case.at(JobScale(gpus), resolution_s=bin_s).figures
    ramp = max(one.ramp_up_w_per_s, one.ramp_down_w_per_s)
    job_ramp = max(job_power.ramp_up_w_per_s, job_power.ramp_down_w_per_s)
    return (
        f"| {job} | {case.name} | {case.iteration_s:.3f} | {case.replica.energy_j / 1e3:.2f} | "
        f"{one.swing_w:.0f} | {ramp:,.0f} | {one.band_share:.2f} | {job_power.swing_w / 1e6:.2f} | "
        f"{job_ramp / 1e6:,.1f} | {job_power.band_share:.2f} |"
    )


def main() -> None:
    """Print the table for every example job (or the ones named)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bound", default="floor=0.8", help="the smooth: target's bound (floor=0.8; e.g. ramp=3000)"
    )
    parser.add_argument("--gpus", type=int, default=16384, help="the job's GPUs, replicas in phase (16384)")
    parser.add_argument("--points", type=int, default=6, help="deadlines of the frontier sweep (6)")
    parser.add_argument("--jobs", nargs="*", default=(), help="job names to run (prefixes; default all)")
    args = parser.parse_args()
    paths = [
        p for p in sorted(EXAMPLES.glob("*.yaml")) if not args.jobs or p.stem.startswith(tuple(args.jobs))
    ]
    rows, lines = [], []
    start = time.perf_counter()
    for path in paths:
        began = time.perf_counter()
        job_rows, job_lines = bench_job(path, parse_target(f"smooth:{args.bound}"), args.gpus, args.points)
        rows += job_rows
        lines += [f"{line} [{time.perf_counter() - began:.1f} s]" for line in job_lines]
    print(HEADER.format(gpus=args.gpus))
    print("|" + "---|" * 10)
    print("\n".join(rows))
    print()
    print("\n".join(lines))
    wall_s = time.perf_counter() - start
    print(f"\nall figures modelled (each job's GPU spec); wall clock {wall_s:.1f} s (measured)")


if __name__ == "__main__":
    main()
