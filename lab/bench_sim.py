"""Benchmark the pipeline DAG and simulator at scale: PP=16, 256 microbatches, VPP=2 on one CPU core.

Prints the node count, the build time of the DAG, the simulation time (median of several runs) and the peak
Python memory per DAG node for two sizes, to show memory grows linearly with the node count. All times are
measured wall-clock times of this code on this machine; the simulated iteration itself is modelled.

Usage: ``.venv/bin/python lab/bench_sim.py [--repeats 5]``
"""

import argparse
import os
import statistics
import time
import tracemalloc

from megatron_energy.job import JobConfig
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import Profile
from megatron_energy.sim.simulator import Simulator

TARGET_S = 2.0
STAGES = 16
CHUNKS = 2
MICROBATCHES = (128, 256)


def _job(num_microbatches: int) -> JobConfig:
    """A Llama-7B-class job on H200 with one layer per model chunk."""
    return JobConfig.from_dict(
        {
            "name": f"bench-pp{STAGES}-vpp{CHUNKS}-m{num_microbatches}",
            "gpu": "h200",
            "model": "llama-7b",
            "pipeline_stages": STAGES,
            "virtual_stages": CHUNKS,
            "data_parallel": 8,
            "micro_batch_size": 1,
            "num_microbatches": num_microbatches,
        }
    )


def _timings(job: JobConfig, orders: PipelineOrders, profile: Profile, repeats: int) -> dict[str, float]:
    spec = job.spec()
    builds, setups, runs = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        dag = job.build_dag(orders, spec)
        built = time.perf_counter()
        simulator = Simulator(dag, profile)
        ready = time.perf_counter()
        simulator.run()
        done = time.perf_counter()
        builds.append(built - start)
        setups.append(ready - built)
        runs.append(done - ready)
    return {
        "build": statistics.median(builds),
        "setup": statistics.median(setups),
        "run": statistics.median(runs),
        "nodes": len(dag.nodes),
        "edges": dag.graph.number_of_edges(),
    }


def _peak_bytes(job: JobConfig, orders: PipelineOrders, profile: Profile) -> tuple[int, int]:
    """Peak traced memory of building and simulating, and the node count."""
    spec = job.spec()
    tracemalloc.start()
    dag = job.build_dag(orders, spec)
    Simulator(dag, profile).run()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, len(dag.nodes)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (median reported)")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(f"pipeline DAG + simulator benchmark, PP={STAGES}, VPP={CHUNKS}, one CPU core (measured wall time)")

    start = time.perf_counter()
    _job(2 * STAGES).orders()
    print(f"  megatron-core import (first schedule call): {time.perf_counter() - start:.2f} s")

    results = {}
    for microbatches in MICROBATCHES:
        job = _job(microbatches)
        start = time.perf_counter()
        orders = job.orders()
        schedule_s = time.perf_counter() - start
        profile = job.synthetic_profile()
        timing = _timings(job, orders, profile, args.repeats)
        peak, nodes = _peak_bytes(job, orders, profile)
        results[microbatches] = (timing, peak, nodes)
        total = timing["build"] + timing["setup"] + timing["run"]
        print(
            f"  M={microbatches}: {timing['nodes']:,} nodes, {timing['edges']:,} edges | schedule from "
            f"megatron {schedule_s * 1e3:.1f} ms | build {timing['build'] * 1e3:.0f} ms | simulate "
            f"{(timing['setup'] + timing['run']) * 1e3:.0f} ms (setup {timing['setup'] * 1e3:.0f} + run "
            f"{timing['run'] * 1e3:.0f}) | build+simulate {total:.2f} s (median of {args.repeats}) | "
            f"peak memory {peak / 2**20:.1f} MiB = {peak / nodes:,.0f} B/node"
        )
    small, large = (results[m] for m in MICROBATCHES)
    print(
        f"  memory per node, M={MICROBATCHES[0]} vs M={MICROBATCHES[1]}: {small[1] / small[2]:,.0f} vs "
        f"{large[1] / large[2]:,.0f} B/node (nodes x{large[2] / small[2]:.2f}, "
        f"peak x{large[1] / small[1]:.2f})"
    )
    timing = large[0]
    total = timing["build"] + timing["setup"] + timing["run"]
    verdict = "meets" if total < TARGET_S else "MISSES"
    print(
        f"  PP={STAGES} M={MICROBATCHES[1]} VPP={CHUNKS}: build+simulate {total:.2f} s {verdict} the "
        f"{TARGET_S} s target"
    )
    return 0 if total < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
