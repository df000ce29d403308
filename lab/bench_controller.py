"""Cost of ``FrequencyController.request`` on the calling (training) thread vs a bare queue put.

Every figure is *measured* in this process: each call is timed on its own with ``time.perf_counter_ns``
(the timer's own cost, reported as ``timer_overhead``, is included in every row alike). The controller runs
on simulated GPUs, so this measures only the Python cost on the caller's thread, with the controller thread
running alongside (and, in ``control`` mode, writing the simulated GPUs' state file while it competes for
the GIL). Requests alternate between two clocks so each one is queued, except in the ``deduped`` row.

Run: ``python lab/bench_controller.py [--calls N] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from megatron_energy.dvfs.controller import FrequencyController
from megatron_energy.dvfs.simulated import SimulatedGPUs
from megatron_energy.dvfs.spec import load_gpu_spec

CLOCKS_MHZ = (1410, 1200)


def time_calls_us(call: Callable[[int], object], calls: int) -> dict[str, float]:
    """Time ``call(i)`` for ``i in range(calls)`` one by one; return median and p99 in µs."""
    samples = []
    clock = time.perf_counter_ns
    for i in range(calls):
        start = clock()
        call(i)
        samples.append(clock() - start)
    samples.sort()
    return {"median_us": statistics.median(samples) / 1000, "p99_us": samples[int(0.99 * (calls - 1))] / 1000}


def bench_controller(mode: str, calls: int, state_dir: Path) -> dict[str, dict[str, float]]:
    spec = load_gpu_spec("h200")
    gpus = SimulatedGPUs(spec, state_path=state_dir / f"{mode}.json")
    controller = FrequencyController(gpus, 0, spec.sm_clocks_mhz, dry_run=mode == "dry-run")
    alternating = time_calls_us(lambda i: controller.request(CLOCKS_MHZ[i % 2]), calls)
    controller.flush(30)
    deduped = time_calls_us(lambda i: controller.request(CLOCKS_MHZ[0]), calls)
    stats = controller.stats()
    controller.close()
    return {"request": alternating, "request_deduped": deduped, "controller_stats": stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls timed per row")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    simple_queue: queue.SimpleQueue[object] = queue.SimpleQueue()
    bounded_queue: queue.Queue[object] = queue.Queue()
    results: dict[str, object] = {
        "source": "measured (perf_counter_ns per call, this process)",
        "calls_per_row": args.calls,
        "timer_overhead": time_calls_us(lambda i: None, args.calls),
        "bare_simplequeue_put": time_calls_us(
            lambda i: simple_queue.put((CLOCKS_MHZ[i % 2], None, 0.0)), args.calls
        ),
        "bare_queue_put_nowait": time_calls_us(
            lambda i: bounded_queue.put_nowait((CLOCKS_MHZ[i % 2], None, 0.0)), args.calls
        ),
    }
    with tempfile.TemporaryDirectory() as state_dir:
        for mode in ("dry-run", "control"):
            results[f"controller_{mode}"] = bench_controller(mode, args.calls, Path(state_dir))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
