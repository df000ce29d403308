"""The power budget at run time (``--energy-target power:W[,peak:P]``): measured power against it.

Two jobs, both pure bookkeeping:

- :func:`power_budget_part`: the energy log's figure, the measured average power per GPU over the log
  window with its 95 % interval (``stats.mean_interval`` over counter-resolved blocks of iterations, as the
  other figures), next to the budget, and whether the interval lies above it;
- :func:`allowed_power_w`: what one rank may draw before the safety net counts a violation. The budget is an
  average over the job's GPUs, but ranks legitimately differ (the first and last stages carry more work),
  so each rank's allowance is the budget scaled by its plan's predicted power over the plan's predicted
  average, as the time allowance scales the stock time by the plan's predicted slowdown. A plan that fits
  the budget therefore gives every rank an allowance at or above its own predicted power, and a sustained
  overshoot (``SafetyNet.observe`` with a power) reverts the rank to stock clocks like a slowdown.
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron_energy.plan import PlanPoint
from megatron_energy.runtime.energy_log.energy_line import JobInterval
from megatron_energy.stats import MeanInterval, Source, block_means, iterations_per_sample, mean_interval
from megatron_energy.target import EnergyTarget


def measured_power_w(
    window_j: Sequence[float], window_s: Sequence[float], num_gpus: int, iterations_per_block: int
) -> MeanInterval | None:
    """Mean power per GPU over a window, with its 95 % interval; ``None`` for an empty window.

    A window shorter than one block gives its mean with an infinite interval (one sample).

    Args:
        window_j: Per-iteration energy summed over the job's GPUs.
        window_s: Per-iteration time (the slowest rank's).
        num_gpus: GPUs the energies are summed over.
        iterations_per_block: Consecutive iterations per sample, so each sample spans enough counter updates.
    """
    if not window_j or num_gpus <= 0:
        return None
    samples = [energy / (num_gpus * time) for energy, time in zip(window_j, window_s, strict=True)]
    blocks = block_means(samples, iterations_per_block)
    # a window shorter than one block still has a mean, with no interval (n=1)
    return mean_interval(blocks or [sum(samples) / len(samples)])


def power_budget_part(
    power: MeanInterval, target: EnergyTarget, source: Source
) -> tuple[str, dict[str, float]]:
    """The log line's power figure and its scalars.

    Args:
        power: Measured (or, on simulated GPUs, modelled) mean power per GPU with its interval.
        target: The ``power`` target.
        source: ``measured`` or ``modelled``.

    Returns:
        ``"power <source>: 431.2 W/GPU ±3.1 (95 %, n=12) vs budget 450 W: within"`` and the scalars.
    """
    if power.high <= target.power_w:
        verdict = "within"
    elif power.low > target.power_w:
        verdict = "OVER"
    else:
        verdict = "within noise of it"
    spread = "n=1" if power.n < 2 else f"±{power.halfwidth:.1f} (95 %, n={power.n})"
    part = f"power {source}: {power.mean:.1f} W/GPU {spread} vs budget {target.power_w:g} W: {verdict}"
    scalars = {
        "energy/power_w_per_gpu": power.mean,
        "energy/power_w_per_gpu_halfwidth": power.halfwidth,
        "energy/power_budget_w": target.power_w,
    }
    return part, scalars


def allowed_power_w(target: EnergyTarget, point: PlanPoint, stage: int) -> float | None:
    """The power this rank may draw under ``point`` before a step violates; ``None`` without a budget.

    Args:
        target: The job's target; only ``power`` targets have an allowance.
        point: The plan point running.
        stage: This rank's pipeline stage.
    """
    if target.kind != "power":
        return None
    gpus = len(point.ranks)
    predicted_average_w = point.energy_j / (gpus * point.iteration_time_s)
    predicted_rank_w = point.ranks[stage].energy_j / point.iteration_time_s
    return target.power_w * predicted_rank_w / predicted_average_w


def with_power_budget(
    line: str,
    scalars: dict[str, float],
    job: JobInterval,
    target: EnergyTarget,
    counter_period_s: float,
    source: Source,
) -> tuple[str, dict[str, float]]:
    """The energy log line and scalars with the power-budget figure appended (unchanged without a window).

    Args:
        line: The energy line (``runtime.energy_log.energy_line.format_energy_line``).
        scalars: Its scalars.
        job: The interval over every GPU of the job, as the line was made from.
        target: The ``power`` target.
        counter_period_s: The energy counter's period (0: exact energies).
        source: ``measured`` or ``modelled``.
    """
    if not job.window_j:
        return line, scalars
    block = iterations_per_sample(sum(job.window_s) / len(job.window_s), counter_period_s)
    power = measured_power_w(job.window_j, job.window_s, job.gpus, block)
    if power is None:
        return line, scalars
    part, extra = power_budget_part(power, target, source)
    return f"{line} | {part}", scalars | extra
