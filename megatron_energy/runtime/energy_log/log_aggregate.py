"""The energy line's job-wide figures from two fixed-size vectors per rank, reduced over the job's groups.

At a log interval each rank turns its figures (``runtime.energy_log.energy_line.StageEnergy``) into a vector
for a sum and one for a max (:func:`interval_vectors`), of a size set by the pipeline's stages and the
window's length (``runtime.energy_log.log_window.WINDOW_ITERS``), never by the number of ranks:

- summed: the interval's mean energy in its stage's slot (so each slot sums the stage's GPUs), the
  prediction and a count of the GPUs that have one, and per window slot (one per iteration up to the line's
  own) the iteration's energy and a count of the GPUs whose window holds it, and one GPU;
- maxed: the interval's mean iteration time and, per window slot, the iteration's time.

Reduced over every rank (``runtime.control_plane.group_chain.reduce_over``), they give every rank the same
:class:`JobInterval` (:func:`job_interval`): the window holds the iterations every GPU's window holds, with
energy summed over the GPUs and the slowest GPU's time, as the stock baseline does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from megatron_energy.runtime.energy_log.energy_line import JobInterval, StageEnergy
from megatron_energy.runtime.energy_log.log_window import WINDOW_ITERS


def interval_vectors(rank: StageEnergy, stages: int, last_step: int) -> tuple[list[float], list[float]]:
    """This rank's vectors (for a max, for a sum) at the interval that ends at ``last_step`` (0-based)."""
    window = rank.window
    energy_j, counted = [0.0] * WINDOW_ITERS, [0.0] * WINDOW_ITERS
    time_s = [-math.inf] * WINDOW_ITERS
    if window.first_step >= 0:
        for offset, (joules, seconds) in enumerate(zip(window.energy_j, window.iteration_s, strict=True)):
            slot = WINDOW_ITERS - 1 - (last_step - window.first_step - offset)
            if 0 <= slot < WINDOW_ITERS:
                energy_j[slot], time_s[slot], counted[slot] = joules, seconds, 1.0
    stage_j = [0.0] * stages
    stage_j[rank.stage] = rank.measured_j_per_iter
    predicted = rank.predicted_j_per_iter
    sums = [
        *stage_j,
        predicted or 0.0,
        float(predicted is not None),
        *energy_j,
        *counted,
        rank.run_energy_j,
        1.0,
    ]
    return [rank.iteration_s, *time_s, float(rank.run_steps)], sums


def job_interval(maxima: Sequence[float], sums: Sequence[float], stages: int) -> JobInterval:
    """The job's interval from the reduced vectors of :func:`interval_vectors`."""
    stage_j, (predicted_j, predicting) = sums[:stages], sums[stages : stages + 2]
    energy_j = sums[stages + 2 : stages + 2 + WINDOW_ITERS]
    counted = sums[stages + 2 + WINDOW_ITERS : stages + 2 + 2 * WINDOW_ITERS]
    gpus = int(sums[-1])
    held = [slot for slot in range(WINDOW_ITERS) if counted[slot] == gpus]
    return JobInterval(
        stage_j=tuple(stage_j),
        predicted_j=predicted_j if predicting == gpus else None,
        iteration_s=maxima[0],
        window_j=tuple(energy_j[slot] for slot in held),
        window_s=tuple(maxima[1 + slot] for slot in held),
        gpus=gpus,
        run_j=sums[-2],
        run_steps=int(maxima[-1]),
    )
