"""The CPU side of the single-GPU contention check (``scripts/gpu_contention.py``): model, fits and errors.

The check runs *groups* on one GPU: ``gemms`` bf16 GEMMs back to back on the main stream and, in an overlap
configuration, one CTA-limited copy kernel of ``copy_bytes`` (read + written) on a side stream, launched once
the first ``launch_after`` GEMMs of the group are done; the group ends when both have finished. Isolated
windows (GEMMs alone, the copy alone at each CTA count) calibrate the parts; the overlap windows are then
*predicted* by the same overlap simulator the planner uses (``sim.overlap.OverlapSimulator`` on a one-stage
DAG whose instructions are the GEMMs, the copy a collective launch at the GEMM it follows), and compared
with what was measured:

* the GEMM's time and power alone are measured at stock clocks; its time and power at lower clocks (which
  the power cap may impose beside the copy) follow the spec's time/power model, scaled to the measurement;
* the copy's bandwidth follows the contention model's law ``min(B, c x beta)``, with ``B`` and ``beta`` fitted
  to the copy-alone windows (:func:`fit_copy_law`); running without the GEMMs its dynamic power is the one
  measured alone at that CTA count (power minus the spec's blocked power), also when packed (a packed copy
  moves fewer bytes per second, but scaling its power by its rate under-predicted the measured energy by
  11-16 %); beside the GEMMs only its modelled marginal power counts (its SMs' core activity and its HBM
  traffic: :mod:`megatron_energy.sim.contention`, Power);
* launched beside the GEMMs, which fill every SM, the copy's CTAs are packed ``ctas_per_sm`` to an SM (its
  occupancy; :mod:`megatron_energy.sim.contention`), so it holds ``h = ceil(c / ctas_per_sm)`` SMs for its
  whole life and drives at most ``h x s x f / f_max``, ``s`` the per-SM bandwidth at the maximum clock and
  ``f`` the SM clock in effect: the power-capped clock beside the GEMMs, the maximum once they are done
  (the simulator re-evaluates its rate at every such event). ``s`` is fitted to ONE overlap window, the one
  with the fewest CTAs (:func:`fit_sm_bandwidth`: the ``s`` at which the simulator gives that window's
  measured time), which is marked as calibration and left out of the verdict; every other overlap
  configuration is a prediction;
* the GEMMs progress at ``1 - h/S`` of their rate beside the copy, lower still when the power cap binds.

The measured kernel timelines (each GEMM's end, the copy's start and end) and median SM clocks are not fitted
to; each row's :class:`Prediction` gives the same events from the simulator, to set beside them.

Pure Python + numpy: no torch, no NVML; tested on CPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.sim.contention import CommLoad
from megatron_energy.sim.overlap import CommLaunch, OverlapResult, OverlapSchedule, OverlapSimulator


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
    """The copy's bandwidth law ``min(link, ctas x per_cta)`` fitted to the copy-alone windows (GB/s)."""

    link_gbps: float
    """Saturated bandwidth (bytes read + written)."""
    per_cta_gbps: float
    """Bandwidth one CTA drives."""


def fit_copy_law(copy_bytes: float, windows: Sequence[Window]) -> CopyLaw:
    """Fit ``min(B, c x beta)`` to copy-alone windows by least squares on relative time errors.

    ``beta`` is tried at every measured ``bandwidth / ctas`` and ``B`` at every measured bandwidth; the pair
    with the least squared relative error of time wins (a 2-parameter fit by exhaustive candidates).

    Raises:
        ValueError: Without copy-alone windows.
    """
    copies = [w for w in windows if w.config == "copy" and w.ctas]
    if not copies:
        raise ValueError("fit_copy_law needs copy-alone windows")
    rates = [(float(w.ctas or 1), copy_bytes / w.time_s / 1e9) for w in copies]
    best: tuple[float, CopyLaw] | None = None
    for _, link in rates:
        for ctas, rate in rates:
            law = CopyLaw(link, rate / ctas)
            error = sum((min(law.link_gbps, c * law.per_cta_gbps) / r - 1.0) ** 2 for c, r in rates)
            if best is None or error < best[0]:
                best = (error, law)
    assert best is not None
    return best[1]


def fit_sm_bandwidth(
    spec: GpuSpec, setup: CheckSetup, gemm: Window, law: CopyLaw, copy_power_w: float, overlap: Window
) -> float:
    """Per-SM bandwidth of the packed copy at the maximum clock (GB/s) that reproduces one overlap window.

    The root (:func:`scipy.optimize.brentq`) of modelled minus measured time per group: the modelled time
    falls as the per-SM bandwidth rises, as long as the copy outlasts the GEMMs.

    Args:
        spec: The GPU spec.
        setup: The group.
        gemm: The GEMMs-alone window.
        law: The copy's fitted bandwidth law.
        copy_power_w: The copy's power measured alone at the window's CTAs.
        overlap: The overlap window to calibrate on.

    Raises:
        ValueError: If the window is no longer than the model's group with no per-SM limit (its copy does
            not outlast the GEMMs: calibrate on fewer CTAs).
    """
    ctas = overlap.ctas or 1

    def excess_s(sm_gbps: float) -> float:
        return predict(spec, setup, gemm, law, copy_power_w, ctas, sm_gbps).time_s - overlap.time_s

    unlimited = law.link_gbps  # one SM at the whole link's rate: the per-SM ceiling never binds
    if excess_s(unlimited) >= 0:
        raise ValueError(f"{overlap.key}: its copy ends before the GEMMs; calibrate on fewer CTAs")
    slow = 0.5 * setup.copy_bytes / overlap.time_s / 1e9 / setup.held_sms(ctas)  # twice the window at most
    return float(brentq(excess_s, slow, unlimited, xtol=1e-6))


def _gemm_profile(spec: GpuSpec, gemm: Window) -> Profile:
    """GEMM options at every clock: measured at the stock (maximum) clock, the model's shape elsewhere."""
    model = GpuPowerModel(spec)
    unit = WorkProfile(compute_s=1.0, memory_s=0.0)
    top = spec.max_sm_clock_mhz
    time_scale = gemm.time_s / model.time_s(unit, top)
    power_scale = gemm.power_w / model.power_w(unit, top)
    options = [
        ClockOption(clock, model.time_s(unit, clock) * time_scale, 0.0) for clock in spec.sm_clocks_mhz
    ]
    options = [
        ClockOption(o.clock_mhz, o.time_s, o.time_s * model.power_w(unit, o.clock_mhz) * power_scale)
        for o in options
    ]
    return Profile(
        {Work(0, 0, "forward"): options, Work(0, 0, "backward"): options},
        spec.name,
        "measured",
        spec.blocked_power_w,
        spec.idle_power_w,
    )


@dataclass(frozen=True)
class Prediction:
    """One group as the simulator gives it (*modelled*; seconds from the group's start)."""

    time_s: float
    """Time per group."""
    energy_j: float
    """Energy per group."""
    gemms_end_s: float
    """When the last GEMM ends."""
    copy_span_s: tuple[float, float] | None = None
    """The copy's start and end (None without a copy)."""
    clock_mhz: int | None = None
    """The SM clock in effect while the GEMMs run beside the copy (None without a copy)."""


def predict(
    spec: GpuSpec,
    setup: CheckSetup,
    gemm: Window,
    law: CopyLaw,
    copy_power_w: float,
    ctas: int | None,
    sm_bandwidth_gbps: float | None = None,
) -> Prediction:
    """Modelled group (``ctas=None``: the GEMMs alone).

    Args:
        spec: The GPU spec (SMs, powers, power limit, voltage curve).
        setup: The group.
        gemm: The GEMMs-alone window (per group of ``setup.gemms``).
        law: The copy's fitted bandwidth law.
        copy_power_w: The copy's power measured alone at ``ctas``.
        ctas: The copy's CTAs.
        sm_bandwidth_gbps: The packed copy's bandwidth per SM it holds at the maximum clock (None: no
            per-SM limit).

    Returns:
        Its time, energy and events, *modelled*.
    """
    per_gemm = Window("gemm", None, gemm.time_s / setup.gemms, gemm.power_w)
    profile = _gemm_profile(spec, per_gemm)
    pairs = setup.gemms // 2
    order = tuple(
        Instruction(0, 0, microbatch, kind) for microbatch in range(pairs) for kind in ("forward", "backward")
    )
    dag = PipelineDag.build(PipelineOrders((order,), pairs))
    simulator = OverlapSimulator(dag, profile, spec)
    top = spec.max_sm_clock_mhz
    clocks = dict.fromkeys(order, top)
    if ctas is None:
        result = simulator.run(clocks, OverlapSchedule())
        return Prediction(result.iteration_time_s, result.total_energy_j, _gemms_end_s(result))
    load = CommLoad(
        ctas,
        link_bandwidth_gbps=law.link_gbps,
        cta_bandwidth_gbps=law.per_cta_gbps,
        hbm_bytes_per_byte=1.0,
        measured_dynamic_power_w=max(0.0, copy_power_w - spec.blocked_power_w),
        ctas_per_sm=setup.ctas_per_sm,
        sm_bandwidth_gbps=sm_bandwidth_gbps,
        packed=True,
    )
    launch = CommLaunch("copy", 0, setup.copy_bytes, load, "compute", order[setup.launch_after], 0.0)
    result = simulator.run(clocks, OverlapSchedule((launch,)))
    (copy,) = result.comm
    state = simulator.overlap_state(order[0].work, top, load)
    return Prediction(
        result.iteration_time_s,
        result.total_energy_j,
        _gemms_end_s(result),
        (copy.start_s, copy.end_s),
        state.effective_clock_mhz,
    )


def _gemms_end_s(result: OverlapResult) -> float:
    return max(s.end_s for s in result.timeline if s.kind in ("forward", "backward"))


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


def compare(
    spec: GpuSpec, setup: CheckSetup, windows: Sequence[Window]
) -> tuple[CopyLaw, float | None, list[Comparison]]:
    """Every configuration's measured means against the model (module docstring).

    Returns:
        The copy law, the packed copy's per-SM bandwidth (None without overlap windows) and one row per
        configuration.

    Raises:
        ValueError: Without a GEMMs-alone window, or an overlap configuration without its copy-alone windows.
    """
    groups: dict[str, list[Window]] = {}
    for window in windows:
        groups.setdefault(window.key, []).append(window)
    if "gemm" not in groups:
        raise ValueError("the check needs GEMMs-alone windows")
    means: Mapping[str, Window] = {key: _mean(items) for key, items in groups.items()}
    law = fit_copy_law(setup.copy_bytes, list(means.values()))
    gemm = means["gemm"]
    overlaps = sorted((w for w in means.values() if w.config == "overlap"), key=lambda w: w.ctas or 0)
    for window in overlaps:
        if f"copy:{window.ctas}" not in means:
            raise ValueError(f"{window.key} needs copy-alone windows at {window.ctas} CTAs")
    sm_gbps = None
    if overlaps:
        first = overlaps[0]
        sm_gbps = fit_sm_bandwidth(spec, setup, gemm, law, means[f"copy:{first.ctas}"].power_w, first)
    rows = []
    for key, items in groups.items():
        mean = means[key]
        prediction = None
        if mean.config == "gemm":
            prediction = predict(spec, setup, gemm, law, 0.0, None)
        elif mean.config == "overlap":
            alone = means[f"copy:{mean.ctas}"]
            prediction = predict(spec, setup, gemm, law, alone.power_w, mean.ctas, sm_gbps)
        if prediction is None:
            ctas = float(mean.ctas or 1)
            time_s = setup.copy_bytes / (min(law.link_gbps, ctas * law.per_cta_gbps) * 1e9)
            modelled = (time_s, mean.power_w * time_s)
        else:
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
                calibration=mean.config == "overlap" and mean is overlaps[0],
                measured_clock_mhz=mean.clock_mhz,
                prediction=prediction,
            )
        )
    return law, sm_gbps, rows
