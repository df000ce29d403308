r"""Host cost of a kernel launch on the training thread, beside what the plugin might leave running (GPU).

A launch-bound loop (``--launches`` in-place adds on a small CUDA tensor, one Python call each) is timed on
the host, median of ``--repeats``, alone and then with each disturbance a plugin could bring to a training
process: another thread that records and queries events, spins or blocks in ``event.synchronize()``,
reads the NVML energy counter at 10 Hz, or only sleeps; and, last because it cannot be undone in the
process, a finished ``torch.profiler`` profile with CPU and CUDA activities, with Kineto's CUPTI teardown
asked for (``--teardown``: ``TEARDOWN_CUPTI=1`` while the profile runs, as
``runtime.profiling.kernel_timeline`` does) or not. Every figure is *measured* (host wall clock, µs per
launch); nothing on the GPU is changed (NVML is only read). Run it once per teardown setting, in separate
processes:

    python lab/bench_launch_disturbance.py
    python lab/bench_launch_disturbance.py --teardown
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any


def launch_cost_us(torch: Any, tensor: Any, launches: int, repeats: int) -> float:
    """Median host µs per launch of ``launches`` in-place adds, over ``repeats`` loops."""
    costs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(launches):
            tensor.add_(1.0)
        costs.append(1e6 * (time.perf_counter() - began) / launches)
    torch.cuda.synchronize()
    return statistics.median(costs)


def disturbances(torch: Any) -> dict[str, Callable[[threading.Event], None]]:
    """Each disturbance, as the body of a thread that runs until its stop event is set."""

    def record_and_query_every_ms(stop: threading.Event) -> None:
        while not stop.is_set():
            event = torch.cuda.Event()
            event.record()
            while not event.query() and not stop.is_set():
                time.sleep(0.001)

    def query_one_event_every_5_ms(stop: threading.Event) -> None:
        event = torch.cuda.Event()
        event.record()
        while not stop.is_set():
            event.query()
            time.sleep(0.005)

    def synchronize_events(blocking: bool) -> Callable[[threading.Event], None]:
        def body(stop: threading.Event) -> None:
            while not stop.is_set():
                event = torch.cuda.Event(blocking=blocking)
                event.record()
                event.synchronize()

        return body

    def read_energy_at_10_hz(stop: threading.Event) -> None:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        while not stop.is_set():
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            time.sleep(0.1)

    def sleep_in_steps(step_s: float) -> Callable[[threading.Event], None]:
        def body(stop: threading.Event) -> None:
            while not stop.is_set():
                time.sleep(step_s)

        return body

    return {
        "a thread records and queries an event every 1 ms": record_and_query_every_ms,
        "a thread queries one event every 5 ms": query_one_event_every_5_ms,
        "a thread spins in event.synchronize(), event after event": synchronize_events(blocking=False),
        "a thread blocks in event.synchronize(), event after event": synchronize_events(blocking=True),
        "a thread reads the NVML energy counter at 10 Hz": read_energy_at_10_hz,
        "a thread sleeps in 1 ms steps (no CUDA call)": sleep_in_steps(0.001),
        "a thread sleeps in 5 ms steps (no CUDA call)": sleep_in_steps(0.005),
    }


def main() -> None:
    """Print the launch cost alone, beside each disturbance, and after a finished profile."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--teardown", action="store_true", help="TEARDOWN_CUPTI=1 while the profile runs")
    args = parser.parse_args()
    import torch

    tensor = torch.zeros(4096, device="cuda")

    def measure() -> float:
        return launch_cost_us(torch, tensor, args.launches, args.repeats)

    measure()  # warm-up
    alone_us = measure()
    print(f"{'alone':60s} {alone_us:7.2f} µs per launch (measured)")
    for name, body in disturbances(torch).items():
        stop = threading.Event()
        thread = threading.Thread(target=body, args=(stop,), daemon=True)
        thread.start()
        cost_us = measure()
        stop.set()
        thread.join()
        print(f"{name:60s} {cost_us:7.2f} µs per launch ({cost_us / alone_us:.2f}x alone; measured)")
    if args.teardown:
        os.environ["TEARDOWN_CUPTI"] = "1"
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True):
        for _ in range(100):
            tensor.add_(1.0)
        torch.cuda.synchronize()
    os.environ.pop("TEARDOWN_CUPTI", None)
    after_us = measure()
    teardown = "CUPTI teardown asked for" if args.teardown else "Kineto's default teardown"
    print(
        f"{'after a finished torch.profiler profile (' + teardown + ')':60s} {after_us:7.2f} µs per launch "
        f"({after_us / alone_us:.2f}x alone; measured; torch {torch.__version__}, CUDA {torch.version.cuda})"
    )


if __name__ == "__main__":
    main()
