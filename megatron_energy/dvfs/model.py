"""Time and power of GPU work as a function of the SM clock (*modelled*, never measured).

A piece of work (e.g. the forward pass of one microbatch on one stage) is a :class:`WorkProfile`: its time
at the maximum clock ``f_max``, split into a clock-sensitive (compute-bound) part ``C``, a memory-bound part
``M`` and a fixed, clock-independent part ``F`` (launch gaps, tensor-parallel communication). The parts are
kernels that run one after another, so their times add (the per-kernel two-domain model of kernel-dvfs.md
section 8 takes the max instead; an instruction is hundreds of kernels, each mostly one or the other).

Time at an effective SM clock ``f`` and memory clock ``m`` (``f_sat`` = ``spec.memory_saturation_mhz``,
``m_max`` the top memory clock)::

    t(f, m) = F + C * f_max / f + M * max(1, f_sat / f, m_max / m)

Compute-bound time scales with the SM clock. Memory-bound time is flat down to ``f_sat``, below which the
issue rate and L2 (in the core clock domain) cannot keep HBM busy (Spaan et al., CF'26; the two-domain model
of kernel-dvfs.md section 8), and scales with the memory clock's bandwidth below ``m_max``.

Core voltage (Kernel Tuner / Schoonhoven et al., PMBS'22; the slope above the knee is what
``megatron-energy calibrate`` fits from the clocks the GPU chooses at its power limit)::

    V(f) = V_min                                                      for f <= f_knee
    V(f) = V_min + (V_max - V_min) * (f - f_knee) / (f_max - f_knee)  above

Energy and power with ``v(f) = V(f) / V_max``::

    E(f, m) = P_static(m) * t(f, m)                                   static, paid for all busy time
            + P_dyn * v(f)^2 * (A * C + a * M * max(f, f_sat) / f_max)   core switching: P_dyn * f/f_max * v^2
                                                                      times the activity of the kernels
            + P_mem * M                                               HBM traffic, fixed energy per byte
    P_static(m) = P_idle - P_mem_idle * (1 - m / m_max)
    P(f, m) = E(f, m) / t(f, m)

``P_idle`` = ``idle_power_w``, ``P_mem_idle`` = ``memory_idle_power_w`` (the memory clock's share of static
power), ``P_dyn`` = ``dynamic_power_max_w``, ``P_mem`` = ``memory_power_w``, ``a`` = ``memory_core_activity``
and ``A`` the activity of the work's compute kernels: the mean of ``spec.class_activity`` over the work's
:class:`~megatron_energy.dvfs.kernel_classes.ClassMix` (1 for the bf16 matrix product and for work without a
mix). ``P(f, m)`` rises with ``f``.

Power cap: when the power of the kernels, ``P_k(f) = (E(f) - P_static * F) / (t(f) - F)``, exceeds
``power_limit_w`` the GPU lowers its clock, as real GPUs do. The fixed part (communication, launch gaps) draws
static power only and does not let the kernels around it run faster: the power controller reacts within
milliseconds, not over a whole instruction. The effective clock is the highest clock ``f <= f_requested`` with
``P_k(f) <= power_limit_w`` (continuous: the average of the clocks the controller dithers between), and time
and energy are those at that clock, so ``P(f) <= P_k(f) <= power_limit_w``. A lower memory clock lowers
static power and so lets capped compute-bound work run at a higher SM clock (Spaan et al. measured
matrix products 2-3 % faster and 12-16 % cheaper at a lower memory clock).
Requested clocks outside the supported range are clamped to it, as the driver does for locked clocks; a memory
clock of ``None`` is the top one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from megatron_energy.dvfs.kernel_classes import REFERENCE_CLASS, ClassMix
from megatron_energy.dvfs.spec import GpuSpec

_CAP_CACHE_SIZE = 4096
_REFERENCE_MIX = ClassMix.single(REFERENCE_CLASS)


@dataclass(frozen=True)
class WorkProfile:
    """One computation, as times at the maximum SM clock (see the module docstring for the equations).

    Attributes:
        compute_s: Clock-sensitive (compute-bound) time at the maximum clock; scales as f_max / f.
        memory_s: Memory-bound time at the maximum clock; flat down to the saturation clock, then f_sat / f.
        fixed_s: Clock-independent time (launch gaps, communication).
        compute_mix: The kernel classes of the compute-bound time; ``None`` is all bf16 matrix products (the
            spec's reference class).
        activity_scale: This work's compute activity relative to its classes' (1: as the spec's classes
            draw). A fit from one clock sets it from the measured energy: a training step's kernels are
            smaller than the products a calibration measures its classes on, and draw less per clock.
    """

    compute_s: float
    memory_s: float
    fixed_s: float = 0.0
    compute_mix: ClassMix | None = None
    activity_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("compute_s", "memory_s", "fixed_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"WorkProfile.{name} must be finite and non-negative, got {value!r}")
        if not math.isfinite(self.activity_scale) or self.activity_scale <= 0:
            raise ValueError(f"WorkProfile.activity_scale must be positive, got {self.activity_scale!r}")

    @classmethod
    def from_parts(cls, parts: Iterable[float], compute_mix: ClassMix | None = None) -> WorkProfile:
        """The work of ``(compute_s, memory_s, fixed_s)`` given as any three numbers (e.g. a fit's vector)."""
        compute_s, memory_s, fixed_s = (float(value) for value in parts)
        return cls(compute_s, memory_s, fixed_s, compute_mix)

    def __add__(self, other: WorkProfile) -> WorkProfile:
        mix, scale = self.compute_mix, self.activity_scale
        if mix != other.compute_mix:
            mix = _mix_or_reference(mix).blend(
                self.compute_s, _mix_or_reference(other.compute_mix), other.compute_s
            )
        if scale != other.activity_scale:  # weighted by compute time, as the mixes
            weights = (
                (self.compute_s, other.compute_s) if self.compute_s + other.compute_s > 0 else (1.0, 1.0)
            )
            scale = (weights[0] * scale + weights[1] * other.activity_scale) / sum(weights)
        return WorkProfile(
            self.compute_s + other.compute_s,
            self.memory_s + other.memory_s,
            self.fixed_s + other.fixed_s,
            mix,
            scale,
        )

    def scaled(self, factor: float) -> WorkProfile:
        """Return this work repeated ``factor`` times (all parts scaled, the same class mix and activity)."""
        return dataclasses.replace(
            self,
            compute_s=self.compute_s * factor,
            memory_s=self.memory_s * factor,
            fixed_s=self.fixed_s * factor,
        )


def _mix_or_reference(mix: ClassMix | None) -> ClassMix:
    """``mix``, or the reference class alone for work without one."""
    return mix if mix is not None else _REFERENCE_MIX


class GpuPowerModel:
    """Time, power and energy of work on one GPU model at a requested SM clock (and memory clock)."""

    def __init__(self, spec: GpuSpec):
        """Create the model for ``spec``; every parameter comes from the spec."""
        self.spec = spec
        self._f_max = float(spec.max_sm_clock_mhz)
        self._f_min = float(spec.min_sm_clock_mhz)
        self._m_max = float(spec.max_memory_clock_mhz)
        self.saturation_clock_mhz = float(spec.memory_saturation_mhz or self._f_min)
        """f_sat: below this clock memory-bound work slows down."""
        self._cap_clocks: dict[tuple[WorkProfile, float | None], float] = {}

    def describe(self) -> str:
        """One line naming the spec and every model parameter, for reports of *modelled* figures."""
        spec = self.spec
        activities = "".join(f", A[{k}] {a:g}" for k, a in spec.class_activity.items())
        memory = f", P_mem_idle {spec.memory_idle_power_w:g} W" if spec.memory_idle_power_w else ""
        return (
            f"modelled ({spec.name}: f {spec.min_sm_clock_mhz}-{spec.max_sm_clock_mhz} MHz, "
            f"f_sat {self.saturation_clock_mhz:g} MHz, V {spec.voltage_min_v:g}-{spec.voltage_max_v:g} V "
            f"knee {spec.voltage_knee_mhz:g} MHz, P_idle {spec.idle_power_w:g} W, "
            f"P_dyn {spec.dynamic_power_max_w:g} W, P_mem {spec.memory_power_w:g} W{memory}, "
            f"memory core activity {spec.memory_core_activity:g}{activities}, "
            f"cap {spec.power_limit_w:g} W)"
        )

    def voltage_v(self, clock_mhz: float) -> float:
        """Core voltage at ``clock_mhz``: flat at V_min up to the knee, then linear to V_max at f_max."""
        spec = self.spec
        if clock_mhz <= spec.voltage_knee_mhz:
            return spec.voltage_min_v
        rise = (clock_mhz - spec.voltage_knee_mhz) / (self._f_max - spec.voltage_knee_mhz)
        return spec.voltage_min_v + (spec.voltage_max_v - spec.voltage_min_v) * rise

    def dynamic_scale(self, clock_mhz: float) -> float:
        """``(f / f_max) v(f)^2``: dynamic power at ``clock_mhz`` relative to the top clock, same kernels."""
        v_rel = self.voltage_v(clock_mhz) / self.spec.voltage_max_v
        return clock_mhz / self._f_max * v_rel**2

    def compute_activity(self, work: WorkProfile) -> float:
        """``A``: the mean activity of the kernel classes of ``work``'s compute-bound time."""
        if work.compute_mix is None:
            return work.activity_scale
        return work.compute_mix.activity(self.spec.class_activity) * work.activity_scale

    def static_power_w(self, memory_clock_mhz: float | None = None) -> float:
        """``P_static(m)``: busy power without switching; the idle power less the memory clock's saving."""
        if memory_clock_mhz is None:
            return self.spec.idle_power_w
        return self.spec.idle_power_w - self.spec.memory_idle_power_w * (1.0 - memory_clock_mhz / self._m_max)

    def uncapped_time_s(
        self, work: WorkProfile, clock_mhz: float, memory_clock_mhz: float | None = None
    ) -> float:
        """Time of ``work`` if it ran at exactly ``clock_mhz`` (no power cap)."""
        memory_slowdown = self.saturation_clock_mhz / clock_mhz
        if memory_clock_mhz is not None:
            memory_slowdown = max(memory_slowdown, self._m_max / memory_clock_mhz)
        return (
            work.fixed_s
            + work.compute_s * self._f_max / clock_mhz
            + work.memory_s * max(1.0, memory_slowdown)
        )

    def uncapped_energy_j(
        self, work: WorkProfile, clock_mhz: float, memory_clock_mhz: float | None = None
    ) -> float:
        """Energy of ``work`` if it ran at exactly ``clock_mhz`` (no power cap)."""
        spec = self.spec
        v_rel = self.voltage_v(clock_mhz) / spec.voltage_max_v
        core_work_s = self.compute_activity(
            work
        ) * work.compute_s + spec.memory_core_activity * work.memory_s * (
            max(clock_mhz, self.saturation_clock_mhz) / self._f_max
        )
        return (
            self.static_power_w(memory_clock_mhz) * self.uncapped_time_s(work, clock_mhz, memory_clock_mhz)
            + spec.dynamic_power_max_w * v_rel**2 * core_work_s
            + spec.memory_power_w * work.memory_s
        )

    def uncapped_power_w(
        self, work: WorkProfile, clock_mhz: float, memory_clock_mhz: float | None = None
    ) -> float:
        """Average busy power of ``work`` at exactly ``clock_mhz``, possibly above the power limit."""
        time_s = self.uncapped_time_s(work, clock_mhz, memory_clock_mhz)
        if time_s == 0.0:
            return self.static_power_w(memory_clock_mhz)
        return self.uncapped_energy_j(work, clock_mhz, memory_clock_mhz) / time_s

    def kernel_power_w(
        self, work: WorkProfile, clock_mhz: float, memory_clock_mhz: float | None = None
    ) -> float:
        """Power while the kernels of ``work`` run (its fixed part excluded) at exactly ``clock_mhz``."""
        static_w = self.static_power_w(memory_clock_mhz)
        kernel_s = self.uncapped_time_s(work, clock_mhz, memory_clock_mhz) - work.fixed_s
        if kernel_s <= 0.0:
            return static_w
        return (
            self.uncapped_energy_j(work, clock_mhz, memory_clock_mhz) - static_w * work.fixed_s
        ) / kernel_s

    def effective_clock_mhz(
        self, work: WorkProfile, requested_mhz: float, memory_clock_mhz: float | None = None
    ) -> float:
        """The clock ``work`` really runs at: the request clamped to range, lowered to fit the power cap."""
        if not math.isfinite(requested_mhz) or requested_mhz <= 0:
            raise ValueError(f"requested clock must be a positive number of MHz, got {requested_mhz!r}")
        clock = min(max(float(requested_mhz), self._f_min), self._f_max)
        return min(clock, self.power_cap_clock_mhz(work, memory_clock_mhz))

    def power_cap_clock_mhz(self, work: WorkProfile, memory_clock_mhz: float | None = None) -> float:
        """The highest clock at which the kernels of ``work`` fit the power limit (f_max if they always do).

        Kernel power rises with the clock, so this is the root of ``P_k(f) = power_limit_w``; every request
        above it runs at it. When even the minimum clock exceeds the limit, the minimum clock.
        """
        key = (work, memory_clock_mhz)
        cached = self._cap_clocks.get(key)
        if cached is None:
            limit = self.spec.power_limit_w
            if self.kernel_power_w(work, self._f_max, memory_clock_mhz) <= limit:
                cached = self._f_max
            elif self.kernel_power_w(work, self._f_min, memory_clock_mhz) >= limit:
                cached = self._f_min
            else:
                from scipy.optimize import brentq  # on first use: ~0.5 s that most processes never need

                cached = brentq(
                    lambda f: self.kernel_power_w(work, f, memory_clock_mhz) - limit, self._f_min, self._f_max
                )
            if len(self._cap_clocks) >= _CAP_CACHE_SIZE:
                self._cap_clocks.clear()
            self._cap_clocks[key] = cached
        return cached

    def time_s(self, work: WorkProfile, clock_mhz: float, memory_clock_mhz: float | None = None) -> float:
        """Time of ``work`` at requested clock ``clock_mhz``, including power-cap throttling."""
        effective = self.effective_clock_mhz(work, clock_mhz, memory_clock_mhz)
        return self.uncapped_time_s(work, effective, memory_clock_mhz)

    def power_w(self, work: WorkProfile, clock_mhz: float, memory_clock_mhz: float | None = None) -> float:
        """Average busy power of ``work`` at requested clock ``clock_mhz``; never above the power limit."""
        effective = self.effective_clock_mhz(work, clock_mhz, memory_clock_mhz)
        return min(self.uncapped_power_w(work, effective, memory_clock_mhz), self.spec.power_limit_w)

    def energy_j(self, work: WorkProfile, clock_mhz: float, memory_clock_mhz: float | None = None) -> float:
        """Energy of ``work`` at requested clock ``clock_mhz`` (busy power x time)."""
        return self.power_w(work, clock_mhz, memory_clock_mhz) * self.time_s(
            work, clock_mhz, memory_clock_mhz
        )


@dataclass(frozen=True)
class FitResult:
    """Outcome of :func:`fit_work_profile`.

    Attributes:
        work: The fitted (or prior-derived) work profile.
        source: ``"fitted"`` (least squares over several clocks) or ``"prior"`` (one clock only; the
            compute/memory split is the spec's ``prior_compute_fraction``).
        message: Human-readable account of how the profile was obtained and how well it matches.
        rms_time_error: Root-mean-square relative error of modelled vs measured time over the points.
        rms_energy_error: Root-mean-square relative error of modelled vs measured energy over the points.
    """

    work: WorkProfile
    source: Literal["fitted", "prior"]
    message: str
    rms_time_error: float
    rms_energy_error: float


FIT_CACHE_SIZE = 4096
"""Fits :func:`fit_work_profile` keeps (the oldest goes first): the planners, the memory lever and the saving
band fit the same instruction's options again for every plan of a job."""

_FITS: dict[tuple[str, tuple[tuple[float, ...], ...], str], FitResult] = {}


def fit_work_profile(
    spec: GpuSpec, points: Sequence[tuple[float, float, float]], compute_mix: ClassMix | None = None
) -> FitResult:
    """Fit a :class:`WorkProfile` to measured ``(clock_mhz, time_s, energy_j)`` points.

    A fit is kept (up to :data:`FIT_CACHE_SIZE`), so the same spec, points and mix give the same result,
    fitted once.

    With two or more distinct clocks, ``compute_s``, ``memory_s`` and ``fixed_s`` are fitted by bounded least
    squares on the relative errors of both time and energy (time alone cannot tell memory-bound from fixed
    time above the saturation clock; energy can). With one clock, the split comes from the spec's prior
    (``prior_compute_fraction`` compute-bound, the rest memory-bound), scaled to the measured time, and the
    work's compute activity (``activity_scale``) is set so that its modelled energy there is the measured one
    (the spec's ``workload_activity_scale`` where that is within 0.5 %, or where the work ran at its power
    limit and its energy cannot tell).

    Args:
        spec: The GPU the points were measured on.
        points: Measurements; clocks are the *requested* (locked) clocks.
        compute_mix: The kernel classes of the work's compute-bound time (a kernel timeline's, or the
            workload model's); the fit prices the work with it, and the fitted work keeps it.

    Returns:
        The fit, with ``source`` saying whether it was fitted or taken from the prior.

    Raises:
        ValueError: If there are no points or a point is not positive and finite.
    """
    if not points:
        raise ValueError("fit_work_profile needs at least one (clock_mhz, time_s, energy_j) point")
    key = (repr(spec), tuple(tuple(map(float, point)) for point in points), repr(compute_mix))
    fit = _FITS.get(key)
    if fit is None:
        fit = _fit_work_profile(spec, points, compute_mix)
        if len(_FITS) >= FIT_CACHE_SIZE:
            del _FITS[next(iter(_FITS))]
        _FITS[key] = fit
    return fit


def _fit_work_profile(
    spec: GpuSpec, points: Sequence[tuple[float, float, float]], compute_mix: ClassMix | None
) -> FitResult:
    """:func:`fit_work_profile`, fitted."""
    data = np.asarray(points, dtype=float)
    if data.ndim != 2 or data.shape[1] != 3:
        raise ValueError("each point must be a (clock_mhz, time_s, energy_j) triple")
    if not np.all(np.isfinite(data)) or np.any(data <= 0):
        raise ValueError("every clock, time and energy must be positive and finite")
    model = GpuPowerModel(spec)
    clocks = np.unique(data[:, 0])
    if len(clocks) == 1:
        clock, time_s, energy_j = float(clocks[0]), float(np.mean(data[:, 1])), float(np.mean(data[:, 2]))
        scale = _activity_scale(model, clock, time_s, energy_j, compute_mix)
        work = _prior_work(model, clock, time_s, compute_mix, scale)
        source: Literal["fitted", "prior"] = "prior"
        how = (
            f"only one clock ({clocks[0]:.0f} MHz) measured: compute/memory split taken from the {spec.name} "
            f"prior ({spec.prior_compute_fraction:.0%} compute-bound), scaled to the measured time, its "
            f"compute activity {scale:.3g} x its classes' to the measured energy"
        )
    else:
        work = _least_squares_work(model, data, compute_mix)
        source = "fitted"
        how = f"fitted to {len(data)} points at {len(clocks)} clocks"
    time_error, energy_error = _rms_errors(model, work, data)
    message = f"{how}; RMS relative error: time {time_error:.1%}, energy {energy_error:.1%} (modelled)"
    return FitResult(work, source, message, time_error, energy_error)


def _prior_work(
    model: GpuPowerModel,
    clock_mhz: float,
    time_s: float,
    compute_mix: ClassMix | None,
    activity_scale: float = 1.0,
) -> WorkProfile:
    """The prior compute/memory split, scaled so that its modelled time at ``clock_mhz`` is ``time_s``."""
    fraction = model.spec.prior_compute_fraction
    unit = WorkProfile(fraction, 1.0 - fraction, 0.0, compute_mix, activity_scale)
    # Power is intensive, so scaling all parts scales the (possibly capped) time by the same factor.
    return unit.scaled(time_s / model.time_s(unit, clock_mhz))


ACTIVITY_SCALE_RANGE = (0.05, 5.0)
"""The activity scales a one-clock fit may give a work (its classes' activity times 1/20 to 5)."""

ACTIVITY_SCALE_TOLERANCE = 0.005
"""A one-clock fit keeps the spec's workload activity where that prices the measured energy within 0.5 %."""


def _activity_scale(
    model: GpuPowerModel, clock_mhz: float, time_s: float, energy_j: float, compute_mix: ClassMix | None
) -> float:
    """The compute activity scale at which the prior split, scaled to ``time_s``, draws ``energy_j``.

    Energy rises with the scale until the power cap holds it at the limit, so the root is bracketed and found
    by Brent's method. The spec's ``workload_activity_scale`` (what a training step's kernels draw of their
    classes', 1 where not measured) is kept where it prices the energy within the tolerance, and where no
    scale reaches the measured energy: a work measured at (or, averaged over a shorter window than the GPU's,
    just above) its power limit tells nothing of its activity. Below the lowest scale's energy, the lowest.
    """

    def error(scale: float) -> float:
        work = _prior_work(model, clock_mhz, time_s, compute_mix, scale)
        return model.energy_j(work, clock_mhz) / energy_j - 1.0

    prior = model.spec.workload_activity_scale
    if abs(error(prior)) <= ACTIVITY_SCALE_TOLERANCE:
        return prior
    low, high = ACTIVITY_SCALE_RANGE
    if error(low) >= 0:
        return low
    if error(high) <= ACTIVITY_SCALE_TOLERANCE:
        return prior
    from scipy.optimize import brentq  # on first use, as in power_cap_clock_mhz

    return float(brentq(error, low, high, xtol=1e-4))


def _least_squares_work(model: GpuPowerModel, data: np.ndarray, compute_mix: ClassMix | None) -> WorkProfile:
    """Bounded least squares on relative time and energy errors, started from an NNLS fit of the times."""
    from scipy.optimize import least_squares, nnls  # on first use, as in effective_clock_mhz

    clocks, times, energies = data[:, 0], data[:, 1], data[:, 2]
    f_max, f_sat = float(model.spec.max_sm_clock_mhz), model.saturation_clock_mhz
    design = np.column_stack([f_max / clocks, np.maximum(1.0, f_sat / clocks), np.ones_like(clocks)])
    start, _ = nnls(design / times[:, None], np.ones_like(times))
    scale = float(np.max(times))

    def residuals(x: np.ndarray) -> np.ndarray:
        work = WorkProfile.from_parts(scale * x, compute_mix)
        modelled_t = np.array([model.time_s(work, c) for c in clocks])
        modelled_e = np.array([model.energy_j(work, c) for c in clocks])
        return np.concatenate([modelled_t / times - 1.0, modelled_e / energies - 1.0])

    best = None
    for initial in (start / scale, np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.8, 0.1])):
        guess = np.clip(initial, 1e-9, None)
        result = least_squares(residuals, guess, bounds=(0.0, np.inf), x_scale=1.0)
        if best is None or result.cost < best.cost:
            best = result
    assert best is not None  # the loop above runs three times
    return WorkProfile.from_parts(scale * best.x, compute_mix)


def _rms_errors(model: GpuPowerModel, work: WorkProfile, data: np.ndarray) -> tuple[float, float]:
    """Root-mean-square relative errors of modelled time and energy over the measured points."""
    time_errors = [model.time_s(work, c) / t - 1.0 for c, t, _ in data]
    energy_errors = [model.energy_j(work, c) / e - 1.0 for c, _, e in data]
    return float(np.sqrt(np.mean(np.square(time_errors)))), float(np.sqrt(np.mean(np.square(energy_errors))))
