r"""Read-only calibration of a GPU spec at stock clocks: nothing on the GPU is changed.

Holds four loops on one GPU for ``--loop-s`` seconds each (at least 2 s, so that the ~100 ms energy counter
advances 20+ times; default 3 s, so the whole run takes about 30 s) while a sampler thread polls NVML every
``--poll-s`` (``megatron_energy.dvfs.calibration_nvml``, which also tripwires every NVML setter):

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

Writes the calibrated spec (schema of ``configs/gpus/*.yaml``, every value's source) next to the shipped one
(``--out``, default ``configs/gpus/h200.calibrated.yaml``) and the raw measurements to ``--json``, and prints
"shipped vs calibrated" per value (``--shipped``), each marked measured or carried::

    python scripts/gpu_calibrate.py --out configs/gpus/h200.calibrated.yaml --json calibration.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pynvml
import torch

from megatron_energy.dvfs.calibration import (
    calibrate_spec,
    comparison_lines,
    spec_differences,
    write_spec_yaml,
)
from megatron_energy.dvfs.calibration_nvml import Loop, run_calibration
from megatron_energy.dvfs.spec import load_gpu_spec

MATMUL_N = 8192
CHUNK_S = 0.05
"""Work enqueued ahead of the GPU: one chunk runs while the next is queued (the launch queue never fills)."""
SHIPPED_FOLDER = Path(__file__).resolve().parents[1] / "configs" / "gpus"


def cuda_loop(step: Callable[[], object]) -> Callable[[float], tuple[float, int]]:
    """Runs ``step`` back to back for about the given seconds (sized from a warm-up); CUDA-event duration."""

    def run(seconds: float) -> tuple[float, int]:
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
        return start_event.elapsed_time(end_event) / 1000.0, repetitions

    return run


def torch_loops(copy_gib: float, max_sm_clock_mhz: int) -> dict[str, Loop]:
    """The compute, memory and blocked loops on the current CUDA device."""
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    c = torch.empty_like(a)
    src = torch.randn(int(copy_gib * 2**30) // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    spin_cycles = int(0.05 * max_sm_clock_mhz * 1e6)  # ~50 ms per spin kernel at the top clock
    return {
        "compute": Loop(
            cuda_loop(lambda: torch.matmul(a, b, out=c)),
            f"bf16 {MATMUL_N}^3 matmul",
            lambda n, s: 2 * MATMUL_N**3 * n / s / 1e12,
        ),
        "memory": Loop(
            cuda_loop(lambda: dst.copy_(src)),
            f"{copy_gib:g} GiB device copy",
            lambda n, s: 2 * src.nbytes * n / s / 1e9,
        ),
        "blocked": Loop(
            cuda_loop(lambda: torch.cuda._sleep(spin_cycles)), "torch.cuda._sleep spin kernel, one block"
        ),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's flags; bad values exit with a message."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--shipped", default="h200", help="shipped spec to compare with and carry from")
    parser.add_argument(
        "--out", type=Path, default=None, help="default: configs/gpus/<shipped>.calibrated.yaml"
    )
    parser.add_argument("--json", type=Path, default=None, help="raw measurements as JSON")
    parser.add_argument("--loop-s", type=float, default=3.0, help="seconds per loop (2 to 10)")
    parser.add_argument("--poll-s", type=float, default=0.005)
    parser.add_argument("--copy-gib", type=float, default=2.0)
    args = parser.parse_args(argv)
    if not 2.0 <= args.loop_s <= 10.0:
        parser.error(
            "--loop-s must be 2 to 10 s: the energy counter updates every ~100 ms; 4 loops stay < 60 s"
        )
    args.out = args.out or SHIPPED_FOLDER / f"{args.shipped}.calibrated.yaml"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    shipped = load_gpu_spec(args.shipped)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    torch.cuda.set_device(args.gpu)
    loops = torch_loops(args.copy_gib, max(shipped.sm_clocks_mhz))
    run = run_calibration(pynvml, handle, loops, args.loop_s, poll_s=args.poll_s)
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
    for loop in (run.compute, run.memory, run.blocked, run.idle):
        print(
            f"{loop.name:8s} {loop.power_w:7.1f} W  SM {loop.median_sm_clock_mhz:6.0f} MHz  "
            f"{loop.duration_s:5.2f} s  rate {loop.rate:8.1f}  (measured)"
        )
    print(f"counter period {run.counter_period_s} s, power limit {run.power_limit_w} W (measured)")
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s (measured wall clock)")
    print("\n".join(comparison_lines(shipped, spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
