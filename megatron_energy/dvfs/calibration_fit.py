"""The voltage curve and the kernel classes' activities, fitted from what the GPU does by itself.

Nothing is set on the GPU: each compute workload of a calibration run (``dvfs.calibration_loops``) gives two
equations of the model (:mod:`megatron_energy.dvfs.model`, ``g(f) = (f / f_max) v(f)^2``):

* back to back, at the clock ``f_w`` the GPU chose (below the top one where it held the power cap)::

      P_w = P_idle + A_w P_dyn g(f_w)

* duty-cycled (bursts a share ``d_w`` of the time, below the power limit), at the clock ``f'_w`` of its
  bursts::

      P'_w = P_idle + d_w A_w P_dyn g(f'_w)

  ``f'_w`` is the clock the bursts' throughput says they ran at (``f_w`` times the throughput ratio: the
  products are compute-bound), not NVML's clock reading: on an H100 the reading says the top clock inside
  10 ms bursts while a faster power limit (~925 W) holds the kernels some 20 % lower.

``P_idle`` is the idle loop's power, ``A`` of the reference workload (the first bf16 matrix product) is 1
and ``v(f)`` runs linearly from ``V_min / V_max`` at the knee (kept from the shipped spec: no class caps low
enough to see it) to 1 at ``f_max``. Least squares over the relative power errors fits ``V_min / V_max``,
``P_dyn`` and every other workload's ``A``. With n workloads that is 2n equations for n + 1 unknowns: the
classes' cap clocks are then *predicted* (the clock at which ``P_idle + A_w P_dyn g(f)`` meets the power
limit) and compared with the clocks the GPU chose. The memory-bound workloads' core activity follows from
their power at the clock they ran at, with the shipped spec's memory power.

Pure Python + numpy/scipy: no torch or NVML.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from megatron_energy.dvfs.calibration import DUTY_SUFFIX, CalibrationRun, LoopMeasurement
from megatron_energy.dvfs.kernel_classes import REFERENCE_CLASS, ClassMix, KernelClass
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import GpuSpec

SPEC_MEMORY_WORKLOAD = "copy"
"""The memory-bound workload whose core activity the spec takes (the others are checked against it)."""

CAPPED_SHARE = 0.5
"""A back-to-back loop held the power cap when at least this share of its samples said so."""

MEASURED_AT_TOP = 0.99
"""A back-to-back loop whose clock is within 1 % of the top one ran uncapped."""


@dataclass(frozen=True)
class WorkloadFit:
    """One compute workload's fitted activity and its cap clock, predicted against measured.

    Attributes:
        name: The workload (e.g. ``"gemm_fp8_8192"``).
        kernel_class: Its kernel class.
        activity: Its fitted activity ``A`` (1 for the reference workload).
        activity_error: One standard error of ``activity`` from the fit (0 for the reference).
        measured_clock_mhz: The clock the GPU chose back to back (median of the samples).
        burst_clock_mhz: The clock its duty-cycled bursts ran at, from their throughput.
        burst_power_w: The power of those bursts (the duty-cycled power over the busy share, idle gaps out).
        predicted_clock_mhz: The clock the fitted model predicts for it back to back at the power limit.
        capped: Whether the GPU held the power cap in that loop (clock-event reasons, or the clock below top).
        power_error: Relative error of the modelled power, back to back.
        duty_power_error: Relative error of the modelled power of its duty-cycled run (None without one).
    """

    name: str
    kernel_class: KernelClass
    activity: float
    activity_error: float
    measured_clock_mhz: float
    burst_clock_mhz: float
    burst_power_w: float
    predicted_clock_mhz: float
    capped: bool
    power_error: float
    duty_power_error: float | None

    @property
    def clock_error(self) -> float:
        """Predicted over measured clock, minus 1."""
        return self.predicted_clock_mhz / self.measured_clock_mhz - 1.0


@dataclass(frozen=True)
class MemoryFit:
    """One memory-bound workload's core activity and the power the spec's activity predicts for it.

    Attributes:
        name: The workload (``"copy"``, ``"elementwise"``).
        activity: The core activity that reproduces its power exactly.
        power_error: Relative error of the modelled power with the spec's activity (the first workload's).
    """

    name: str
    activity: float
    power_error: float


@dataclass(frozen=True)
class CurveFit:
    """The fitted voltage curve, dynamic power and activities, with every workload's residual.

    Attributes:
        voltage_ratio: ``V_min / V_max`` (the curve is linear from the knee to the top clock).
        voltage_ratio_error: One standard error of ``voltage_ratio``.
        knee_mhz: The knee, kept from the shipped spec.
        dynamic_power_max_w: ``P_dyn``: the reference workload's dynamic power at the top clock.
        dynamic_power_error_w: One standard error of ``dynamic_power_max_w``.
        workloads: Every compute workload, in the run's order.
        memory: Every memory-bound workload (empty if none ran).
        idle_power_w: The idle power the equations use.
        power_limit_w: The power limit the predictions use.
    """

    voltage_ratio: float
    voltage_ratio_error: float
    knee_mhz: float
    dynamic_power_max_w: float
    dynamic_power_error_w: float
    workloads: tuple[WorkloadFit, ...]
    memory: tuple[MemoryFit, ...]
    idle_power_w: float
    power_limit_w: float

    @property
    def memory_core_activity(self) -> float:
        """The memory-bound activity the spec takes: the copy loop's (else the first), in [0, 1]."""
        return min(max(self.memory[0].activity, 0.0), 1.0) if self.memory else math.nan

    def class_activities(self) -> dict[KernelClass, float]:
        """Each class's activity from its first workload (the large products), less the reference class."""
        activities: dict[KernelClass, float] = {}
        for workload in self.workloads:
            if workload.kernel_class != REFERENCE_CLASS:
                activities.setdefault(workload.kernel_class, round(workload.activity, 3))
        return activities

    def worst_capped_clock_error(self) -> float:
        """The largest absolute clock error among the workloads that held the cap (0 if none did)."""
        return max((abs(w.clock_error) for w in self.workloads if w.capped), default=0.0)


class _Curve:
    """``g(f) = (f / f_max) v(f)^2`` for a linear ``v`` from ``ratio`` at the knee to 1 at ``f_max``."""

    def __init__(self, f_max: float, knee: float, ratio: float) -> None:
        self.f_max, self.knee, self.ratio = f_max, knee, ratio

    def g(self, clock_mhz: float) -> float:
        rise = max(0.0, (clock_mhz - self.knee) / (self.f_max - self.knee))
        v = self.ratio + (1.0 - self.ratio) * min(rise, 1.0)
        return clock_mhz / self.f_max * v * v

    def cap_clock(self, dynamic_w: float, headroom_w: float, f_min: float) -> float:
        """The clock at which ``dynamic_w g(f)`` meets ``headroom_w`` (``f_max`` if it never does)."""
        if dynamic_w * self.g(self.f_max) <= headroom_w:
            return self.f_max
        low, high = f_min, self.f_max
        for _ in range(60):  # bisection: g rises with f
            middle = (low + high) / 2
            low, high = (middle, high) if dynamic_w * self.g(middle) <= headroom_w else (low, middle)
        return (low + high) / 2


def fit_curve(
    run: CalibrationRun, knee_mhz: float, memory_power_w: float, memory_saturation_mhz: float
) -> CurveFit:
    """Fit the voltage curve, ``P_dyn`` and the activities to a calibration run (see the module docstring).

    Args:
        run: The measurements; its first bf16 matrix-product loop is the reference.
        knee_mhz: The voltage curve's knee (the shipped spec's).
        memory_power_w: The shipped spec's memory power (memory-bound workloads' HBM term).
        memory_saturation_mhz: The shipped spec's memory saturation clock.

    Returns:
        The fit with every workload's residuals.

    Raises:
        ValueError: If the run has no reference workload, or a workload lacks its duty-cycled run.
    """
    from scipy.optimize import least_squares  # on first use, as in the model

    compute = [loop for loop in run.loops if _is_compute(loop) and not loop.is_duty]
    if not compute or compute[0].kernel_class != REFERENCE_CLASS:
        raise ValueError(f"the run's first compute workload must be a {REFERENCE_CLASS} matrix product")
    duties = [run.loop(loop.name + DUTY_SUFFIX) for loop in compute]
    missing = [loop.name for loop, duty in zip(compute, duties, strict=True) if duty is None]
    if missing:
        raise ValueError(f"workloads without a duty-cycled run: {missing}")
    f_max = float(max(run.supported_sm_clocks_mhz))
    idle_w = run.idle.power_w
    bursts = [effective_burst_clock(loop, duty, f_max) for loop, duty in zip(compute, duties, strict=True)]

    def residuals(x: np.ndarray) -> np.ndarray:
        curve = _Curve(f_max, knee_mhz, x[0])
        dynamic = x[1] * np.concatenate([[1.0], x[2:]])
        errors = []
        for loop, duty, burst_mhz, p_dyn in zip(compute, duties, bursts, dynamic, strict=True):
            assert duty is not None
            errors.append((idle_w + p_dyn * curve.g(loop.median_sm_clock_mhz)) / loop.power_w - 1.0)
            modelled = idle_w + duty.busy_fraction * p_dyn * curve.g(burst_mhz)
            errors.append(modelled / duty.power_w - 1.0)
        return np.array(errors)

    start = np.concatenate([[0.7, 900.0], np.ones(len(compute) - 1)])
    lower = np.concatenate([[0.3, 1.0], np.full(len(compute) - 1, 0.05)])
    upper = np.concatenate([[1.0, 5000.0], np.full(len(compute) - 1, 5.0)])
    result = least_squares(residuals, start, bounds=(lower, upper), x_scale="jac")
    errors = _standard_errors(result.jac, result.fun, len(start))
    curve = _Curve(f_max, knee_mhz, float(result.x[0]))
    p_dyn = float(result.x[1])
    activities = np.concatenate([[1.0], result.x[2:]])
    activity_errors = np.concatenate([[0.0], errors[2:]])
    headroom = run.power_limit_w - idle_w
    f_min = float(min(run.supported_sm_clocks_mhz))
    workloads = tuple(
        WorkloadFit(
            name=loop.name,
            kernel_class=KernelClass(loop.kernel_class or REFERENCE_CLASS),
            activity=float(activity),
            activity_error=float(error),
            measured_clock_mhz=loop.median_sm_clock_mhz,
            burst_clock_mhz=bursts[i],
            burst_power_w=_burst_power(duty, idle_w),
            predicted_clock_mhz=curve.cap_clock(activity * p_dyn, headroom, f_min),
            capped=_held_the_cap(loop, f_max),
            power_error=float(result.fun[2 * i]),
            duty_power_error=float(result.fun[2 * i + 1]),
        )
        for i, (loop, duty, activity, error) in enumerate(
            zip(compute, duties, activities, activity_errors, strict=True)
        )
        if duty is not None
    )
    memory = _memory_fits(run, curve, p_dyn, memory_power_w, memory_saturation_mhz)
    return CurveFit(
        voltage_ratio=curve.ratio,
        voltage_ratio_error=float(errors[0]),
        knee_mhz=knee_mhz,
        dynamic_power_max_w=p_dyn,
        dynamic_power_error_w=float(errors[1]),
        workloads=workloads,
        memory=memory,
        idle_power_w=idle_w,
        power_limit_w=run.power_limit_w,
    )


def _is_compute(loop: LoopMeasurement) -> bool:
    return loop.kernel_class is not None and KernelClass(loop.kernel_class).is_compute


def effective_burst_clock(full: LoopMeasurement, duty: LoopMeasurement | None, f_max: float) -> float:
    """The clock a duty-cycled run's bursts ran at: the back-to-back clock times the throughput ratio.

    Compute-bound kernels' throughput is proportional to the clock they really run at. Without rates, NVML's
    clock inside the bursts (or the run's median), which a fast power limit can hide.
    """
    if duty is None:
        return full.median_sm_clock_mhz
    if full.rate > 0 and duty.rate > 0:
        return min(f_max, full.median_sm_clock_mhz * duty.rate / full.rate)
    return duty.burst_clock_mhz if duty.burst_clock_mhz is not None else duty.median_sm_clock_mhz


def _burst_power(duty: LoopMeasurement | None, idle_w: float) -> float:
    """Power inside a duty-cycled run's bursts, its idle gaps taken out."""
    if duty is None or duty.busy_fraction <= 0:
        return math.nan
    return (duty.power_w - idle_w * (1.0 - duty.busy_fraction)) / duty.busy_fraction


def _held_the_cap(loop: LoopMeasurement, f_max: float) -> bool:
    """Whether a back-to-back loop ran at the power cap."""
    return loop.power_cap_share >= CAPPED_SHARE or loop.median_sm_clock_mhz < MEASURED_AT_TOP * f_max


def _standard_errors(jacobian: np.ndarray, residuals: np.ndarray, parameters: int) -> np.ndarray:
    """One standard error per parameter from the Jacobian at the optimum (zeros where it is singular)."""
    dof = max(1, len(residuals) - parameters)
    variance = float(residuals @ residuals) / dof
    try:
        covariance = np.linalg.inv(jacobian.T @ jacobian) * variance
    except np.linalg.LinAlgError:
        return np.zeros(parameters)
    return np.sqrt(np.clip(np.diag(covariance), 0.0, None))


def _memory_fits(
    run: CalibrationRun, curve: _Curve, p_dyn: float, memory_power_w: float, saturation_mhz: float
) -> tuple[MemoryFit, ...]:
    """Each memory-bound workload's core activity; errors against the first one's (the spec's) activity."""
    loops = [loop for loop in run.loops if loop.kernel_class == KernelClass.MEMORY and not loop.is_duty]
    loops.sort(key=lambda loop: loop.name != SPEC_MEMORY_WORKLOAD)

    def core_w(loop: LoopMeasurement) -> float:
        clock = loop.median_sm_clock_mhz
        return p_dyn * curve.g(clock) * max(clock, saturation_mhz) / clock

    solved = [(loop, (loop.power_w - run.idle.power_w - memory_power_w) / core_w(loop)) for loop in loops]
    if not solved:
        return ()
    spec_activity = min(max(solved[0][1], 0.0), 1.0)
    return tuple(
        MemoryFit(
            loop.name,
            activity,
            (run.idle.power_w + memory_power_w + spec_activity * core_w(loop)) / loop.power_w - 1.0,
        )
        for loop, activity in solved
    )


def spec_check_lines(spec: GpuSpec, fit: CurveFit) -> list[str]:
    """How a spec's model (e.g. the shipped one) predicts the cap clocks this run measured, per workload.

    Each workload is priced as work of its class alone (``ClassMix.single``), so a workload whose size draws
    less than its class's reference (e.g. a 2048³ product) shows the spread a class hides.

    Returns:
        A header and one line per compute workload: measured clock, the spec's predicted clock, the error.
    """
    model = GpuPowerModel(spec)
    lines = [f"{spec.name}'s model against this run's cap clocks (measured clock, modelled prediction):"]
    for w in fit.workloads:
        predicted = model.power_cap_clock_mhz(
            WorkProfile(1.0, 0.0, compute_mix=ClassMix.single(w.kernel_class))
        )
        lines.append(
            f"  {w.name:18s} {w.kernel_class:12s} measured {w.measured_clock_mhz:5.0f} MHz  "
            f"{spec.name} predicts {predicted:5.0f} MHz  ({predicted / w.measured_clock_mhz - 1:+.1%})"
        )
    return lines


def residual_lines(fit: CurveFit) -> list[str]:
    """The fit's table: per workload its activity, cap clock measured and predicted, and power errors.

    Returns:
        A header, one line per workload and a closing line on the curve; measured and modelled figures are
        labelled as such.
    """
    lines = [
        f"{'workload':18s} {'class':12s} {'activity':>14s}  {'bursts':>15s}  {'clock measured':>14s}  "
        f"{'predicted':>9s}  {'error':>7s}  {'P err':>6s}  {'duty P err':>10s}"
    ]
    for w in fit.workloads:
        duty = "-" if w.duty_power_error is None else f"{w.duty_power_error:+.1%}"
        state = "cap" if w.capped else "top"
        lines.append(
            f"{w.name:18s} {w.kernel_class:12s} {w.activity:7.3f} ±{w.activity_error:5.3f}  "
            f"{w.burst_power_w:4.0f} W {w.burst_clock_mhz:4.0f} MHz  "
            f"{w.measured_clock_mhz:7.0f} MHz {state}  {w.predicted_clock_mhz:5.0f} MHz  "
            f"{w.clock_error:+7.1%}  {w.power_error:+6.1%}  {duty:>10s}"
        )
    for m in fit.memory:
        lines.append(
            f"{m.name:18s} {'memory':12s} {m.activity:7.3f}          power with the spec's activity "
            f"{m.power_error:+.1%}"
        )
    lines.append(
        f"fitted: V_min/V_max {fit.voltage_ratio:.3f} ±{fit.voltage_ratio_error:.3f} "
        f"(knee {fit.knee_mhz:.0f} MHz kept), P_dyn {fit.dynamic_power_max_w:.0f} "
        f"±{fit.dynamic_power_error_w:.0f} W, P_idle {fit.idle_power_w:.1f} W, "
        f"limit {fit.power_limit_w:.0f} W; "
        "clocks measured, predictions modelled; "
        f"worst capped-clock error {fit.worst_capped_clock_error():.1%}"
    )
    return lines
