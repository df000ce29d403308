"""The ``power:W[,peak:P]`` target: the fastest frontier point that fits a power budget per GPU.

Operators ask "this rack may draw W watts per GPU: what is the fastest plan that fits?". The answer comes from
the same frontier as every other target: of the frontier's points (made executable under the switch
latency, like every point a planner hands out) it takes the one with the least iteration time whose
*predicted* average power per GPU (the point's energy over its time, divided over the pipeline's GPUs) is at
most ``W``, and, with ``peak:P``, whose most power-hungry instruction (its profiled energy over its time at
the point's clock) draws at most ``P``. Slower points draw less, so a budget below what the slowest point
draws cannot be met: it is rejected, naming the lowest achievable power.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from megatron_energy.errors import TargetUnreachableError
from megatron_energy.optimisers.perseus.frontier import FrontierPoint
from megatron_energy.pipeline.profile import Profile
from megatron_energy.target import EnergyTarget


class PowerBudgetError(TargetUnreachableError):
    """No frontier point fits the power budget; the message names the lowest achievable power."""


@dataclass(frozen=True)
class PointPower:
    """The predicted (*modelled*) power of one frontier point, per GPU."""

    point: FrontierPoint
    """The point."""

    average_w: float
    """Its energy over its iteration time, divided over the pipeline's GPUs."""

    peak_w: float
    """The highest power of any instruction at its clock in the point (profile energy over time)."""

    def fits(self, target: EnergyTarget) -> bool:
        """Whether the point meets the target's average budget and its peak cap, if any."""
        return self.average_w <= target.power_w and (target.peak_w is None or self.peak_w <= target.peak_w)


def point_power(point: FrontierPoint, profile: Profile) -> PointPower:
    """The predicted average and peak power per GPU of ``point`` (see the module docstring)."""
    gpus = len(point.stage_energy_j)
    average_w = point.energy_j / (gpus * point.time_s)
    peak_w = 0.0
    for instruction, clock in point.clocks.items():
        option = profile.option_at(instruction.work, clock)
        peak_w = max(peak_w, option.energy_j / option.time_s)
    return PointPower(point, average_w, peak_w)


def fastest_within_budget(
    points: Iterable[FrontierPoint], profile: Profile, target: EnergyTarget
) -> FrontierPoint:
    """The point with the least iteration time that fits ``target`` (a ``power`` target).

    Args:
        points: Candidate points (executable ones, with their latency-aware figures).
        profile: The profile the points were planned from (for the peak).
        target: The ``power:W[,peak:P]`` target.

    Returns:
        The fastest fitting point; of equally fast ones, the one with less energy.

    Raises:
        ValueError: If ``target`` is not a power target or there are no points.
        PowerBudgetError: If no point fits; the message gives the lowest achievable power.
    """
    if target.kind != "power":
        raise ValueError(f"fastest_within_budget needs a power target, got {target}")
    powers = [point_power(point, profile) for point in points]
    if not powers:
        raise ValueError("fastest_within_budget needs at least one frontier point")
    fitting = [power for power in powers if power.fits(target)]
    if fitting:
        return min(fitting, key=lambda power: (power.point.time_s, power.point.energy_j)).point
    raise PowerBudgetError(_impossible(powers, target, profile.source))


def _impossible(powers: Sequence[PointPower], target: EnergyTarget, source: str) -> str:
    """Why no point fits, with the lowest achievable average (and peak) power per GPU.

    ``source`` is the profile's: a measured profile's powers are predicted from measured instruction figures.
    """
    lowest = min(powers, key=lambda power: power.average_w)
    fastest_s = min(power.point.time_s for power in powers)
    slowdown = lowest.point.time_s / fastest_s - 1.0
    origin = "predicted from the measured profile" if source == "measured" else f"modelled ({source} profile)"
    message = (
        f"--energy-target {target}: no plan fits; the lowest reachable average power is "
        f"{lowest.average_w:.1f} W per GPU ({origin}, at the slowest frontier point, {slowdown:+.1%} "
        "iteration time)"
    )
    if target.peak_w is not None:
        least_peak = min(power.peak_w for power in powers)
        message += f" and the lowest predicted peak is {least_peak:.1f} W per GPU"
    return message + "; raise the budget to at least that, or use min-energy for the least energy"
