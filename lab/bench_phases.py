"""Iso-time energy saving of instruction-level vs phase-level clocks at several switch latencies (modelled).

The rows of ``megatron-energy simulate --switch-latency-sweep`` (``megatron_energy/commands/latency_sweep.py``
says how they are computed), with the sweep's resolution adjustable.

Usage: ``python lab/bench_phases.py [--latencies 10ms,1ms,100us,10us] [--jobs NAME ...]``
"""

from __future__ import annotations

import argparse

from megatron_energy.commands.latency_sweep import HEADER, example_jobs, latencies_argument, sweep_job


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--latencies", default="10ms,1ms,100us,10us", type=latencies_argument)
    parser.add_argument("--jobs", nargs="*", default=(), help="example job names (default: every example)")
    parser.add_argument("--clock-stride", type=int, default=4, help="use every Nth clock of the spec's grid")
    parser.add_argument("--points", type=int, default=8, help="frontier deadlines in the Perseus sweep")
    args = parser.parse_args()
    try:
        jobs = example_jobs(args.jobs)
    except ValueError as problem:
        parser.error(str(problem))
    print(HEADER)
    for config in jobs:
        for row in sweep_job(config, args.latencies, args.clock_stride, args.points):
            print(row.markdown(), flush=True)
    print("all figures modelled (GPU spec time/power model, per-class phase split); savings at iso-time")


if __name__ == "__main__":
    main()
