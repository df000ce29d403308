r"""Read-only calibration of a GPU spec at stock clocks: nothing on the GPU is changed.

Holds four loops on one GPU for ``--loop-s`` seconds each (at least 2 s, so that the ~100 ms energy counter
advances 20+ times) while a sampler thread polls NVML every ``--poll-s``:

1. ``compute``: a bf16 8192 x 8192 x 8192 matrix product, repeated (compute-bound; the clock the GPU chooses
   under its power limit is the sampled SM clock);
2. ``memory``: a device-to-device copy of ``--copy-gib`` GiB, repeated (memory-bound; GB/s counts bytes
   read + written);
3. ``blocked``: ``torch.cuda._sleep``, one thread block spinning on the SM clock counter, back to back: the
   way NCCL's kernels spin on a flag while a collective or pipeline receive waits for its peer, so the GPU
   is "busy" on one SM and idle everywhere else;
4. ``idle``: nothing launched, right after the loops (warm idle, as between a training step's instructions).

Power per loop is the least-squares slope of the total-energy counter over its updates inside the loop
(``megatron_energy.dvfs.calibration.power_from_counter``), the counter period the median interval between
updates. Only read-only NVML calls are made: ``nvmlDeviceGetTotalEnergyConsumption``,
``nvmlDeviceGetPowerUsage``, ``nvmlDeviceGetClockInfo``, ``nvmlDeviceGetSupportedMemoryClocks``,
``nvmlDeviceGetSupportedGraphicsClocks``, ``nvmlDeviceGetPowerManagementLimit``, ``nvmlDeviceGetName``,
``nvmlSystemGetDriverVersion``. Every figure is *measured*.

Writes the calibrated spec (schema of ``configs/gpus/*.yaml``, every value's source) to ``--out`` and the raw
measurements to ``--json``, and prints the fields that differ from the shipped spec ``--shipped``::

    python scripts/gpu_calibrate.py --out configs/gpus/h200.calibrated.yaml --json calibration.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pynvml
import torch

from megatron_energy.dvfs.calibration import (
    CalibrationRun,
    LoopMeasurement,
    calibrate_spec,
    power_from_counter,
    spec_differences,
    write_spec_yaml,
)
from megatron_energy.dvfs.spec import load_gpu_spec

RAMP_S = 0.3
"""Counter updates in the first RAMP_S of a loop are left out of its power (clock and power settle)."""
MATMUL_N = 8192
CHUNK_S = 0.05
"""Work enqueued ahead of the GPU: one chunk runs while the next is queued (the launch queue never fills)."""


class NvmlSampler:
    """A thread polling the energy counter, SM clock and power of one GPU (read-only NVML calls)."""

    def __init__(self, handle: object, poll_s: float) -> None:
        self._handle = handle
        self._poll_s = poll_s
        self.samples: list[tuple[float, float, float, float]] = []
        """(perf_counter s, energy J, SM clock MHz, power W)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)

    def __enter__(self) -> NvmlSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            energy_j = pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0
            now = time.perf_counter()
            clock = pynvml.nvmlDeviceGetClockInfo(self._handle, pynvml.NVML_CLOCK_SM)
            power_w = pynvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
            self.samples.append((now, energy_j, float(clock), power_w))
            self._stop.wait(self._poll_s)

    def window(self, start_s: float, end_s: float) -> list[tuple[float, float, float, float]]:
        """The samples taken in ``[start_s + RAMP_S, end_s]``."""
        return [s for s in self.samples if start_s + RAMP_S <= s[0] <= end_s]


def timed_loop(
    sampler: NvmlSampler, name: str, step: Callable[[], None], seconds: float, detail: str
) -> tuple[LoopMeasurement, list[float], int]:
    """Run ``step`` back to back for about ``seconds`` (sized from a warm-up); measure power and clock.

    Returns:
        The measurement (rate left 0 for the caller to fill), the counter period seen, and repetitions.
    """
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    probe_start, probe_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe_start.record()
    for _ in range(10):
        step()
    probe_end.record()
    torch.cuda.synchronize()
    step_s = probe_start.elapsed_time(probe_end) / 1000.0 / 10
    repetitions = max(1, round(seconds / step_s))
    per_chunk = max(1, round(CHUNK_S / step_s))
    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall_start = time.perf_counter()
    start_event.record()
    in_flight: torch.cuda.Event | None = None
    for first in range(0, repetitions, per_chunk):
        for _ in range(min(per_chunk, repetitions - first)):
            step()
        chunk_done = torch.cuda.Event()
        chunk_done.record()
        if in_flight is not None:
            in_flight.synchronize()  # waits without the GIL, so the sampler thread keeps polling
        in_flight = chunk_done
    end_event.record()
    torch.cuda.synchronize()
    wall_end = time.perf_counter()
    duration_s = start_event.elapsed_time(end_event) / 1000.0
    loop, periods = measure(sampler, name, wall_start, wall_end, duration_s, detail)
    return loop, periods, repetitions


def measure(
    sampler: NvmlSampler, name: str, wall_start: float, wall_end: float, duration_s: float, detail: str
) -> tuple[LoopMeasurement, list[float]]:
    """Power (counter slope) and median SM clock over the sampler's window; the counter period seen."""
    window = sampler.window(wall_start, wall_end)
    power_w, period_s = power_from_counter([s[0] for s in window], [s[1] for s in window])
    clock = statistics.median(s[2] for s in window)
    instant_w = statistics.median(s[3] for s in window)
    detail = f"{detail}; NVML instant-power field median {instant_w:.0f} W"
    loop = LoopMeasurement(name, duration_s, power_w, clock, 0.0, detail)
    return loop, [] if period_s is None else [period_s]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--shipped", default="h200", help="shipped spec to compare with and carry from")
    parser.add_argument("--out", type=Path, default=Path("configs/gpus/h200.calibrated.yaml"))
    parser.add_argument("--json", type=Path, default=None, help="raw measurements as JSON")
    parser.add_argument("--loop-s", type=float, default=4.0, help="seconds per loop (at least 2)")
    parser.add_argument("--poll-s", type=float, default=0.005)
    parser.add_argument("--copy-gib", type=float, default=2.0)
    args = parser.parse_args()
    if args.loop_s < 2.0:
        parser.error("--loop-s must be at least 2 s: the energy counter updates every ~100 ms")
    shipped = load_gpu_spec(args.shipped)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    torch.cuda.set_device(args.gpu)
    memory_clocks = tuple(pynvml.nvmlDeviceGetSupportedMemoryClocks(handle))
    sm_clocks = tuple(pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, max(memory_clocks)))

    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    c = torch.empty_like(a)
    elements = int(args.copy_gib * 2**30) // 2
    src = torch.randn(elements, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    spin_cycles = int(0.05 * max(sm_clocks) * 1e6)  # ~50 ms per spin kernel at the top clock
    with NvmlSampler(handle, args.poll_s) as sampler:
        compute, compute_periods, products = timed_loop(
            sampler, "compute", lambda: torch.matmul(a, b, out=c), args.loop_s, f"bf16 {MATMUL_N}^3 matmul"
        )
        memory, memory_periods, copies = timed_loop(
            sampler, "memory", lambda: dst.copy_(src), args.loop_s, f"{args.copy_gib:g} GiB device copy"
        )
        blocked, blocked_periods, _ = timed_loop(
            sampler,
            "blocked",
            lambda: torch.cuda._sleep(spin_cycles),
            args.loop_s,
            "torch.cuda._sleep spin kernel, one block",
        )
        idle_start = time.perf_counter()
        time.sleep(args.loop_s)
        idle_end = time.perf_counter()
        idle, idle_periods = measure(
            sampler, "idle", idle_start, idle_end, idle_end - idle_start, "no kernel"
        )
    compute = dataclasses.replace(compute, rate=2 * MATMUL_N**3 * products / compute.duration_s / 1e12)
    memory = dataclasses.replace(memory, rate=2 * src.nbytes * copies / memory.duration_s / 1e9)
    periods = compute_periods + memory_periods + blocked_periods + idle_periods
    run = CalibrationRun(
        gpu_name=pynvml.nvmlDeviceGetName(handle),
        driver_version=pynvml.nvmlSystemGetDriverVersion(),
        date=datetime.date.today().isoformat(),
        supported_sm_clocks_mhz=sm_clocks,
        supported_memory_clocks_mhz=memory_clocks,
        power_limit_w=pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0,
        counter_period_s=statistics.median(periods) if periods else None,
        compute=compute,
        memory=memory,
        blocked=blocked,
        idle=idle,
    )
    spec = calibrate_spec(shipped, run, name=args.out.stem)
    header = (
        f"{run.gpu_name} calibrated at stock clocks by scripts/gpu_calibrate.py on {run.date} "
        f"(driver {run.driver_version}); read-only, nothing on the GPU was changed.\n"
        f"Fields marked 'measured' come from this run; the rest are carried from {shipped.name}.yaml."
    )
    write_spec_yaml(spec, args.out, header)
    report = {"source": "measured (NVML counters, CUDA events)", "run": dataclasses.asdict(run)}
    report["differences_vs_shipped"] = spec_differences(shipped, spec)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "run"}, indent=2))
    for loop in (run.compute, run.memory, run.blocked, run.idle):
        print(
            f"{loop.name:8s} {loop.power_w:7.1f} W  SM {loop.median_sm_clock_mhz:6.0f} MHz  "
            f"{loop.duration_s:5.2f} s  rate {loop.rate:8.1f}  (measured)"
        )
    print(f"counter period {run.counter_period_s} s, power limit {run.power_limit_w} W (measured)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
