"""One step's figures on one rank: the whole iteration's time and energy, and the part outside the pipeline.

An iteration runs from the end of one schedule to the end of the next: what happens between the two
schedules (gradient sync after the last backward, optimizer step, data loading, logging) and the schedule's
pipeline span. Megatron's iteration time and the energy counter see the whole of it, so the session logs,
compares and plans with the whole of it; the *outside* part is what the pipeline instructions and their
waits do not account for (``StepTiming.outside_s`` and its energy).

Energy comes from the timer when it knows it exactly (simulated GPUs), else from the energy meter: one lap
per step covers the whole iteration; while profiling the session also laps at the step's start, after the
device finished (``InstructionTimer.wait_for_device``), so the energy outside the pipeline is a window of
its own.

In the run phase a real GPU's timing arrives one step after the step ended (``runtime.cuda_timer``): the
session notes what it knows at the step's end (``SealedStep``: the counter laps, the phase, the plan's
prediction) and puts the figures together when the timing comes.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megatron_energy.dvfs.meter import EnergyWindow
from megatron_energy.runtime.timing import StepTiming

if TYPE_CHECKING:  # planning imports this module (through profiling)
    from megatron_energy.runtime.profiling.stock_baseline import StockBaseline


@dataclass(frozen=True)
class StepFigures:
    """What one finished step measured on this rank (``timing.source`` says measured or modelled)."""

    timing: StepTiming
    """The step's instruction samples and spans."""

    iteration_s: float
    """The whole iteration (``timing.cycle_s``); the pipeline span when that is unknown (a first step)."""

    energy_j: float
    """This GPU's energy over the whole iteration (NaN without an energy counter)."""

    outside_j: float | None
    """This GPU's energy between the two schedules, when it was measured apart (profiling) or is known."""

    exact: bool
    """Whether the energies are the timer's exact ones (simulated GPUs) rather than energy counter reads."""

    @property
    def outside_s(self) -> float:
        """The part of the iteration outside the replica's pipeline span."""
        return self.timing.outside_s

    @property
    def pipeline_energy_j(self) -> float:
        """This GPU's energy over the step's pipeline span (the whole iteration's less the outside part)."""
        return self.energy_j - (self.outside_j or 0.0)


def step_figures(
    timing: StepTiming, outside: EnergyWindow | None, rest: EnergyWindow | None, lapped_at_start: bool
) -> StepFigures:
    """Put one step's figures together from the timer and the meter's laps.

    Args:
        timing: The step's timing.
        outside: The meter's lap at the step's start (from the previous step's end), if one was taken.
        rest: The meter's lap at the step's end: the pipeline span when the step lapped at its start too,
            else the whole iteration.
        lapped_at_start: Whether the session lapped at the step's start (profiling).

    Returns:
        The figures; energies from the timer when it knows them, else from the laps.
    """
    iteration_s = timing.intrinsic_s if timing.cycle_s is None else timing.cycle_s
    if timing.energy_j is not None:
        outside_j = timing.outside_energy_j or 0.0
        return StepFigures(timing, iteration_s, timing.energy_j + outside_j, outside_j, exact=True)
    rest_j = math.nan if rest is None else rest.energy_j
    if not lapped_at_start:
        return StepFigures(timing, iteration_s, rest_j, None, exact=False)
    outside_j = math.nan if outside is None else outside.energy_j
    return StepFigures(timing, iteration_s, outside_j + rest_j, outside_j, exact=False)


@dataclass(frozen=True)
class SealedStep:
    """What the session noted at a step's end, kept until the timer returns the step's timing."""

    step: int
    """The step (0-based)."""

    phase: str
    """The phase the step ran in."""

    predicted_j: float | None
    """The running plan point's energy prediction for this rank's GPU, if a plan ran."""

    baseline: StockBaseline
    """The stock baseline the step is compared with (empty while profiling)."""

    outside: EnergyWindow | None
    """The meter's lap at the step's start, if one was taken (profiling)."""

    rest: Future[EnergyWindow | None]
    """The meter's lap at the step's end (read off the training thread:
    ``runtime.energy_log.meter_thread``)."""

    lapped_at_start: bool
    """Whether the session lapped at the step's start."""

    def figures(self, timing: StepTiming) -> StepFigures:
        """The step's figures, once its timing is known (waits for the lap's read if it is still running)."""
        return step_figures(timing, self.outside, self.rest.result(), self.lapped_at_start)
