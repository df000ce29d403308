"""The vectorised iteration swings equal `swing_figures` on each iteration's held trace (random traces)."""

from __future__ import annotations

import numpy as np
import pytest

from megatron_energy.dvfs.power_sampler import PowerSamples
from megatron_energy.power_swing import GRID_BAND_HZ, swing_figures
from megatron_energy.runtime.energy_log.iteration_swings import MIN_BINS, IterationSwing, iteration_swings
from megatron_energy.runtime.energy_log.power_interval import held_trace


def reference_swing(
    samples: PowerSamples, iteration: int, span_s: tuple[float, float], resolution_s: float, band_s: float
) -> IterationSwing | None:
    """One iteration's figures the slow way: its held trace, and ``swing_figures`` at each resolution."""
    start_s, end_s = span_s
    trace = held_trace(samples, samples.instant_w, start_s, end_s)
    if trace is None or trace.duration_s < MIN_BINS * band_s:
        return None
    band_hz = (max(GRID_BAND_HZ[0], 1.0 / trace.duration_s), min(GRID_BAND_HZ[1], 0.5 / band_s))
    band = swing_figures(trace, band_s, band_hz=band_hz)
    levels = swing_figures(trace, resolution_s)
    ramps = held_trace(samples, samples.instant_w, start_s - band_s, end_s) or trace
    changes = swing_figures(ramps, band_s)
    return IterationSwing(
        iteration=iteration,
        duration_s=trace.duration_s,
        mean_w=trace.mean_w,
        peak_w=levels.peak_w,
        trough_w=levels.trough_w,
        swing_w=levels.swing_w,
        ramp_up_w_per_s=changes.ramp_up_w_per_s,
        ramp_down_w_per_s=changes.ramp_down_w_per_s,
        band_share=band.band_share,
    )


def random_case(seed: int) -> tuple[PowerSamples, float, list[tuple[int, float]], float, float]:
    """Jittered readings of a noisy square wave, iterations of random lengths (some too short, one empty)."""
    rng = np.random.default_rng(seed)
    period_s = float(rng.choice([0.02, 0.05]))
    refresh_s = float(rng.choice([0.0, 0.1, 0.25]))
    times = 0.3 + np.cumsum(rng.uniform(0.9 * period_s, 1.1 * period_s, 400))
    wave = np.sign(np.sin(2 * np.pi * times / rng.uniform(0.4, 1.5)))
    instant = 550.0 + 150.0 * wave + rng.normal(0.0, 30.0, len(times))
    if seed % 3 == 0:
        instant[:] = 420.0  # a flat trace: band share 0
    samples = PowerSamples(
        times, instant, instant, np.full_like(times, 1980.0), "measured", "x", period_s, refresh_s
    )
    start_s = float(rng.uniform(0.0, 0.6))  # at times before the first reading
    durations = rng.choice([0.0, 0.15, 0.6, 1.0, 1.3], size=8)
    ends = [(10 + k, float(end)) for k, end in enumerate(start_s + np.cumsum(durations))]
    resolution_s = float(np.median(np.diff(times)))
    return samples, start_s, ends, resolution_s, max(resolution_s, refresh_s)


@pytest.mark.parametrize("seed", range(24))
def test_the_vectorised_swings_equal_swing_figures_on_each_iterations_trace(seed):
    samples, start_s, ends, resolution_s, band_s = random_case(seed)
    began = [start_s] + [ended_s for _, ended_s in ends[:-1]]
    each = [
        reference_swing(samples, iteration, (first_s, ended_s), resolution_s, band_s)
        for (iteration, ended_s), first_s in zip(ends, began, strict=True)
    ]
    expected = [swing for swing in each if swing is not None]
    got = iteration_swings(samples, start_s, ends, resolution_s, band_s)
    assert [s.iteration for s in got] == [s.iteration for s in expected]
    assert expected, "every case has iterations with figures"
    for mine, theirs in zip(got, expected, strict=True):
        assert vars(mine) == pytest.approx(vars(theirs), rel=1e-9, abs=1e-6)


def test_no_readings_or_no_iterations_give_no_swings():
    samples, start_s, _, resolution_s, band_s = random_case(1)
    assert iteration_swings(samples, start_s, [], resolution_s, band_s) == []
    assert iteration_swings(samples, 0.0, [(1, 0.2)], resolution_s, band_s) == []  # before the first reading
