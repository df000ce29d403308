"""Read-only check of the GPU layer on a real GPU (written for an H200): backend, controller, meter.

What it does, all without changing any GPU setting:

1. opens GPU 0 through the real (zeus) backend in dry-run mode and reads its name, supported clocks, power
   limit, energy counter, power and temperature, and what one counter/power read costs;
2. runs bf16 matmuls with a boundary CUDA event every ``--boundary-every`` matmuls, the dry-run
   ``FrequencyController`` asked for an alternating clock at each boundary (the script's own timing-enabled
   events + ``request``, or ``request_at_boundary``); reports the training thread's cost per boundary, how
   late the controller thread sees a boundary the GPU passed (observation lag, own events only), the
   would-be switch latency it records (boundary seen -> setter would be called), and matmul throughput
   with and without the controller;
3. measures one ``--window-s`` (5 s) busy window three ways at once: the raw counter read at both ends,
   ``zeus.monitor.ZeusMonitor``, and our ``EnergyMeter``; plus a 50 ms window the meter must mark unresolved.

Safety: every clock/power/persistence setter is replaced by a tripwire, both on the zeus GPU objects and on
the ``pynvml`` functions themselves; the script asserts that none was called and exits non-zero otherwise.
All figures are *measured* (NVML counters, CUDA events, perf_counter).

Run: ``python lab/gpu_check_dvfs.py --out result.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from megatron_energy.dvfs.backends import open_gpus, supported_sm_clocks_mhz
from megatron_energy.dvfs.calibration_nvml import SetterTripwires
from megatron_energy.dvfs.controller import FrequencyController
from megatron_energy.dvfs.meter import EnergyMeter

GPU_INDEX = 0
ZEUS_SETTERS = (
    "set_power_management_limit",
    "reset_power_management_limit",
    "set_persistence_mode",
    "set_memory_locked_clocks",
    "reset_memory_locked_clocks",
    "set_gpu_locked_clocks",
    "reset_gpu_locked_clocks",
)


class Tripwires(SetterTripwires):
    """Replaces every setter that could reach the GPU with a function that counts and raises."""

    def install_all(self, gpus: Any) -> None:
        """Wire the zeus setters of ``gpus`` and its GPUs, and every pynvml set/reset/clear function."""
        import pynvml

        for target in (gpus, *gpus.gpus):
            for name in ZEUS_SETTERS:
                setattr(target, name, self.wire(f"zeus {type(target).__name__}.{name}"))
        self.install(pynvml)


def median_ms(samples_s: list[float]) -> float:
    return statistics.median(samples_s) * 1000


def summary_us(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    if not ordered:
        return {"count": 0}

    def quantile_us(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6

    return {
        "median_us": quantile_us(0.5),
        "p90_us": quantile_us(0.9),
        "max_us": ordered[-1] * 1e6,
        "count": len(ordered),
    }


def timed_reads(read: Callable[[], object], count: int = 20) -> float:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        read()
        samples.append(time.perf_counter() - start)
    return median_ms(samples)


def read_gpu_facts(gpus: Any) -> dict[str, Any]:
    memory_clocks = gpus.get_supported_memory_clocks(GPU_INDEX)
    sm_clocks = supported_sm_clocks_mhz(gpus, GPU_INDEX)
    return {
        "name": gpus.get_name(GPU_INDEX),
        "memory_clocks_mhz": memory_clocks,
        "sm_clocks_mhz": {"count": len(sm_clocks), "max": max(sm_clocks), "min": min(sm_clocks)},
        "power_limit_w": gpus.get_power_management_limit(GPU_INDEX) / 1000,
        "energy_counter_mj": gpus.get_total_energy_consumption(GPU_INDEX),
        "instant_power_w": gpus.get_instant_power_usage(GPU_INDEX) / 1000,
        "average_power_w": gpus.get_average_power_usage(GPU_INDEX) / 1000,
        "temperature_c": gpus.get_gpu_temperature(GPU_INDEX),
        "energy_read_median_ms": timed_reads(lambda: gpus.get_total_energy_consumption(GPU_INDEX)),
        "power_read_median_ms": timed_reads(lambda: gpus.get_instant_power_usage(GPU_INDEX)),
    }


def matmul_loop(
    a: torch.Tensor, b: torch.Tensor, args: argparse.Namespace, at_boundary: Callable[[int], None]
) -> tuple[float, float]:
    """Run ``args.matmuls`` matmuls, calling ``at_boundary(k)`` before every ``args.boundary_every``-th.

    The CPU may run at most ``args.run_ahead`` boundaries ahead of the GPU (the harness waits on an event of
    its own, outside the timed calls), like a training loop, so CUDA's launch queue never fills and the
    timed calls measure their own cost rather than launch back-pressure.

    Returns:
        (seconds, TFLOP/s) of the whole loop, from CUDA events.
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = torch.empty_like(a)
    pacing: list[torch.cuda.Event] = []
    start.record()
    for i in range(args.matmuls):
        if i % args.boundary_every == 0:
            k = i // args.boundary_every
            if k >= args.run_ahead:
                pacing[k - args.run_ahead].synchronize()
            at_boundary(k)
            pacing.append(torch.cuda.Event())
            pacing[-1].record()
        torch.matmul(a, b, out=out)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    return seconds, 2 * a.shape[0] * a.shape[1] * b.shape[1] * args.matmuls / seconds / 1e12


def run_without_controller(a: torch.Tensor, b: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    """Baseline: the same loop recording a bare (blocking) event per boundary, no controller."""
    record_cost_s: list[float] = []

    def at_boundary(k: int) -> None:
        start = time.perf_counter()
        torch.cuda.Event(blocking=True).record()
        record_cost_s.append(time.perf_counter() - start)

    seconds, tflops = matmul_loop(a, b, args, at_boundary)
    return {"seconds": seconds, "tflops": tflops, "bare_event_record_cost": summary_us(record_cost_s)}


def run_with_controller(
    handle: Any, a: torch.Tensor, b: torch.Tensor, args: argparse.Namespace, own_events: bool, blocking: bool
) -> dict[str, Any]:
    """One matmul run with a dry-run controller request at every boundary.

    ``own_events``: the script records a timing-enabled event per boundary and passes it to ``request``
    (timed alone), which also measures the observation lag: when the GPU passed the boundary (event
    timestamp, mapped to host time through a reference event) -> when the controller thread saw it.
    Otherwise the controller's ``request_at_boundary`` records the events (timed as a whole).
    """
    clocks = supported_sm_clocks_mhz(handle.gpus, GPU_INDEX)
    alternating = (max(clocks), sorted(clocks)[len(clocks) // 2])
    controller = FrequencyController(
        handle.gpus, GPU_INDEX, clocks, dry_run=handle.mode == "dry-run", blocking_events=blocking
    )
    assert controller.dry_run, "the GPU check must run the controller in dry-run mode"
    call_cost_s: list[float] = []
    timed_events: list[torch.cuda.Event] = []
    reference = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    reference.record()
    reference.synchronize()
    reference_host_s = time.perf_counter()

    def at_boundary(k: int) -> None:
        if own_events:
            event = torch.cuda.Event(blocking=blocking, enable_timing=True)
            event.record()
            timed_events.append(event)
            start = time.perf_counter()
            controller.request(alternating[k % 2], event)
        else:
            start = time.perf_counter()
            controller.request_at_boundary(alternating[k % 2])
        call_cost_s.append(time.perf_counter() - start)

    seconds, tflops = matmul_loop(a, b, args, at_boundary)
    assert controller.flush(30), "controller did not drain its queue"
    records = controller.switch_records()
    controller.close()
    assert all(record.dry_run for record in records)
    result = {
        "seconds": seconds,
        "tflops": tflops,
        "training_thread_cost_per_call": summary_us(call_cost_s),
        "would_be_switch_latency": summary_us([record.latency_s for record in records]),
        "controller_stats": controller.stats(),
    }
    if timed_events and len(records) == len(timed_events):
        gpu_passed_s = [reference_host_s + reference.elapsed_time(event) / 1000 for event in timed_events]
        lags = [
            record.boundary_reached_at_s - passed
            for record, passed in zip(records, gpu_passed_s, strict=True)
        ]
        result["observation_lag"] = summary_us(lags)
    return result


def check_controller(
    handle: Any, a: torch.Tensor, b: torch.Tensor, args: argparse.Namespace
) -> dict[str, Any]:
    """Matmul throughput without a controller, then with one (own/controller events, blocking/spinning)."""
    baseline = run_without_controller(a, b, args)
    results: dict[str, Any] = {
        "note": "latency = boundary event observed complete -> setter would be called (dry run: NVML set "
        "time and the hardware transition are not included); cost per call is on the training thread",
        "boundaries_per_run": -(-args.matmuls // args.boundary_every),
        "baseline_bare_events": baseline,
    }
    runs = {
        "request_only_with_own_timed_blocking_events": (True, True),
        "request_at_boundary_blocking_events": (False, True),
        "request_at_boundary_spinning_events": (False, False),
    }
    for label, (own_events, blocking) in runs.items():
        run = run_with_controller(handle, a, b, args, own_events, blocking)
        run["slowdown_vs_baseline"] = run["seconds"] / baseline["seconds"] - 1
        results[label] = run
    return results


def busy_for(a: torch.Tensor, b: torch.Tensor, seconds: float) -> None:
    out = torch.empty_like(a)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(20):
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize()


def check_meter(handle: Any, a: torch.Tensor, b: torch.Tensor, window_s: float) -> dict[str, Any]:
    from zeus.monitor import ZeusMonitor

    gpus = handle.gpus
    meter = EnergyMeter.from_handle(handle, [GPU_INDEX])
    monitor = ZeusMonitor(gpu_indices=[GPU_INDEX], cpu_indices=[])
    torch.cuda.synchronize()
    monitor.begin_window("reference", sync_execution=False)
    raw_begin_mj = gpus.get_total_energy_consumption(GPU_INDEX)
    meter.begin_window("check")
    busy_for(a, b, window_s)
    ours = meter.end_window("check")
    raw_end_mj = gpus.get_total_energy_consumption(GPU_INDEX)
    reference = monitor.end_window("reference", sync_execution=False)
    raw_j = (raw_end_mj - raw_begin_mj) / 1000
    zeus_j = reference.gpu_energy[GPU_INDEX]
    meter.begin_window("short")
    busy_for(a, b, 0.05)
    short = meter.end_window("short")
    return {
        "window_s": ours.duration_s,
        "meter_j": ours.energy_j,
        "meter_resolved": ours.resolved,
        "meter_source": ours.source,
        "zeus_monitor_j": zeus_j,
        "zeus_monitor_s": reference.time,
        "raw_counter_j": raw_j,
        "meter_vs_zeus_relative": ours.energy_j / zeus_j - 1 if zeus_j else None,
        "meter_vs_raw_relative": ours.energy_j / raw_j - 1 if raw_j else None,
        "average_power_w": ours.average_power_w,
        "short_window": {"duration_s": short.duration_s, "resolved": short.resolved, "note": short.note},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON result file")
    parser.add_argument("--size", type=int, default=8192, help="square bf16 matmul size")
    parser.add_argument("--matmuls", type=int, default=1600, help="matmuls per controller run")
    parser.add_argument("--boundary-every", type=int, default=8, help="matmuls between boundary events")
    parser.add_argument(
        "--run-ahead", type=int, default=4, help="boundaries the CPU may run ahead of the GPU"
    )
    parser.add_argument("--window-s", type=float, default=5.0, help="length of the meter reference window")
    args = parser.parse_args()

    handle = open_gpus("zeus", None, dry_run=True)
    result: dict[str, Any] = {"source": "measured", "mode": handle.mode, "reason": handle.reason}
    if handle.mode != "dry-run" or len(handle.gpus) == 0:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(result, indent=2))
        return 1
    tripwires = Tripwires()
    tripwires.install_all(handle.gpus)
    try:
        result["gpu"] = read_gpu_facts(handle.gpus)
        a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
        busy_for(a, b, 1.0)  # warm up clocks and kernels
        result["controller_dry_run"] = check_controller(handle, a, b, args)
        result["meter"] = check_meter(handle, a, b, args.window_s)
    finally:
        result["setter_calls"] = tripwires.calls
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(result, indent=2))
    assert not tripwires.calls, f"setters were called: {tripwires.calls}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
