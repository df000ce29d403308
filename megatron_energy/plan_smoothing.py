"""A ``smooth:`` plan's filler: where each GPU draws more to meet the bound, and its cost (a plan field).

A ``smooth:`` target (:mod:`megatron_energy.smooth_bound`) is planned jointly with energy
(``optimisers.perseus.smooth_point``): the clocks lower the peaks and stretch work into the bubbles where the
deadline allows; where the power still breaks the bound, **filler** makes up the difference: per pipeline
rank, windows of extra power (:class:`FillerWindow`) over the target point's iteration, on bins aligned with
its start. The target point's predicted rank energies include the filler, so every saving printed of the plan
prices it; :attr:`PlanSmoothing.filler_floor_j` is what a filler floor of the same bound costs on stock clocks
(∫ max(0, floor − P) dt for a floor), the comparison the plan is made to beat. Points other than the
target (a straggler's pace) carry no filler: their smoothness is not held.

The runtime does not execute the filler (no filler kernel runs; the clocks run as planned): its smoothness is
*modelled*, and the log says so in the plan's line (:func:`filler_note`). Every figure here is *modelled*.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Gt

from megatron_energy.smooth_bound import SmoothBound


@dataclass(frozen=True)
class FillerWindow:
    """Extra power one GPU draws over a window of the iteration to meet a smooth bound (modelled)."""

    start_s: Annotated[float, Ge(0)]
    """Start, seconds from the iteration start."""

    end_s: Annotated[float, Gt(0)]
    """End, seconds from the iteration start (after ``start_s``)."""

    power_w: Annotated[float, Gt(0)]
    """The filler's power over the window, on top of the planned work's."""

    def __post_init__(self) -> None:
        if not self.end_s > self.start_s:
            raise ValueError(f"a filler window must end after it starts, got [{self.start_s}, {self.end_s}]")

    @property
    def energy_j(self) -> float:
        """The filler's energy over the window."""
        return self.power_w * (self.end_s - self.start_s)


@dataclass(frozen=True)
class PlanSmoothing:
    """How a ``smooth:`` plan meets its bound: the bound, the target's filler, the filler floor's cost."""

    bound: SmoothBound
    """The bound the target point meets (the target's, typed)."""

    bin_s: Annotated[float, Gt(0)]
    """The bins the bound was met on: the iteration split into whole bins nearest the bound's resolution."""

    filler: tuple[tuple[FillerWindow, ...], ...]
    """Per pipeline rank, the target point's filler windows in time order (empty where none is needed)."""

    filler_floor_j: Annotated[float, Ge(0)]
    """Energy per pipeline iteration a filler adds to meet the same bound on stock clocks (the comparison)."""

    def __post_init__(self) -> None:
        for windows in self.filler:
            if any(later.start_s < earlier.end_s - 1e-12 for earlier, later in itertools.pairwise(windows)):
                raise ValueError("a rank's filler windows must be in time order and not overlap")

    def fit_problem(self, ranks: int, iteration_s: float) -> str | None:
        """Why the filler does not fit a plan of ``ranks`` ranks whose target iteration takes ``iteration_s``.

        It must give every rank its windows and end within the iteration; ``None`` when it fits.
        """
        if len(self.filler) != ranks:
            return f"smoothing.filler gives {len(self.filler)} ranks' windows for {ranks} ranks"
        end_s = max((window.end_s for windows in self.filler for window in windows), default=0.0)
        if end_s > iteration_s * (1 + 1e-9):
            return f"smoothing.filler ends at {end_s:g} s, after the target point's {iteration_s:g} s"
        return None

    def stage_filler_j(self, stage: int) -> float:
        """The filler energy of one rank per iteration."""
        return sum(window.energy_j for window in self.filler[stage])

    @property
    def filler_j(self) -> float:
        """The filler energy per pipeline iteration (every rank)."""
        return sum(self.stage_filler_j(stage) for stage in range(len(self.filler)))


def smoothing_cost_text(smoothing: PlanSmoothing, planned_j: float, stock_j: float) -> str:
    """The plan's cost of its smoothness against the filler floor's: "the same smoothness at X % of ...".

    Args:
        smoothing: The plan's smoothing.
        planned_j: The plan's energy per pipeline iteration, its filler included.
        stock_j: Stock clocks' energy per pipeline iteration, without filler.
    """
    extra_j, floor_j = planned_j - stock_j, smoothing.filler_floor_j
    origin = (
        f"modelled: the plan's energy over stock clocks', its {smoothing.filler_j:,.1f} J of filler "
        f"included, against {floor_j:,.1f} J of filler on stock clocks, per pipeline iteration"
    )
    if floor_j <= 0:
        return f"stock clocks already meet smooth:{smoothing.bound} without filler ({origin})"
    if extra_j <= 0:
        return (
            f"the same smoothness ({smoothing.bound}) for {-extra_j:,.1f} J less than stock clocks use "
            f"without it, where a filler floor adds {floor_j:,.1f} J ({origin})"
        )
    share = 100 * extra_j / floor_j
    return f"the same smoothness ({smoothing.bound}) at {share:.0f} % of the filler's energy ({origin})"


def filler_note(smoothing: PlanSmoothing) -> str:
    """What the runtime does with the filler, for the plan's line in the log (said once, at adoption)."""
    return (
        f"the plan's filler ({smoothing.filler_j:,.1f} J per pipeline iteration, modelled) is not executed: "
        f"its smoothness ({smoothing.bound}) is modelled, the clocks run as planned"
    )
