r"""``megatron-energy calibrate``: a GPU spec measured on this GPU at stock clocks, read-only.

Nothing on the GPU is changed: no clock, power limit or persistence setting. Four loops run on one GPU for
``--loop-s`` seconds each (at least 2 s, so that the ~100 ms energy counter advances 20+ times; default 3 s,
about 30 s in all) while a sampler thread polls NVML every ``--poll-s`` (``dvfs.calibration_nvml``, which also
tripwires every NVML setter):

1. ``compute``: a bf16 8192 x 8192 x 8192 matrix product, repeated (compute-bound; the clock the GPU chooses
   under its power limit is the sampled SM clock);
2. ``memory``: a device-to-device copy of ``--copy-gib`` GiB, repeated (memory-bound; GB/s counts bytes read
   and written);
3. ``blocked``: ``torch.cuda._sleep``, one thread block spinning on the SM clock counter, back to back (how
   NCCL's kernels keep one SM busy while a collective waits for its peer);
4. ``idle``: nothing launched, right after the loops (warm idle).

Power per loop is the least-squares slope of the total-energy counter over its updates inside the loop
(``dvfs.calibration.power_from_counter``). Every figure is *measured*; fields the run cannot measure are
carried from the shipped spec (``--shipped``) and the written file says which. Use the result with
``--energy-gpu-spec PATH.yaml``::

    megatron-energy calibrate --shipped h200 --out h200.calibrated.yaml --json calibration.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from megatron_energy.dvfs.calibration import (
    calibrate_spec,
    comparison_lines,
    spec_differences,
    write_spec_yaml,
)
from megatron_energy.dvfs.spec import load_gpu_spec

LOOP_S_RANGE = (2.0, 10.0)
"""Seconds per loop: the energy counter updates every ~100 ms; four loops stay under a minute."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` subcommand."""
    parser = subparsers.add_parser(
        "calibrate",
        help="measure a GPU spec on this GPU at stock clocks (read-only: nothing on the GPU is changed)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--gpu", type=int, default=0, help="the CUDA/NVML index of the GPU to measure")
    parser.add_argument(
        "--shipped", default="h200", help="the shipped spec to compare with and carry unmeasured fields from"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the spec file to write (default: ./<shipped>.calibrated.yaml)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the raw measurements as JSON")
    parser.add_argument("--loop-s", type=float, default=3.0, help="seconds per loop (2 to 10)")
    parser.add_argument("--poll-s", type=float, default=0.005, help="NVML sampling period in seconds")
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the memory loop's copy")
    parser.set_defaults(func=run)


def problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags or this machine for a calibration, or ``None``."""
    low, high = LOOP_S_RANGE
    if not low <= args.loop_s <= high:
        return (
            f"--loop-s {args.loop_s:g}: give {low:g} to {high:g} s (the energy counter updates every "
            "~100 ms; four loops should stay under a minute)"
        )
    try:
        load_gpu_spec(args.shipped)
    except ValueError as error:
        return f"--shipped: {error}"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch: calibrate measures a GPU, run it on a machine with one"
    if not 0 <= args.gpu < torch.cuda.device_count():
        return f"--gpu {args.gpu}: this machine has GPUs 0 to {torch.cuda.device_count() - 1}"
    return None


def run(args: argparse.Namespace) -> int:
    """Calibrate; exit status 2 with one line when the flags or the machine do not allow it."""
    reason = problem(args)
    if reason is not None:
        print(f"megatron-energy calibrate: {reason}")
        return 2
    from megatron_energy.dvfs.calibration_loops import measure_gpu

    started = time.perf_counter()
    shipped = load_gpu_spec(args.shipped)
    out: Path = args.out or Path(f"{shipped.name}.calibrated.yaml")
    measured = measure_gpu(args.gpu, max(shipped.sm_clocks_mhz), args.copy_gib, args.loop_s, args.poll_s)
    spec = calibrate_spec(shipped, measured, name=out.stem)
    header = (
        f"{measured.gpu_name} calibrated at stock clocks by megatron-energy calibrate on {measured.date} "
        f"(driver {measured.driver_version}); read-only, nothing on the GPU was changed.\n"
        f"Fields marked 'measured' come from this run; the rest are carried from {shipped.name}.yaml."
    )
    write_spec_yaml(spec, out, header)
    if args.json:
        report = {"source": "measured (NVML counters, CUDA events)", "run": dataclasses.asdict(measured)}
        report["differences_vs_shipped"] = spec_differences(shipped, spec)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
    for loop in (measured.compute, measured.memory, measured.blocked, measured.idle):
        print(
            f"{loop.name:8s} {loop.power_w:7.1f} W  SM {loop.median_sm_clock_mhz:6.0f} MHz  "
            f"{loop.duration_s:5.2f} s  rate {loop.rate:8.1f}  (measured)"
        )
    print(f"counter period {measured.counter_period_s} s, power limit {measured.power_limit_w} W (measured)")
    print(f"wrote {out} in {time.perf_counter() - started:.0f} s (measured wall clock)")
    print("\n".join(comparison_lines(shipped, spec)))
    print(f"use it with --energy-gpu-spec {out}")
    return 0
