r"""``megatron-energy calibrate``: a GPU spec fitted to what this GPU does by itself at stock clocks.

Nothing on the GPU is changed: no clock, power limit or other setting. One workload per kernel class runs for
``--loop-s`` seconds back to back (the second half is measured, so that clock and power have settled) and
then ``--duty-s`` seconds duty-cycled, bursts of kernels with idle gaps, below the power limit
(``dvfs.calibration_loops``): bf16, fp16, tf32 and fp8 matrix products at 8192³ (they reach the power cap on
Hopper GPUs) and bf16 at 2048³ (it stays near the top clock), causal fused attention, an elementwise loop and
a device copy (memory-bound), a spinning wait (``blocked``) and an idle window; a sampler thread polls NVML
every ``--poll-s`` (``dvfs.calibration_nvml``, which tripwires every NVML setter). About two minutes in all.

Under its power limit the GPU chooses a lower SM clock for hotter kernels. From those clocks and the
duty-cycled powers ``dvfs.calibration_fit`` fits the voltage curve above its knee, the bf16 product's dynamic
power and each class's activity, then predicts every class's cap clock and prints it beside the measured one
(the table's "error" column). Figures from the GPU are *measured*; predictions are *modelled*. Fields the run
cannot measure are carried from the shipped spec (``--shipped``) and the written file says which. Use the
result with ``--energy-gpu-spec PATH.yaml``::

    megatron-energy calibrate --shipped h100-sxm --out h100-sxm.calibrated.yaml --json calibration.json

``--from-json`` fits a run recorded earlier (no GPU needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from megatron_energy.commands.arguments import plain_text
from megatron_energy.dvfs.calibrated_spec import calibrate_spec
from megatron_energy.dvfs.calibration import (
    CalibrationRun,
    comparison_lines,
    spec_differences,
    write_spec_yaml,
)
from megatron_energy.dvfs.calibration_fit import fit_curve, residual_lines, spec_check_lines
from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec

LOOP_S_RANGE = (2.0, 20.0)
"""Seconds per loop: the energy counter updates every ~100 ms and half of each loop is measured."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` subcommand."""
    parser = subparsers.add_parser(
        "calibrate",
        help="fit a GPU spec to what this GPU does at stock clocks (read-only: nothing on it is changed)",
        description=plain_text(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--gpu", type=int, default=0, help="the CUDA/NVML index of the GPU to measure")
    parser.add_argument(
        "--shipped", default="h200", help="the shipped spec to compare with and carry unmeasured fields from"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the spec file to write (default: ./<shipped>.calibrated.yaml)"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="also write the measurements and the fit as JSON"
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="fit the run recorded in this --json file instead of measuring",
    )
    parser.add_argument(
        "--loop-s", type=float, default=6.0, help="seconds of each back-to-back loop (2 to 20)"
    )
    parser.add_argument("--duty-s", type=float, default=4.0, help="seconds of each duty-cycled run (2 to 20)")
    parser.add_argument("--poll-s", type=float, default=0.005, help="NVML sampling period in seconds")
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the copy loop's copy")
    parser.set_defaults(func=run)


def problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags or this machine for a calibration, or ``None``."""
    low, high = LOOP_S_RANGE
    for flag, value in (("--loop-s", args.loop_s), ("--duty-s", args.duty_s)):
        if not low <= value <= high:
            return f"{flag} {value:g}: give {low:g} to {high:g} s (the energy counter updates every ~100 ms)"
    try:
        load_gpu_spec(args.shipped)
    except ValueError as error:
        return f"--shipped: {error}"
    if args.from_json is not None:
        return None if args.from_json.is_file() else f"--from-json {args.from_json}: no such file"
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
    started = time.perf_counter()
    shipped = load_gpu_spec(args.shipped)
    out: Path = args.out or Path(f"{shipped.name}.calibrated.yaml")
    measured = _measured_run(args, shipped)
    report: dict[str, object] = {"source": "measured (NVML counters, CUDA events)", "run": measured.to_dict()}
    if args.json:  # the measurements first: a fit that fails loses nothing
        _write_json(args.json, report)
    try:
        fit = fit_curve(
            measured, shipped.voltage_knee_mhz, shipped.memory_power_w, shipped.memory_saturation_mhz or 0.0
        )
        spec = calibrate_spec(shipped, measured, fit, name=out.stem)
    except ValueError as error:
        print(f"megatron-energy calibrate: the measurements cannot be fitted: {error}")
        return 2
    source = (
        f"--from-json {args.from_json}"
        if args.from_json
        else f"--loop-s {args.loop_s:g} --duty-s {args.duty_s:g}"
    )
    header = (
        f"{measured.gpu_name} calibrated at stock clocks by megatron-energy calibrate on {measured.date} "
        f"(driver {measured.driver_version}); read-only, nothing on the GPU was changed.\n"
        f"Written by: megatron-energy calibrate --shipped {args.shipped} {source} --out {out}\n"
        f"Fields marked 'measured' come from this run; the rest are carried from {shipped.name}.yaml."
    )
    write_spec_yaml(spec, out, header)
    if args.json:
        report["fit"] = dataclasses.asdict(fit)
        report["differences_vs_shipped"] = spec_differences(shipped, spec)
        _write_json(args.json, report)
    print(f"counter period {measured.counter_period_s} s, power limit {measured.power_limit_w} W (measured)")
    print("\n".join(residual_lines(fit)))
    print("\n".join(spec_check_lines(shipped, fit)))
    print(f"wrote {out} in {time.perf_counter() - started:.0f} s (measured wall clock)")
    print("\n".join(comparison_lines(shipped, spec)))
    print(f"use it with --energy-gpu-spec {out}")
    return 0


def _measured_run(args: argparse.Namespace, shipped: GpuSpec) -> CalibrationRun:
    """The run: read from ``--from-json``, or measured on the GPU now (one line per loop as it ends)."""
    if args.from_json is not None:
        return CalibrationRun.from_dict(json.loads(args.from_json.read_text())["run"])
    from megatron_energy.dvfs.calibration_loops import measure_gpu
    from megatron_energy.dvfs.calibration_nvml import LoopTiming

    timing = LoopTiming(loop_s=args.loop_s, duty_s=args.duty_s, poll_s=args.poll_s)
    top = max(shipped.sm_clocks_mhz)
    return measure_gpu(args.gpu, top, args.copy_gib, timing, progress=lambda line: print(line, flush=True))


def _write_json(path: Path, report: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
