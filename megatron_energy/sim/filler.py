"""The least filler that makes a pipeline's modelled power meet a smooth bound, and the check that it does.

Each stage's power over one simulated iteration (``sim.power_timeline``) is read on bins aligned with the
iteration's start: the iteration split into the whole number of bins nearest the bound's resolution (20 ms),
so the iterations that follow repeat it bin for bin and the figures are periodic. Filler only adds power, so
the least filler is the lowest power above the planned one that meets the bound:

- a floor: each stage at least ``F`` times the highest bin of any stage (the iteration's peak);
- a ramp limit: the smallest curve above the power whose adjacent bins differ by at most ``R`` times the bin
  width, wrapping round from the iteration's end to its start (it rises before work resumes and decays after
  it stops: the plan knows when);
- a job ramp: the same on the pipeline's summed power, ``J`` scaled to one pipeline of the job's ``N`` GPUs
  in phase (``J * stages / N``), its excess spread evenly over the stages.

The three are applied in turn until none raises the power any more (each only raises it, and none beyond the
highest bin but the job's spread, which the floor then follows). Every figure is *modelled*.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from megatron_energy.plan_smoothing import FillerWindow
from megatron_energy.power_swing import PowerTrace, summed, swing_figures
from megatron_energy.smooth_bound import SmoothBound

ROUNDS = 200
"""Rounds of the three rules before every stage is held flat at the highest bin (which meets any bound)."""

SNAP_S = 1e-9
"""A filler edge this close to an edge of the planned power is that edge (float rounding of the bins)."""

TOLERANCE_W = 1e-6
"""Watts a bin may miss the bound by (float rounding)."""


@dataclass(frozen=True)
class PipelineFiller:
    """The filler of every stage of one iteration, per bin (modelled)."""

    bin_s: float
    """The bin width: the iteration over a whole number of bins."""

    power_w: np.ndarray
    """Filler power per stage and bin (stages x bins), never negative."""

    @property
    def energy_j(self) -> float:
        """The filler energy per pipeline iteration."""
        return float(self.power_w.sum() * self.bin_s)

    def windows(self, stage: int) -> tuple[FillerWindow, ...]:
        """One stage's filler as time-ordered windows, adjacent bins of equal power merged."""
        windows: list[FillerWindow] = []
        for index, watts in enumerate(self.power_w[stage]):
            if watts <= TOLERANCE_W:
                continue
            start, end = index * self.bin_s, (index + 1) * self.bin_s
            last = windows[-1] if windows else None
            if last is not None and abs(last.end_s - start) < 1e-12 and abs(last.power_w - watts) < 1e-9:
                windows[-1] = FillerWindow(last.start_s, end, last.power_w)
            else:
                windows.append(FillerWindow(start, end, float(watts)))
        return tuple(windows)


def iteration_bin_s(iteration_s: float, resolution_s: float) -> float:
    """The iteration split into the whole number of bins nearest ``resolution_s`` (at least one)."""
    return iteration_s / max(1, round(iteration_s / resolution_s))


def pipeline_filler(traces: Sequence[PowerTrace], bound: SmoothBound) -> PipelineFiller:
    """The least filler per stage that makes ``traces`` (one iteration each, from 0) meet ``bound``.

    Args:
        traces: Each stage's power over one iteration (``stage_power_traces``), all of the same length.
        bound: The smooth bound.

    Returns:
        The filler, on the iteration's bins.
    """
    iteration_s = float(traces[0].edges_s[-1])
    bin_s = iteration_bin_s(iteration_s, bound.resolution_s)
    edges = np.linspace(0.0, iteration_s, round(iteration_s / bin_s) + 1)
    planned = np.array([np.diff(trace.energy_until(edges)) / bin_s for trace in traces])
    power = planned.copy()
    stages = len(traces)
    for _ in range(ROUNDS):
        before = power.copy()
        if bound.floor_share is not None:
            power = np.maximum(power, bound.floor_share * power.max())
        if bound.ramp_w_per_s is not None:
            power = np.array([_ramp_cover(row, bound.ramp_w_per_s * bin_s) for row in power])
        if bound.job_ramp_w_per_s is not None and bound.job_gpus is not None:
            total = power.sum(axis=0)
            step_w = bound.job_ramp_w_per_s * bin_s * stages / bound.job_gpus
            power = power + (_ramp_cover(total, step_w) - total) / stages
        if np.all(power - before <= TOLERANCE_W):
            break
    else:
        power = np.full_like(power, power.max())
    return PipelineFiller(bin_s, np.clip(power - planned, 0.0, None))


def filled_traces(traces: Sequence[PowerTrace], filler: Sequence[Sequence[FillerWindow]]) -> list[PowerTrace]:
    """Each stage's power with its filler windows (a plan's, or :meth:`PipelineFiller.windows`) added."""
    filled = []
    for trace, windows in zip(traces, filler, strict=True):
        end_s = float(trace.edges_s[-1])
        edges, watts = [0.0], []
        for window in windows:
            if window.start_s > edges[-1]:
                edges.append(window.start_s)
                watts.append(0.0)
            edges.append(min(window.end_s, end_s))
            watts.append(window.power_w)
        if end_s > edges[-1] * (1 + 1e-12):
            edges.append(end_s)
            watts.append(0.0)
        edges[-1] = end_s
        extra = PowerTrace(_snapped(np.array(edges), trace.edges_s), np.array(watts), "modelled")
        filled.append(summed([trace, extra]))
    return filled


def _snapped(edges: np.ndarray, onto: np.ndarray) -> np.ndarray:
    """``edges`` moved onto the nearest of ``onto`` where they are a rounding apart (no sliver between)."""
    index = np.searchsorted(onto, edges)
    below = onto[np.clip(index - 1, 0, len(onto) - 1)]
    above = onto[np.clip(index, 0, len(onto) - 1)]
    closest = np.where(np.abs(edges - below) <= np.abs(above - edges), below, above)
    return np.where(np.abs(closest - edges) <= SNAP_S, closest, edges)


def bound_problems(traces: Sequence[PowerTrace], bound: SmoothBound, bin_s: float) -> list[str]:
    """Where ``traces`` (one iteration per stage) break ``bound`` read on ``bin_s`` bins; empty if nowhere.

    Two iterations are read, so the step from one iteration's end to the next one's start counts.
    """
    problems = []
    stages = [swing_figures(trace.tiled(2), bin_s) for trace in traces]
    peak_w = max(figures.peak_w for figures in stages)
    for stage, figures in enumerate(stages):
        if bound.floor_share is not None and figures.trough_w < bound.floor_share * peak_w - 1e-3:
            problems.append(
                f"stage {stage}: trough {figures.trough_w:.1f} W under {bound.floor_share:g} x the peak "
                f"{peak_w:.1f} W"
            )
        ramp = max(figures.ramp_up_w_per_s, figures.ramp_down_w_per_s)
        if bound.ramp_w_per_s is not None and ramp > bound.ramp_w_per_s * (1 + 1e-6) + 1e-3:
            problems.append(f"stage {stage}: ramp {ramp:.1f} W/s over {bound.ramp_w_per_s:g} W/s")
    if bound.job_ramp_w_per_s is not None and bound.job_gpus is not None:
        figures = swing_figures(summed(list(traces)).tiled(2), bin_s)
        ramp = max(figures.ramp_up_w_per_s, figures.ramp_down_w_per_s) * bound.job_gpus / len(traces)
        if ramp > bound.job_ramp_w_per_s * (1 + 1e-6) + 1e-3:
            problems.append(f"job: ramp {ramp:.4g} W/s over {bound.job_ramp_w_per_s:g} W/s")
    return problems


def _ramp_cover(power: np.ndarray, step_w: float) -> np.ndarray:
    """The lowest curve at or above ``power`` whose adjacent bins differ by at most ``step_w``, periodic.

    ``max_j (power[j] - step_w * d(i, j))`` with ``d`` the distance round the iteration: the running maximum
    of ``power[j] + step_w * j`` over two laps, forwards and backwards.
    """
    count = len(power)
    twice = np.concatenate((power, power))
    ramp = step_w * np.arange(2 * count)
    forwards = (np.maximum.accumulate(twice + ramp) - ramp)[count:]
    backwards = (np.maximum.accumulate(twice[::-1] + ramp) - ramp)[count:][::-1]
    return np.maximum(forwards, backwards)
