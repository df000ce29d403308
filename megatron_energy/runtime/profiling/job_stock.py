"""The job's stock baseline steps over every GPU, from fixed-size reductions rather than a world gather.

The log compares each window of the job's iterations (energy summed over every GPU, the slowest GPU's time)
with the stock baseline's steps measured the same way (``runtime.profiling.stock_baseline.StockBaseline``).
Each rank puts its baseline steps (``runtime.profiling.collector.baseline_records``) into two vectors of the
agreed number of baseline steps (:func:`stock_vectors`): times and the negated count into a max, energies
into a sum; the reductions over the job's groups (``runtime.control_plane.group_chain``) give every rank the
job's steps (:func:`job_stock`): per step, the slowest rank's time and the energy of every rank, over the
steps every rank with baseline steps measured, and the slowest rank's mean time. The vectors' size depends on
the baseline's length, never on the number of ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.runtime.profiling.collector import StepRecord, baseline_records, mean_record


@dataclass(frozen=True)
class JobStock:
    """The job's stock baseline steps over every GPU (measured, or modelled on simulated GPUs)."""

    iteration_s: float | None = None
    """The slowest rank's mean iteration time over its baseline steps; ``None`` if no rank measured one."""
    step_iteration_s: tuple[float, ...] = ()
    """Per baseline step, the slowest rank's iteration time."""
    step_energy_j: tuple[float, ...] = ()
    """Per baseline step, the energy of every GPU of the job."""


def stock_vectors(records: Sequence[StepRecord], length: int) -> tuple[list[float], list[float]]:
    """This rank's part: ``[mean time, time per step..., -steps]`` for a max and energies for a sum.

    Args:
        records: This rank's stock steps (both kinds: only the baseline steps count).
        length: The agreed number of baseline steps (the same on every rank).
    """
    steps = baseline_records(records)[:length]
    padding = [0.0] * (length - len(steps))
    mean_s = mean_record(steps).iteration_s if steps else -math.inf
    counted = len(steps) if steps else length  # a rank without baseline steps leaves the others' be
    maxima = [mean_s, *(step.iteration_s for step in steps), *padding, -float(counted)]
    return maxima, [*(step.energy_j for step in steps), *padding]


def job_stock(maxima: Sequence[float], sums: Sequence[float]) -> JobStock:
    """The job's baseline steps from the reduced vectors of :func:`stock_vectors`."""
    mean_s, times, negated_steps = maxima[0], maxima[1:-1], maxima[-1]
    measured = int(-negated_steps)  # the fewest any rank with baseline steps measured
    return JobStock(
        iteration_s=mean_s if math.isfinite(mean_s) else None,
        step_iteration_s=tuple(times[:measured]),
        step_energy_j=tuple(sums[:measured]),
    )
