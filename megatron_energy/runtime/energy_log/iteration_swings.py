"""Each iteration's swing in a log interval, in one vectorised pass over the interval's readings.

The figures are those of ``power_swing.swing_figures`` on each iteration's held instant power
(``runtime.energy_log.power_interval.held_trace``), computed without building a trace per iteration: the
readings' cumulative energy is built once, every iteration's bins at each resolution are read from it by one
interpolation, and per iteration only slices remain (peak, trough and ramps by ``reduceat``); the band share
takes one small real FFT per iteration, batched over the iterations with the same number of bins. The
results equal the per-iteration figures to floating-point rounding (``tests/test_iteration_swings.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from megatron_energy.dvfs.power_sampler import PowerSamples
from megatron_energy.power_swing import GRID_BAND_HZ

MIN_BINS = 2
"""An iteration needs at least this many bins of the band's resolution for its swing figures."""


@dataclass(frozen=True)
class IterationSwing:
    """One iteration's instant power, read at the interval's resolution (its source is the interval's)."""

    iteration: int
    """The iteration, 1-based as in Megatron's log."""
    duration_s: float
    """From the previous iteration's end to its own, as the host saw them."""
    mean_w: float
    """Its mean instant power."""
    peak_w: float
    """The highest bin."""
    trough_w: float
    """The lowest bin."""
    swing_w: float
    """``peak_w - trough_w``."""
    ramp_up_w_per_s: float
    """The largest rise between adjacent bins of the band's resolution, per second, from the bin before the
    iteration's start (the change into it is its own)."""
    ramp_down_w_per_s: float
    """The largest fall between adjacent bins of the band's resolution, per second (positive)."""
    band_share: float
    """The share of its fluctuation energy inside the interval's resolvable band (``band_hz`` there), from
    ``1 / duration_s`` up where that is above the band's low end (one iteration holds no slower wave)."""


class _HeldEnergy:
    """The instant power's energy since the first reading, each reading held until the next."""

    def __init__(self, samples: PowerSamples, end_s: float) -> None:
        self.times = samples.time_s
        last = max(end_s, float(self.times[-1]))
        self.knots = np.append(self.times, last)
        steps = np.diff(self.knots) * samples.instant_w
        self.energy = np.concatenate(([0.0], np.cumsum(steps)))

    def held_start(self, start_s: np.ndarray) -> np.ndarray:
        """Where each span starting at ``start_s`` begins: there, or at the first reading if none holds."""
        return np.where(self.times[0] <= start_s, start_s, self.times[0])

    def bins(self, starts: np.ndarray, counts: np.ndarray, width: float) -> tuple[np.ndarray, np.ndarray]:
        """The mean power over ``counts[i]`` bins of ``width`` from each ``starts[i]``, all concatenated.

        Returns:
            The bins' powers, and the index of each span's first bin in them.
        """
        edge_counts = counts + 1
        first_edge = np.concatenate(([0], np.cumsum(edge_counts)[:-1]))
        local = np.arange(int(edge_counts.sum())) - np.repeat(first_edge, edge_counts)
        edges = np.repeat(starts, edge_counts) + width * local
        energy = np.interp(edges, self.knots, self.energy)
        inside = np.ones(len(edges) - 1, bool)
        inside[(first_edge + counts)[:-1]] = False  # from one span's last edge to the next's first
        powers = np.diff(energy)[inside] / np.diff(edges)[inside]
        return powers, first_edge - np.arange(len(counts))


def iteration_swings(
    samples: PowerSamples,
    start_s: float,
    ends: Sequence[tuple[int, float]],
    resolution_s: float,
    band_resolution_s: float,
) -> list[IterationSwing]:
    """The swing of each iteration of ``ends`` long enough for ``MIN_BINS`` bins and read, oldest first.

    Args:
        samples: The readings over the interval (with the one before it, which holds into it).
        start_s: When the first iteration began.
        ends: ``(iteration, when it ended)`` of each, oldest first.
        resolution_s: The bin width of peak, trough and swing.
        band_resolution_s: The bin width of ramps and the band share (at least ``resolution_s``).
    """
    if not len(samples) or not ends:
        return []
    ended = np.array([end for _, end in ends], float)
    began = np.concatenate(([start_s], ended[:-1]))
    held = _HeldEnergy(samples, float(ended.max()))
    starts = held.held_start(began)
    durations = ended - starts
    kept = (ended > began) & (samples.time_s[0] < ended) & ~(durations < MIN_BINS * band_resolution_s)
    if not kept.any():
        return []
    ended, began, starts, durations = ended[kept], began[kept], starts[kept], durations[kept]
    means = np.diff(np.interp(np.stack((starts, ended)), held.knots, held.energy), axis=0)[0] / durations
    band_counts = (durations / band_resolution_s + 1e-9).astype(int)
    band_bins, band_first = held.bins(starts, band_counts, band_resolution_s)
    if resolution_s == band_resolution_s:
        level_bins, level_first = band_bins, band_first
    else:
        level_counts = (durations / resolution_s + 1e-9).astype(int)
        level_bins, level_first = held.bins(starts, level_counts, resolution_s)
    peaks = np.maximum.reduceat(level_bins, level_first)
    troughs = np.minimum.reduceat(level_bins, level_first)
    # ramps from one bin before the start: the change into the iteration (a step boundary's) is its own
    ramp_starts = held.held_start(began - band_resolution_s)
    ramp_counts = ((ended - ramp_starts) / band_resolution_s + 1e-9).astype(int)
    ramp_bins, ramp_first = held.bins(ramp_starts, ramp_counts, band_resolution_s)
    ups, downs = _largest_steps(ramp_bins, ramp_first, ramp_counts, band_resolution_s)
    shares = _band_shares(band_bins, band_first, band_counts, durations, band_resolution_s)
    iterations = [iteration for (iteration, _), keep in zip(ends, kept, strict=True) if keep]
    return [
        IterationSwing(
            iteration=iteration,
            duration_s=float(durations[k]),
            mean_w=float(means[k]),
            peak_w=float(peaks[k]),
            trough_w=float(troughs[k]),
            swing_w=float(peaks[k] - troughs[k]),
            ramp_up_w_per_s=float(ups[k]),
            ramp_down_w_per_s=float(downs[k]),
            band_share=float(shares[k]),
        )
        for k, iteration in enumerate(iterations)
    ]


def _largest_steps(
    bins: np.ndarray, first: np.ndarray, counts: np.ndarray, width: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each span's largest rise and fall between adjacent bins, per second (every span has 2 bins or more)."""
    steps = np.diff(bins) / width
    across = (first + counts - 1)[:-1]  # the step from one span's last bin to the next's first
    rises, falls = steps.copy(), steps.copy()
    rises[across], falls[across] = -np.inf, np.inf
    largest_rise = np.maximum.reduceat(rises, first)
    largest_fall = -np.minimum.reduceat(falls, first)
    return np.maximum(largest_rise, 0.0), np.maximum(largest_fall, 0.0)


def _band_shares(
    bins: np.ndarray, first: np.ndarray, counts: np.ndarray, durations: np.ndarray, width: float
) -> np.ndarray:
    """Each span's share of fluctuation energy in its band: batched real FFTs, one per span length."""
    shares = np.zeros(len(counts))
    high_hz = min(GRID_BAND_HZ[1], 0.5 / width)
    for count in np.unique(counts):
        rows = np.flatnonzero(counts == count)
        block = bins[first[rows, None] + np.arange(count)]
        means = block.mean(axis=1, keepdims=True)
        flat = np.ptp(block, axis=1) <= 1e-9 * np.maximum(1.0, np.abs(means[:, 0]))
        fluctuation = np.where(flat[:, None], 0.0, block - means)
        spectrum = np.abs(np.fft.rfft(fluctuation, axis=1)) ** 2
        frequencies = np.fft.rfftfreq(int(count), width)
        low_hz = np.maximum(GRID_BAND_HZ[0], 1.0 / durations[rows])
        positive = frequencies > 0
        inside = (frequencies >= low_hz[:, None]) & (frequencies <= high_hz) & positive
        total = spectrum[:, positive].sum(axis=1)
        band = np.where(inside, spectrum, 0.0).sum(axis=1)
        shares[rows] = np.divide(band, total, out=np.zeros_like(band), where=total > 0)
    return shares
