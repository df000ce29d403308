"""The GPU spec a calibration run and its fit determine (``megatron-energy calibrate``).

:func:`calibrate_spec` takes a :class:`~megatron_energy.dvfs.calibration.CalibrationRun` and its
:class:`~megatron_energy.dvfs.calibration_fit.CurveFit` and writes the fields they determine into a copy of
the shipped spec, each with its source (which field comes from where:
:mod:`megatron_energy.dvfs.calibration`).

Pure Python: no torch, NVML or zeus imports.
"""

from __future__ import annotations

import dataclasses

from megatron_energy.dvfs.calibration import CalibrationRun, LoopMeasurement
from megatron_energy.dvfs.calibration_fit import CurveFit
from megatron_energy.dvfs.kernel_classes import KernelClass
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.dvfs.spec_ranges import SOURCE_PREFIX


def calibrate_spec(shipped: GpuSpec, run: CalibrationRun, fit: CurveFit, name: str) -> GpuSpec:
    """The spec the calibration run and its fit determine, every other field carried from ``shipped``.

    Args:
        shipped: The shipped spec of this GPU model (its knee and assumptions are kept).
        run: The measurements.
        fit: :func:`~megatron_energy.dvfs.calibration_fit.fit_curve` of ``run``.
        name: The new spec's name (the stem of the file it will be written to).

    Returns:
        A validated spec whose ``sources`` say, per field, what was measured or fitted (GPU, driver, date,
        loops) or from which shipped source it was carried.

    Raises:
        ValueError: If the measurements make an inconsistent spec (e.g. idle power above the power limit).
    """
    where = f"measured {run.gpu_name} (driver {run.driver_version}, {run.date}, megatron-energy calibrate)"
    sources = {key: f"carried from {shipped.name}.yaml: {text}" for key, text in shipped.sources.items()}
    values: dict[str, object] = {}

    def measured(field: str, value: object, how: str) -> None:
        values[field] = value
        sources[field] = f"{where}: {how}"

    clocks = tuple(sorted(run.supported_sm_clocks_mhz, reverse=True))
    measured("sm_clocks_mhz", clocks, f"{len(clocks)} supported SM clocks, {clocks[-1]}-{clocks[0]} MHz")
    measured("memory_clocks_mhz", tuple(sorted(run.supported_memory_clocks_mhz, reverse=True)), "NVML list")
    measured("default_sm_clock_mhz", clocks[0], "highest supported SM clock (stock boost)")
    measured("power_limit_w", round(run.power_limit_w, 1), "power-management limit in force")
    idle = run.idle
    measured("idle_power_w", round(idle.power_w, 1), _loop_text(idle))
    blocked_w = max(run.blocked.power_w, idle.power_w)
    clamp = "" if blocked_w == run.blocked.power_w else f"; below idle, so set to idle {idle.power_w:.1f} W"
    measured("blocked_power_w", round(blocked_w, 1), _loop_text(run.blocked) + clamp)
    if run.counter_period_s is not None:
        measured(
            "energy_counter_period_s",
            round(run.counter_period_s, 3),
            "median interval between total-energy counter updates",
        )
    loops = "; ".join(_loop_text(loop) for loop in run.loops)
    worst = fit.worst_capped_clock_error()
    measured(
        "voltage_min_v",
        round(fit.voltage_ratio * shipped.voltage_max_v, 4),
        f"fitted V_min/V_max {fit.voltage_ratio:.3f} ± {fit.voltage_ratio_error:.3f} (linear from the knee "
        f"{fit.knee_mhz:.0f} MHz, kept, to V_max) to the clocks the GPU chose at its power limit and the "
        f"duty-cycled powers of {len(fit.workloads)} compute workloads; worst capped-clock error {worst:.1%}",
    )
    measured(
        "dynamic_power_max_w",
        round(fit.dynamic_power_max_w, 1),
        f"fitted ± {fit.dynamic_power_error_w:.0f} W: the {fit.workloads[0].name} workload's dynamic power "
        f"at the top clock; loops: {loops}",
    )
    activities = fit.class_activities()
    measured(
        "class_activity",
        activities,
        "fitted: "
        + ", ".join(
            f"{w.kernel_class} {w.activity:.3f} ± {w.activity_error:.3f} ({w.name})"
            for w in fit.workloads
            if activities.get(w.kernel_class) == round(w.activity, 3)
        ),
    )
    if fit.memory:
        copy = fit.memory[0]
        note = "" if fit.memory_core_activity == copy.activity else f" (solved {copy.activity:.3f}, clamped)"
        measured(
            "memory_core_activity",
            round(fit.memory_core_activity, 3),
            f"the {copy.name} loop: P = P_idle + a P_dyn g(f) max(f, f_sat)/f + P_mem with the shipped P_mem "
            f"{shipped.memory_power_w:g} W{note}",
        )
    carried = {f.name: getattr(shipped, f.name) for f in dataclasses.fields(GpuSpec)}
    # a measured figure keeps no range of the shipped spec's: what it was unsure of is now measured or fitted
    dropped = [key for key in shipped.ranges if key.partition(".")[0] in values]
    for key in dropped:
        sources.pop(f"{SOURCE_PREFIX}{key}", None)
    ranges = {key: bounds for key, bounds in shipped.ranges.items() if key not in dropped}
    for key, (low, high, why) in _fitted_ranges(fit, shipped.voltage_max_v).items():
        ranges[key] = (low, high)
        sources[f"{SOURCE_PREFIX}{key}"] = f"{where}: {why}"
    carried.update(values, name=name, sources=sources, ranges=ranges)
    carried["display_name"] = f"{shipped.display_name} (calibrated {run.date})"
    return GpuSpec(**carried)


FIT_RANGE_SIGMAS = 2.0
"""A fitted figure's range: this many standard errors of the fit either side."""


def _fitted_ranges(fit: CurveFit, voltage_max_v: float) -> dict[str, tuple[float, float, str]]:
    """The fitted figures' ranges (two standard errors; the memory activity over its loops), with why."""
    k = FIT_RANGE_SIGMAS
    sigma = f"{k:g} standard errors of the fit"
    ratio_low = max(0.05, fit.voltage_ratio - k * fit.voltage_ratio_error)
    ratio_high = min(1.0, fit.voltage_ratio + k * fit.voltage_ratio_error)
    ranges = {
        "voltage_min_v": (round(ratio_low * voltage_max_v, 4), round(ratio_high * voltage_max_v, 4), sigma),
        "dynamic_power_max_w": (
            round(fit.dynamic_power_max_w - k * fit.dynamic_power_error_w, 1),
            round(fit.dynamic_power_max_w + k * fit.dynamic_power_error_w, 1),
            sigma,
        ),
    }
    activities = fit.class_activities()
    for w in fit.workloads:
        if activities.get(w.kernel_class) == round(w.activity, 3):
            low = max(0.01, w.activity - k * w.activity_error)
            ranges[f"class_activity.{w.kernel_class}"] = (
                round(low, 3),
                round(w.activity + k * w.activity_error, 3),
                sigma,
            )
    if len(fit.memory) > 1:
        solved = [min(max(m.activity, 0.0), 1.0) for m in fit.memory]
        names = ", ".join(f"{m.name} {m.activity:.3f}" for m in fit.memory)
        ranges["memory_core_activity"] = (
            round(min(solved), 3),
            round(max(solved), 3),
            f"the memory loops disagree: {names}",
        )
    return ranges


def _loop_text(loop: LoopMeasurement) -> str:
    """One loop's figures for a source entry."""
    rate = ""
    if loop.rate:
        unit = "GB/s" if loop.kernel_class == KernelClass.MEMORY else "TFLOP/s"
        rate = f", {loop.rate:.0f} {unit}"
    busy = f", busy {loop.busy_fraction:.0%}" if loop.is_duty else ""
    detail = f" ({loop.detail})" if loop.detail else ""
    return (
        f"{loop.name} loop{detail}: {loop.power_w:.1f} W over {loop.duration_s:.1f} s at median SM "
        f"{loop.median_sm_clock_mhz:.0f} MHz{busy}{rate}"
    )
