"""The CPU side of the single-GPU contention check (``lab/gpu_contention.py``): model, fits and errors.

The check runs *groups* on one GPU: ``gemms`` bf16 GEMMs back to back on the main stream and, in an overlap
configuration, one CTA-limited copy kernel of ``copy_bytes`` (read + written) on a side stream, launched once
the first ``launch_after`` GEMMs of the group are done; the group ends when both have finished. Groups repeat
back to back for seconds. The overlap windows are *predicted* by the overlap simulator the planner uses
(``sim.overlap.OverlapSimulator`` on a one-stage DAG whose instructions are the GEMMs, the copy a collective
launch at the GEMM it follows) and compared with what was measured. What the model takes, and from where
(*calibration*: the rows it is fitted to are marked and left out of the verdict):

* **The power cap holds the mean over the group, not every instant.** A group lasts 15-60 ms, less than the
  power controller averages over: the GEMMs of a group run at one clock, the highest at which the group's
  mean power stays at the level the controller holds alone (the GEMMs-alone window's power), and at most the
  clock they reach in a burst. Measured (kernel timelines): a GEMM that ran alone at the start of a timed
  group took 1.38 ms against 1.66 ms in the GEMMs-alone window, and kept that pace for over 10 ms; beside a
  32-CTA copy whose tail pulls the mean to 631 W the median SM clock was 1875 MHz, where the GEMMs alone hold
  1470 MHz at 690 W. Pricing every instant at the cap would need the copy alone after the GEMMs to draw
  0.65 W per GB/s it moves, 6.6 times what the copy draws alone (0.098 W per GB/s).
* The GEMM's time and power at any clock: the spec's model, scaled to the GEMMs-alone window (calibration).
  Above the window's (capped) clock the power above idle rises as ``(f / f_cap)^k``, ``k`` fitted to the
  calibration configuration's energy (:func:`fit_power_exponent`), not by the spec's assumed voltage curve
  (local exponent ~2.2 there), which put the burst's power ~60-80 W too high: on the H200 runs ``k`` is 1.67
  and 1.61 (a GEMM phase of ~880-900 W at the burst, 1807-1826 MHz modelled), and cannot be told where the
  calibration group's GEMMs stay at the cap clock (the spec's curve is then kept). The level the group's mean
  is held at is the GEMMs-alone window's measured power (690 W), not the spec's 700 W limit: held at 700 W
  the capped groups come out at 700 W where 690-692 W were measured.
* The burst: the time of a GEMM alone before the copy launches in the calibration configuration's kernel
  timeline (:func:`burst_from_timeline`), as a clock through the spec's time model.
* Beside the copy the GEMMs progress at ``(1 - h/S) / gamma`` of their rate (``h`` the SMs it holds),
  ``gamma`` from the same timeline: GEMMs beside the copy against those before it (L2 and HBM shared).
* The copy alone: its bandwidth law ``(B^-p + (c x beta)^-p)^(-1/p)`` (:func:`fit_copy_law`) and its dynamic
  power ``d0 + d1 x rate`` (:func:`fit_copy_power`), both fitted to the copy-alone windows (calibration).
* Launched beside the GEMMs, which fill every SM, the copy's CTAs are packed ``ctas_per_sm`` to an SM (its
  occupancy; :mod:`megatron_energy.sim.contention`) on ``h = ceil(c / ctas_per_sm)`` SMs for its whole life.
  Beside the GEMMs each drives ``s_b`` (:func:`beside_rate_gbps`: bytes over span and SMs of a timed group
  whose copy ended before the GEMMs; a run whose calibration copy outlasts them takes it from one whose did),
  alone ``s`` (:func:`fit_sm_bandwidth`: the ``s`` at which the simulator gives the calibration window's
  time: the overlap configuration with the fewest CTAs). Alone its dynamic power is its power law at its
  packed rate; beside the GEMMs only its modelled marginal power counts (its SMs' core activity and its HBM
  traffic: :mod:`megatron_energy.sim.contention`, Power).

Copy-alone and GEMMs-alone rows are calibration; every overlap configuration but the one with the fewest CTAs
is a prediction. Each row's :class:`Prediction` gives the simulator's events (each GEMM's end, the copy's
span) to set beside the measured kernel timelines.

Pure Python + numpy + scipy: no torch, no NVML; tested on CPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, least_squares

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.sim.contention import CommLoad, saturated_rate_gbps
from megatron_energy.sim.overlap import OverlapSimulator
from megatron_energy.sim.overlap_result import OverlapResult
from megatron_energy.sim.overlap_schedule import CommLaunch, OverlapSchedule

UNCAPPED_W = 1e6
"""Power limit of the spec the simulator prices a group with: the cap binds on the group's mean instead."""

Timeline = Mapping[str, object]
"""One timed group (``lab/gpu_contention.py``): ``gemm_end_ms`` (a list), ``copy_start_ms`` and
``copy_end_ms``, in ms from the group's start."""


@dataclass(frozen=True)
class CheckSetup:
    """One group of the check.

    Attributes:
        gemms: GEMMs per group (even: they are the forward and backward instructions of a one-stage DAG).
        launch_after: GEMMs of the group done before the copy launches (the chosen launch point).
        copy_bytes: Bytes the copy reads plus writes per group.
        ctas_per_sm: Copy CTAs one SM takes when packed (the copy kernel's occupancy).
    """

    gemms: int
    launch_after: int
    copy_bytes: float
    ctas_per_sm: int = 1

    def __post_init__(self) -> None:
        if self.gemms < 2 or self.gemms % 2 or not 0 <= self.launch_after < self.gemms:
            raise ValueError(f"need an even number of GEMMs >= 2 and 0 <= launch_after < gemms: {self}")
        if not self.copy_bytes > 0 or self.ctas_per_sm < 1:
            raise ValueError(f"copy_bytes and ctas_per_sm must be positive: {self}")

    def held_sms(self, ctas: int) -> int:
        """SMs a copy of ``ctas`` CTAs holds when packed beside the GEMMs."""
        return -(-ctas // self.ctas_per_sm)

    def launch_s(self, gemm: Window) -> float:
        """When the copy launches in a group: after ``launch_after`` of the GEMMs (alone) are done."""
        return gemm.time_s * self.launch_after / self.gemms


@dataclass(frozen=True)
class Window:
    """One measured window (*measured*: CUDA events and the energy counter).

    Attributes:
        config: ``"gemm"``, ``"copy"`` or ``"overlap"``.
        ctas: The copy's CTAs (``None`` for ``"gemm"``).
        time_s: Time per group (CUDA events over the window / groups).
        power_w: Mean power over the window (slope of the total-energy counter).
        clock_mhz: Median SM clock NVML read over the window (``None`` where not read).
    """

    config: str
    ctas: int | None
    time_s: float
    power_w: float
    clock_mhz: float | None = None

    @property
    def energy_j(self) -> float:
        """Energy per group."""
        return self.power_w * self.time_s

    @property
    def key(self) -> str:
        """``gemm``, ``copy:32``, ``overlap:32``."""
        return self.config if self.ctas is None else f"{self.config}:{self.ctas}"


@dataclass(frozen=True)
class CopyLaw:
    """The copy's bandwidth alone, ``(B^-p + (c x beta)^-p)^(-1/p)`` GB/s (bytes read + written)."""

    link_gbps: float
    """Saturated bandwidth ``B``."""
    per_cta_gbps: float
    """Bandwidth one CTA drives, ``beta``."""
    knee: float
    """Sharpness ``p`` of the knee between the two."""

    def rate_gbps(self, ctas: int) -> float:
        """Bandwidth of ``ctas`` CTAs spread one to an SM."""
        return saturated_rate_gbps(self.link_gbps, ctas * self.per_cta_gbps, self.knee)


@dataclass(frozen=True)
class CopyPower:
    """The copy's dynamic power alone (above blocked power) against its rate: ``d0 + d1 x rate``."""

    base_w: float
    """``d0``, W."""
    per_gbps_w: float
    """``d1``, W per GB/s."""

    def dynamic_w(self, rate_gbps: float) -> float:
        """Dynamic power at ``rate_gbps``."""
        return self.base_w + self.per_gbps_w * rate_gbps


@dataclass(frozen=True)
class Burst:
    """The GEMMs unthrottled, from the calibration configuration's kernel timeline (*measured*)."""

    gemm_s: float
    """A GEMM alone before the copy launches."""
    slowdown: float
    """``gamma``: GEMMs beside the copy over GEMMs before it, less their SM share (at least 1)."""


@dataclass(frozen=True)
class Calibration:
    """Everything the model takes from the calibration rows (module docstring)."""

    law: CopyLaw
    power: CopyPower
    burst: Burst
    sm_beside_gbps: float
    """The packed copy's bandwidth per SM held beside the GEMMs."""
    sm_alone_gbps: float | None = None
    """The same alone (None where no copy of the run outlasts its GEMMs, so none depends on it)."""
    power_exponent: float | None = None
    """``k``: above the GEMMs-alone clock their power above idle rises as ``(f / f_cap)^k`` (None: by the
    spec's voltage curve, where the calibration group's energy does not tell it)."""


def fit_copy_law(copy_bytes: float, windows: Sequence[Window]) -> CopyLaw:
    """Fit the copy's law to copy-alone windows: least squares on log rates over ``B``, ``beta`` and ``p``.

    Raises:
        ValueError: With copy-alone windows at fewer than three CTA counts.
    """
    rates: dict[int, list[float]] = {}
    for w in windows:
        if w.config == "copy" and w.ctas:
            rates.setdefault(w.ctas, []).append(copy_bytes / w.time_s / 1e9)
    if len(rates) < 3:
        raise ValueError("fit_copy_law needs copy-alone windows at three CTA counts or more")
    ctas = np.array(sorted(rates), dtype=float)
    measured = np.log([statistics.fmean(rates[int(c)]) for c in ctas])

    def residuals(x: np.ndarray) -> np.ndarray:
        link, per_cta, knee = np.exp(x)
        return np.log([saturated_rate_gbps(link, c * per_cta, knee) for c in ctas]) - measured

    start = np.log([np.exp(measured.max()), np.exp(measured[0]) / ctas[0], 2.0])
    link, per_cta, knee = np.exp(least_squares(residuals, start).x)
    return CopyLaw(float(link), float(per_cta), float(knee))


def fit_copy_power(spec: GpuSpec, copy_bytes: float, windows: Sequence[Window]) -> CopyPower:
    """Fit ``d0 + d1 x rate`` to the copy-alone windows' power above blocked power (least squares).

    Raises:
        ValueError: With copy-alone windows at fewer than two CTA counts.
    """
    copies = [w for w in windows if w.config == "copy"]
    if len({w.ctas for w in copies}) < 2:
        raise ValueError("fit_copy_power needs copy-alone windows at two CTA counts or more")
    rates = [copy_bytes / w.time_s / 1e9 for w in copies]
    slope, base = np.polyfit(rates, [w.power_w - spec.blocked_power_w for w in copies], 1)
    return CopyPower(float(base), float(slope))


def burst_from_timeline(spec: GpuSpec, setup: CheckSetup, ctas: int, timeline: Timeline) -> Burst:
    """The burst's GEMM time and the GEMMs' slowdown beside the copy, from one timed group.

    The GEMM alone: the fastest before the copy launches. Beside: the median of those that started after the
    first GEMM beside the copy (while that one runs, the copy's CTAs take SMs as they free up) and ended
    before the copy.

    Raises:
        ValueError: When no GEMM runs before the copy or none wholly beside it.
    """
    ends = [0.0, *(float(e) for e in timeline["gemm_end_ms"])]  # type: ignore[attr-defined]
    spans = [b - a for a, b in itertools.pairwise(ends)]
    copy_end = float(timeline["copy_end_ms"])  # type: ignore[arg-type]
    beside = [spans[i] for i in range(setup.launch_after + 1, len(spans)) if ends[i + 1] <= copy_end]
    if not setup.launch_after or not beside:
        raise ValueError("the timeline needs a GEMM before the copy and one wholly beside it")
    alone = min(spans[: setup.launch_after])
    share = 1 - setup.held_sms(ctas) / spec.sm_count
    return Burst(alone / 1e3, max(1.0, statistics.median(beside) / alone * share))


def beside_rate_gbps(copy_bytes: float, held_sms: int, timeline: Timeline) -> float | None:
    """Per-SM bandwidth of a packed copy beside the GEMMs: bytes over its span and SMs, from one timed group.

    None when the copy outlasted the GEMMs (its bytes are then split between beside and alone).
    """
    end, start = float(timeline["copy_end_ms"]), float(timeline["copy_start_ms"])  # type: ignore[arg-type]
    if end >= float(timeline["gemm_end_ms"][-1]):  # type: ignore[index]
        return None
    return copy_bytes / ((end - start) / 1e3) / held_sms / 1e9


def _gemm_profile(
    spec: GpuSpec, gemm_s: float, gemm_w: float, burst_s: float, exponent: float | None = None
) -> tuple[Profile, int]:
    """GEMM options at every MHz up to the burst clock: the spec's model scaled to the GEMMs-alone window.

    The window ran at the model's power-cap clock; the burst clock is where the model's time is the burst's
    (never below the cap clock). Above the cap clock, with ``exponent`` ``k``, the power above idle rises
    from the window's as ``(f / f_cap)^k`` instead of by the spec's voltage curve. Returns the profile and
    the burst clock.
    """
    model = GpuPowerModel(spec)
    unit = WorkProfile(compute_s=1.0, memory_s=0.0)
    cap = model.power_cap_clock_mhz(unit)
    time_scale = gemm_s / model.uncapped_time_s(unit, cap)
    power_scale = gemm_w / model.uncapped_power_w(unit, cap)
    burst = int(min(spec.max_sm_clock_mhz, max(cap, cap * gemm_s / burst_s)))
    options = []
    for clock in range(spec.min_sm_clock_mhz, burst + 1):
        time_s = model.uncapped_time_s(unit, clock) * time_scale
        power_w = model.uncapped_power_w(unit, clock) * power_scale
        if exponent is not None and clock > cap:
            power_w = spec.idle_power_w + (gemm_w - spec.idle_power_w) * (clock / cap) ** exponent
        options.append(ClockOption(clock, time_s, time_s * power_w))
    profile = Profile(
        {Work(0, 0, "forward"): options, Work(0, 0, "backward"): options},
        spec.name,
        "measured",
        spec.blocked_power_w,
        spec.idle_power_w,
    )
    return profile, burst


@dataclass(frozen=True)
class Prediction:
    """One group as the simulator gives it (*modelled*; seconds from the group's start)."""

    time_s: float
    """Time per group."""
    energy_j: float
    """Energy per group."""
    gemms_end_s: float
    """When the last GEMM ends."""
    clock_mhz: int
    """The GEMMs' clock: the highest at which the group's mean power fits the held level."""
    copy_span_s: tuple[float, float] | None = None
    """The copy's start and end (None without a copy)."""


def predict(
    spec: GpuSpec, setup: CheckSetup, gemm: Window, calibration: Calibration, ctas: int | None
) -> Prediction:
    """Modelled group (``ctas=None``: the GEMMs alone), its GEMM clock chosen by the group's mean power.

    Args:
        spec: The GPU spec (SMs, powers, voltage curve).
        setup: The group.
        gemm: The GEMMs-alone window (per group of ``setup.gemms``); its power is the level held.
        calibration: The fitted parts (module docstring).
        ctas: The copy's CTAs.

    Returns:
        Its time, energy and events, *modelled*.
    """
    gemm_s, burst_s = gemm.time_s / setup.gemms, calibration.burst.gemm_s
    profile, burst = _gemm_profile(spec, gemm_s, gemm.power_w, burst_s, calibration.power_exponent)
    pairs = setup.gemms // 2
    order = tuple(
        Instruction(0, 0, microbatch, kind) for microbatch in range(pairs) for kind in ("forward", "backward")
    )
    dag = PipelineDag.build(PipelineOrders((order,), pairs))
    simulator = OverlapSimulator(dag, profile, dataclasses.replace(spec, power_limit_w=UNCAPPED_W))
    schedule = OverlapSchedule()
    if ctas is not None:
        load = _copy_load(setup, calibration, ctas)
        schedule = OverlapSchedule(
            (CommLaunch("copy", 0, setup.copy_bytes, load, "compute", order[setup.launch_after], 0.0),)
        )

    def run(clock: int) -> OverlapResult:
        return simulator.run(dict.fromkeys(order, clock), schedule)

    low, high = spec.min_sm_clock_mhz, burst  # the mean power rises with the clock: bisect for the highest
    if _mean_w(run(high)) > gemm.power_w:
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if _mean_w(run(middle)) <= gemm.power_w else (low, middle)
        high = low
    result = run(high)
    span = None if ctas is None else (result.comm[0].start_s, result.comm[0].end_s)
    return Prediction(result.iteration_time_s, result.total_energy_j, _gemms_end_s(result), high, span)


def _copy_load(setup: CheckSetup, calibration: Calibration, ctas: int) -> CommLoad:
    law = calibration.law
    load = CommLoad(
        ctas,
        link_bandwidth_gbps=law.link_gbps,
        cta_bandwidth_gbps=law.per_cta_gbps,
        hbm_bytes_per_byte=1.0,
        ctas_per_sm=setup.ctas_per_sm,
        sm_bandwidth_gbps=calibration.sm_alone_gbps,
        sm_beside_gbps=calibration.sm_beside_gbps,
        compute_slowdown=calibration.burst.slowdown,
        packed=True,
        knee=law.knee,
    )
    return dataclasses.replace(
        load, measured_dynamic_power_w=calibration.power.dynamic_w(load.bandwidth_gbps)
    )


def _mean_w(result: OverlapResult) -> float:
    return result.total_energy_j / result.iteration_time_s


def _gemms_end_s(result: OverlapResult) -> float:
    return max(s.end_s for s in result.timeline if s.kind in ("forward", "backward"))


def fit_sm_bandwidth(
    spec: GpuSpec, setup: CheckSetup, gemm: Window, calibration: Calibration, overlap: Window
) -> float | None:
    """Per-SM bandwidth of the packed copy alone (GB/s) that reproduces one overlap window.

    The root (:func:`scipy.optimize.brentq`) of modelled minus measured time per group, between the per-SM
    bandwidth beside the GEMMs and the whole link's: the modelled time falls as it rises.

    Returns:
        None when the copy ends before the GEMMs even that slowly alone (then it never runs alone).

    Raises:
        ValueError: If the window is longer than the model with the copy alone as slow as beside, or shorter
            than with it as fast as the link.
    """
    ctas = overlap.ctas or 1
    slow, fast = calibration.sm_beside_gbps, calibration.law.link_gbps

    def excess_s(sm_gbps: float) -> float:
        trial = dataclasses.replace(calibration, sm_alone_gbps=sm_gbps)
        return predict(spec, setup, gemm, trial, ctas).time_s - overlap.time_s

    group = predict(spec, setup, gemm, dataclasses.replace(calibration, sm_alone_gbps=slow), ctas)
    assert group.copy_span_s is not None
    if group.copy_span_s[1] <= group.gemms_end_s:
        return None
    if excess_s(slow) < 0 or excess_s(fast) > 0:
        raise ValueError(f"{overlap.key}: no per-SM bandwidth alone reproduces its time")
    return float(brentq(excess_s, slow, fast, xtol=1e-6))


EXPONENT_RANGE = (0.5, 4.0)
"""Exponents :func:`fit_power_exponent` searches: from power nearly flat in the clock to ``f V^2`` with the
voltage rising as steeply as the clock (``f^3``) and beyond."""


def fit_power_exponent(
    spec: GpuSpec, setup: CheckSetup, gemm: Window, calibration: Calibration, overlap: Window
) -> float | None:
    """The exponent ``k`` of the GEMMs' power above their capped clock that reproduces one window's energy.

    The root (:func:`scipy.optimize.brentq`) of modelled minus measured energy per group over
    :data:`EXPONENT_RANGE`: the modelled energy rises with ``k`` where the GEMMs run above the cap clock.

    Returns:
        None when no exponent in the range reproduces it (e.g. GEMMs held at the cap clock, whose energy
        does not depend on ``k``): the spec's voltage curve is kept.
    """

    def excess_j(exponent: float) -> float:
        trial = dataclasses.replace(calibration, power_exponent=exponent)
        return predict(spec, setup, gemm, trial, overlap.ctas).energy_j - overlap.energy_j

    low, high = EXPONENT_RANGE
    if excess_j(low) > 0 or excess_j(high) < 0:
        return None
    return float(brentq(excess_j, low, high, xtol=1e-6))


@dataclass(frozen=True)
class Comparison:
    """Measured (mean over rounds, with the spread) vs modelled, for one configuration."""

    key: str
    """``gemm``, ``copy:N`` or ``overlap:N``."""
    rounds: int
    """Windows averaged."""
    measured_time_s: float
    """Mean measured time per group."""
    measured_energy_j: float
    """Mean measured energy per group."""
    time_spread: float
    """Relative standard deviation of the measured time over rounds."""
    energy_spread: float
    """Relative standard deviation of the measured energy over rounds."""
    modelled_time_s: float
    """Modelled time per group."""
    modelled_energy_j: float
    """Modelled energy per group."""
    calibration: bool = False
    """Whether the model was fitted to this configuration (then its error is not a prediction's)."""
    measured_clock_mhz: float | None = None
    """Median over rounds of the windows' median SM clock (None where not read)."""
    prediction: Prediction | None = None
    """The simulator's group, with its events (None for copy-alone rows)."""

    @property
    def time_error(self) -> float:
        """Modelled over measured time, minus one."""
        return self.modelled_time_s / self.measured_time_s - 1.0

    @property
    def energy_error(self) -> float:
        """Modelled over measured energy, minus one."""
        return self.modelled_energy_j / self.measured_energy_j - 1.0


def _mean(windows: Sequence[Window]) -> Window:
    first = windows[0]
    clocks = [w.clock_mhz for w in windows if w.clock_mhz is not None]
    return Window(
        first.config,
        first.ctas,
        statistics.fmean(w.time_s for w in windows),
        statistics.fmean(w.energy_j for w in windows) / statistics.fmean(w.time_s for w in windows),
        statistics.median(clocks) if clocks else None,
    )


def _spread(values: Sequence[float]) -> float:
    return float(np.std(values) / np.mean(values)) if len(values) > 1 else 0.0


def calibrate(
    spec: GpuSpec,
    setup: CheckSetup,
    means: Mapping[str, Window],
    timelines: Mapping[str, Timeline],
    sm_beside_gbps: float | None = None,
) -> Calibration:
    """Fit the model's parts to the calibration rows (module docstring).

    Args:
        spec: The GPU spec.
        setup: The group.
        means: Mean window per configuration key.
        timelines: Timed groups per overlap configuration key (the calibration one is needed).
        sm_beside_gbps: The packed copy's per-SM bandwidth beside the GEMMs, when the calibration copy
            outlasts its GEMMs (taken from another run: :func:`beside_rate_gbps`).

    Raises:
        ValueError: Without the calibration timeline, or without a per-SM bandwidth beside the GEMMs.
    """
    windows = list(means.values())
    law, power = fit_copy_law(setup.copy_bytes, windows), fit_copy_power(spec, setup.copy_bytes, windows)
    first = min((w for w in windows if w.config == "overlap"), key=lambda w: w.ctas or 0)
    ctas = first.ctas or 1
    if first.key not in timelines:
        raise ValueError(f"the calibration configuration {first.key} needs its kernel timeline")
    timeline = timelines[first.key]
    own = beside_rate_gbps(setup.copy_bytes, setup.held_sms(ctas), timeline)
    beside = own if own is not None else sm_beside_gbps
    if beside is None:
        raise ValueError(
            f"{first.key}'s copy outlasts its GEMMs: give the per-SM bandwidth beside them "
            "from a run whose copy ended before them"
        )
    calibration = Calibration(law, power, burst_from_timeline(spec, setup, ctas, timeline), beside)
    calibration = dataclasses.replace(
        calibration, sm_alone_gbps=fit_sm_bandwidth(spec, setup, means["gemm"], calibration, first)
    )
    exponent = fit_power_exponent(spec, setup, means["gemm"], calibration, first)
    return dataclasses.replace(calibration, power_exponent=exponent)


def compare(
    spec: GpuSpec,
    setup: CheckSetup,
    windows: Sequence[Window],
    timelines: Mapping[str, Timeline],
    sm_beside_gbps: float | None = None,
) -> tuple[Calibration, list[Comparison]]:
    """Every configuration's measured means against the model (module docstring).

    Returns:
        The calibration and one row per configuration.

    Raises:
        ValueError: Without a GEMMs-alone window or an overlap one, or as :func:`calibrate` does.
    """
    groups: dict[str, list[Window]] = {}
    for window in windows:
        groups.setdefault(window.key, []).append(window)
    if "gemm" not in groups or not any(key.startswith("overlap") for key in groups):
        raise ValueError("the check needs GEMMs-alone and overlap windows")
    means = {key: _mean(items) for key, items in groups.items()}
    calibration = calibrate(spec, setup, means, timelines, sm_beside_gbps)
    gemm = means["gemm"]
    first = min(w.ctas or 0 for w in means.values() if w.config == "overlap")
    rows = []
    for key, items in groups.items():
        mean = means[key]
        prediction = None
        if mean.config == "copy":
            rate = calibration.law.rate_gbps(mean.ctas or 1)
            time_s = setup.copy_bytes / (rate * 1e9)
            modelled = (time_s, (spec.blocked_power_w + calibration.power.dynamic_w(rate)) * time_s)
        else:
            prediction = predict(spec, setup, gemm, calibration, mean.ctas)
            modelled = (prediction.time_s, prediction.energy_j)
        rows.append(
            Comparison(
                key,
                len(items),
                mean.time_s,
                mean.energy_j,
                _spread([w.time_s for w in items]),
                _spread([w.energy_j for w in items]),
                *modelled,
                calibration=mean.config != "overlap" or mean.ctas == first,
                measured_clock_mhz=mean.clock_mhz,
                prediction=prediction,
            )
        )
    return calibration, rows
