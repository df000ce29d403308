"""A GPU's or a job's power over time, and the figures grid operators bound: swing, ramp, band energy.

A :class:`PowerTrace` is a step function: ``power_w[i]`` holds from ``edges_s[i]`` to ``edges_s[i + 1]``. A
measured trace (NVML samples, each held until the next) and a modelled one (the simulator's slices) are the
same type, so every figure is computed one way for both. The figures follow what grid operators ask of
large training jobs (arXiv 2508.14318): the swing from peak to trough, the largest ramp up and down (W/s),
and the share of the trace's fluctuation energy in the 0.1–20 Hz band. All are read at one resolution: the
trace's mean power over bins of ``resolution_s`` (a power supply does not see a 1 µs dip; NVML's instant
power field updates about every 100 ms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from megatron_energy.errors import EnergyValueError

GRID_BAND_HZ: tuple[float, float] = (0.1, 20.0)
"""The band of power fluctuation grid operators bound (arXiv 2508.14318)."""

DEFAULT_RESOLUTION_S = 0.02
"""Bin width of the figures: 50 Hz, whose Nyquist frequency (25 Hz) covers the grid band."""


@dataclass(frozen=True)
class PowerTrace:
    """Power over time as a step function, with where it came from.

    Attributes:
        edges_s: Ascending times in seconds, one more than ``power_w``.
        power_w: Power in watts held over each interval ``[edges_s[i], edges_s[i + 1])``.
        source: ``"measured"`` (NVML readings) or ``"modelled"`` (our time/power model).
    """

    edges_s: np.ndarray
    power_w: np.ndarray
    source: Literal["measured", "modelled"]

    def __post_init__(self) -> None:
        edges, power = np.asarray(self.edges_s, float), np.asarray(self.power_w, float)
        if edges.ndim != 1 or power.ndim != 1 or len(edges) != len(power) + 1 or len(power) == 0:
            raise EnergyValueError("a power trace needs n >= 1 powers and n + 1 edges")
        if not (np.all(np.isfinite(edges)) and np.all(np.isfinite(power)) and np.all(np.diff(edges) > 0)):
            raise EnergyValueError(
                "a power trace's edges must be finite and strictly ascending, powers finite"
            )
        object.__setattr__(self, "edges_s", edges)
        object.__setattr__(self, "power_w", power)

    @classmethod
    def from_samples(
        cls, times_s: np.ndarray | list[float], power_w: np.ndarray | list[float], end_s: float
    ) -> PowerTrace:
        """A measured trace from readings each held until the next (the last until ``end_s``)."""
        times = np.asarray(times_s, float)
        return cls(np.append(times, end_s), np.asarray(power_w, float), "measured")

    @property
    def duration_s(self) -> float:
        """From the first edge to the last."""
        return float(self.edges_s[-1] - self.edges_s[0])

    @property
    def energy_j(self) -> float:
        """The trace's energy: power integrated over time."""
        return float(np.dot(np.diff(self.edges_s), self.power_w))

    @property
    def mean_w(self) -> float:
        """Average power."""
        return self.energy_j / self.duration_s

    def energy_until(self, times_s: np.ndarray) -> np.ndarray:
        """Energy from the trace's start to each of ``times_s`` (clipped to the trace)."""
        cumulative = np.concatenate(([0.0], np.cumsum(np.diff(self.edges_s) * self.power_w)))
        return np.interp(times_s, self.edges_s, cumulative)

    def binned(self, resolution_s: float, keep_partial: bool = False) -> PowerTrace:
        """The mean power over consecutive bins of ``resolution_s``.

        Args:
            resolution_s: Bin width.
            keep_partial: Keep a last, shorter bin where the trace ends inside one, so the bins cover the
                whole trace (and keep its energy); by default it is dropped.
        """
        if not resolution_s > 0:
            raise EnergyValueError(f"resolution must be positive, got {resolution_s!r} s")
        whole = int(self.duration_s / resolution_s + 1e-9)
        count = int(np.ceil(self.duration_s / resolution_s - 1e-6)) if keep_partial else whole
        if count < 1:
            raise EnergyValueError(
                f"a trace of {self.duration_s:g} s is shorter than one {resolution_s:g} s bin"
            )
        edges = self.edges_s[0] + resolution_s * np.arange(count + 1)
        if keep_partial:
            edges[-1] = self.edges_s[-1]
        return PowerTrace(edges, np.diff(self.energy_until(edges)) / np.diff(edges), self.source)

    def tiled(self, count: int) -> PowerTrace:
        """The trace repeated ``count`` times back to back (one iteration made into several)."""
        steps = np.diff(self.edges_s)
        edges = self.edges_s[0] + np.concatenate(([0.0], np.cumsum(np.tile(steps, count))))
        return PowerTrace(edges, np.tile(self.power_w, count), self.source)

    def scaled(self, factor: float) -> PowerTrace:
        """The trace with every power multiplied by ``factor`` (``factor`` GPUs drawing alike)."""
        return PowerTrace(self.edges_s, self.power_w * factor, self.source)

    def shifted(self, offset_s: float) -> PowerTrace:
        """The trace as a periodic one started ``offset_s`` later: its end wraps round to its start."""
        start, period = float(self.edges_s[0]), self.duration_s
        offset = offset_s % period
        tolerance = 1e-12 * max(1.0, period)
        if offset < tolerance or period - offset < tolerance:
            return self
        cut = float(self.edges_s[-1]) - offset
        # an edge a rounding away from the cut is the cut, or it would wrap to the wrong end
        snapped = np.where(np.abs(self.edges_s - cut) <= tolerance, cut, self.edges_s)
        points = np.sort(np.concatenate((snapped, [cut])))
        points = points[np.concatenate(([True], np.diff(points) > tolerance))]
        starts = points[:-1]
        middles = 0.5 * (starts + points[1:])
        powers = self.power_w[np.searchsorted(self.edges_s, middles, side="right") - 1]
        moved = np.where(starts >= cut, starts - cut + start, starts + offset)
        order = np.argsort(moved, kind="stable")
        return PowerTrace(np.append(moved[order], self.edges_s[-1]), powers[order], self.source)


@dataclass(frozen=True)
class SwingFigures:
    """What a power trace does to the grid, read at one resolution (each figure as the trace's source says).

    Attributes:
        source: ``"measured"`` or ``"modelled"``, the trace's.
        resolution_s: The bin width the figures were read at.
        mean_w: Average power.
        peak_w: The highest bin.
        trough_w: The lowest bin.
        swing_w: ``peak_w - trough_w``.
        ramp_up_w_per_s: The largest rise between adjacent bins, per second.
        ramp_down_w_per_s: The largest fall between adjacent bins, per second (a positive number).
        band_share: The share of the trace's fluctuation energy (its spectrum without the mean) inside
            :data:`GRID_BAND_HZ`, up to the resolution's Nyquist frequency; 0 for a flat trace.
        band_rms_w: The root-mean-square amplitude of the fluctuation inside the band.
    """

    source: str
    resolution_s: float
    mean_w: float
    peak_w: float
    trough_w: float
    swing_w: float
    ramp_up_w_per_s: float
    ramp_down_w_per_s: float
    band_share: float
    band_rms_w: float


def swing_figures(
    trace: PowerTrace, resolution_s: float = DEFAULT_RESOLUTION_S, band_hz: tuple[float, float] = GRID_BAND_HZ
) -> SwingFigures:
    """The swing, ramps and band energy of ``trace`` at ``resolution_s``.

    Args:
        trace: The power over time (a whole number of iterations reads best: the band is read by an FFT,
            which treats the trace as periodic).
        resolution_s: Bin width; ramps are the change between adjacent bins over this time.
        band_hz: The band whose share of fluctuation energy is reported.

    Returns:
        The figures, marked with the trace's source.
    """
    bins = trace.binned(resolution_s).power_w
    steps = np.diff(bins) / resolution_s if len(bins) > 1 else np.zeros(1)
    flat = np.ptp(bins) <= 1e-9 * max(1.0, abs(float(bins.mean())))
    fluctuation = np.zeros_like(bins) if flat else bins - bins.mean()
    spectrum = np.abs(np.fft.rfft(fluctuation)) ** 2
    frequencies = np.fft.rfftfreq(len(bins), resolution_s)
    inside = (frequencies >= band_hz[0]) & (frequencies <= band_hz[1]) & (frequencies > 0)
    total = float(spectrum[frequencies > 0].sum())
    band = float(spectrum[inside].sum())
    # Parseval with rfft's one-sided spectrum: an interior bin stands for two of the full spectrum
    weights = np.where((frequencies > 0) & (frequencies < 0.5 / resolution_s - 1e-12), 2.0, 1.0)
    band_variance = float((spectrum * weights)[inside].sum()) / len(bins) ** 2
    return SwingFigures(
        source=trace.source,
        resolution_s=resolution_s,
        mean_w=float(bins.mean()),
        peak_w=float(bins.max()),
        trough_w=float(bins.min()),
        swing_w=float(bins.max() - bins.min()),
        ramp_up_w_per_s=max(0.0, float(steps.max())),
        ramp_down_w_per_s=max(0.0, float(-steps.min())),
        band_share=band / total if total > 0 else 0.0,
        band_rms_w=float(np.sqrt(band_variance)),
    )


def floored(trace: PowerTrace, floor_w: float, resolution_s: float = DEFAULT_RESOLUTION_S) -> PowerTrace:
    """``trace`` read in bins of ``resolution_s`` (all of it), filler holding each at ``floor_w`` or above."""
    bins = trace.binned(resolution_s, keep_partial=True)
    return PowerTrace(bins.edges_s, np.maximum(bins.power_w, floor_w), trace.source)


def floor_energy_j(trace: PowerTrace, floor_w: float, resolution_s: float = DEFAULT_RESOLUTION_S) -> float:
    """What a filler spends to hold ``trace`` at ``floor_w`` or above: ∫ max(0, floor − P) dt, binned.

    The bins cover the whole trace (:func:`floored`'s, a last one shorter where the trace ends inside it).
    """
    bins = trace.binned(resolution_s, keep_partial=True)
    return float(np.dot(np.diff(bins.edges_s), np.clip(floor_w - bins.power_w, 0.0, None)))


def summed(traces: list[PowerTrace]) -> PowerTrace:
    """Several GPUs' traces added on their common time span (e.g. a job's power from its GPUs')."""
    if not traces:
        raise EnergyValueError("no traces to add")
    start = max(float(t.edges_s[0]) for t in traces)
    end = min(float(t.edges_s[-1]) for t in traces)
    if not end > start:
        raise EnergyValueError("the traces do not overlap in time")
    edges = np.unique(np.concatenate([t.edges_s[(t.edges_s > start) & (t.edges_s < end)] for t in traces]))
    edges = np.concatenate(([start], edges, [end]))
    energy = sum(trace.energy_until(edges) for trace in traces)
    sources = {t.source for t in traces}
    return PowerTrace(
        edges, np.diff(energy) / np.diff(edges), "measured" if sources == {"measured"} else "modelled"
    )
