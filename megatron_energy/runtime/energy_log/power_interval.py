"""One GPU's power over a log interval, from its sampled readings: levels, SM clock, each iteration's swing.

The readings (``dvfs.power_sampler.PowerSamples``) are a step function, each held until the next. Over the
interval, :func:`interval_power` gives the mean of NVML's averaged power, the instant power's mean, minimum
and maximum, and the SM clock's median and minimum; over each iteration of the interval (its ends as the
session saw them on the host) the swing figures of ``power_swing.swing_figures`` on the instant power: peak
to trough, the largest ramps and the share of fluctuation energy in the grid's band, computed for all the
iterations in one vectorised pass (``runtime.energy_log.iteration_swings``).

**What the sampling resolves.** Peak, trough and swing are read at the readings' own spacing
(``resolution_s``: the median time between readings, at least the period asked for), so a trough one reading
long is kept. Ramps and the band share are read at ``band_resolution_s``, the slower of that spacing and the
time the instant value holds still (``PowerSamples.refresh_s``: NVML refreshes field 186 about every 100 ms on
an H100; the averaged power standing in for it is a 1 s average; a simulated GPU's model is exact), since a
jump between two refreshes says nothing of how fast the power moved within them. The band is cut to what
that resolves: from ``max(0.1 Hz, 1 / iteration)`` to ``min(20 Hz, 1 / (2 x band_resolution_s))``, the
Nyquist frequency (5 Hz at NVML's 100 ms refresh). Every figure carries the readings' source: ``measured``
(NVML) or ``modelled`` (a simulated GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from megatron_energy.dvfs.power_sampler import PowerSamples
from megatron_energy.power_swing import GRID_BAND_HZ, PowerTrace
from megatron_energy.runtime.energy_log.iteration_swings import MIN_BINS, IterationSwing, iteration_swings


@dataclass(frozen=True)
class GpuPowerInterval:
    """One GPU's power over one log interval (module docstring)."""

    source: str
    """``measured`` (NVML) or ``modelled`` (a simulated GPU): where every figure below comes from."""
    instant_source: str
    """What the instant figures were read from: NVML's field 186, or the averaged power in its place."""
    readings: int
    """Readings the figures use."""
    resolution_s: float
    """The bin width of peak, trough and swing: the median time between readings. Units: s."""
    band_resolution_s: float
    """The bin width of ramps and band shares: the slower of ``resolution_s`` and the instant value's
    refresh. Units: s."""
    band_hz: tuple[float, float]
    """The band the band shares cover: the grid's 0.1-20 Hz cut to what the readings resolve."""
    average_w: float
    """The mean of NVML's averaged power over the interval's readings. Units: W."""
    instant_mean_w: float
    """The instant power's time-weighted mean. Units: W."""
    instant_min_w: float
    """The instant power's lowest reading. Units: W."""
    instant_max_w: float
    """The instant power's highest reading. Units: W."""
    sm_clock_median_mhz: float
    """The SM clock's median reading. Units: MHz."""
    sm_clock_min_mhz: float
    """The SM clock's lowest reading. Units: MHz."""
    iterations: tuple[IterationSwing, ...]
    """Each iteration of the interval long enough for ``MIN_BINS`` bins, oldest first."""
    note: str = ""
    """What limits the figures (readings the ring dropped, iterations too short), or empty."""


def held_trace(samples: PowerSamples, values: np.ndarray, start_s: float, end_s: float) -> PowerTrace | None:
    """``values`` (one per reading) as a step function over ``[start_s, end_s]``, or ``None``.

    The reading before ``start_s`` holds into it; without one, the trace starts at the first reading.
    ``None`` when no reading holds there or the span is empty.
    """
    times = samples.time_s
    if not end_s > start_s:
        return None
    held = int(np.searchsorted(times, start_s, side="right")) - 1
    if held < 0:
        if not len(times) or times[0] >= end_s:
            return None
        held, start_s = 0, float(times[0])
    inside = np.flatnonzero((times > start_s) & (times < end_s))
    edges = np.concatenate(([start_s], times[inside], [end_s]))
    powers = np.concatenate(([values[held]], values[inside]))
    return PowerTrace(edges, powers, "measured" if samples.source == "measured" else "modelled")


def interval_power(
    samples: PowerSamples, start_s: float, ends: Sequence[tuple[int, float]]
) -> GpuPowerInterval | None:
    """The interval's figures (module docstring); ``None`` without a reading taken in it.

    Args:
        samples: The GPU's readings over the interval (with the one before it, which holds into it).
        start_s: When the interval's first iteration began (the previous iteration's end).
        ends: Each iteration of the interval, oldest first: ``(iteration, when it ended)``, 1-based.
    """
    end_s = ends[-1][1]
    trace = held_trace(samples, samples.instant_w, start_s, end_s)
    if trace is None or not np.any((samples.time_s > start_s) & (samples.time_s <= end_s)):
        return None
    inside = (samples.time_s >= trace.edges_s[0]) & (samples.time_s <= end_s)
    inside[max(0, int(np.searchsorted(samples.time_s, start_s, side="right")) - 1)] = True
    times = samples.time_s[inside]
    instant = samples.instant_w[inside]
    spacing = float(np.median(np.diff(times))) if len(times) > 1 else samples.period_s
    resolution_s = max(samples.period_s, spacing)
    band_resolution_s = max(resolution_s, samples.refresh_s)
    high_hz = min(GRID_BAND_HZ[1], 0.5 / band_resolution_s)
    notes = []
    if samples.overwritten:
        notes.append(f"the ring had dropped older readings: figures from {trace.edges_s[0]:.3f} s on")
    swings = iteration_swings(samples, start_s, ends, resolution_s, band_resolution_s)
    if len(swings) < len(ends):
        notes.append(
            f"{len(ends) - len(swings)} iteration(s) without swing figures (shorter than {MIN_BINS} "
            f"bins of {band_resolution_s:.3f} s, or not read)"
        )
    clock = samples.sm_clock_mhz[inside]
    return GpuPowerInterval(
        source=trace.source,
        instant_source=samples.instant_source,
        readings=len(times),
        resolution_s=resolution_s,
        band_resolution_s=band_resolution_s,
        band_hz=(GRID_BAND_HZ[0], high_hz),
        average_w=float(np.mean(samples.average_w[inside])),
        instant_mean_w=trace.mean_w,
        instant_min_w=float(instant.min()),
        instant_max_w=float(instant.max()),
        sm_clock_median_mhz=float(np.median(clock)),
        sm_clock_min_mhz=float(clock.min()),
        iterations=tuple(swings),
        note="; ".join(notes),
    )
