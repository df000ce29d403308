"""The stock plan's prediction against Megatron's own log of the same run's stock iterations.

``runtime.energy_log.stock_check`` compares the plan with the stock steps our session timed and metered. This
module makes the same comparison against the figures Megatron itself printed for those iterations
(``--log-interval 1``; ``elapsed time per iteration (ms)`` from Megatron's timer, ``energy per GPU
(J/iter/GPU)`` from its ``--log-energy`` NVML reading), read back from the run's output: an outside check of
our timer and meter.

The stock iterations are those our energy log labels ``profiling`` (every profiled clock is the stock clock
in a dry run or when only the stock clock is profiled), after the first ``settle`` (warm-up: allocator,
cuBLAS autotuning, the first counter read). Megatron's energy is per GPU; the plan's is per pipeline
iteration, one GPU per stage, so Megatron's figure is multiplied by the number of stages (exact with one GPU
per stage; with data- or tensor-parallel peers Megatron averages over more GPUs than the plan counts).
"""

from __future__ import annotations

from megatron_energy.megatron.training_log import parse_iteration_lines
from megatron_energy.plan import Plan
from megatron_energy.runtime.energy_log.energy_line import logged_phases
from megatron_energy.runtime.energy_log.stock_check import ENERGY_TARGET, TIME_TARGET, Figure
from megatron_energy.stats import mean_interval

STOCK_PHASE = "profiling"
"""Our energy log's label of the stock iterations in a run whose profiling measures only the stock clock."""


def megatron_stock_lines(output: str, plan: Plan, settle: int = 3) -> list[str]:
    """The plan's stock prediction against Megatron's logged stock iterations, one line per figure.

    Args:
        output: The training run's output (Megatron's lines and our ``[energy]`` lines).
        plan: The plan the run made (its baseline is the modelled stock iteration).
        settle: Leading iterations left out (warm-up).

    Returns:
        A title line and the time and energy lines; one line saying why when nothing can be compared.
    """
    phases = logged_phases(output)
    stock = [
        line
        for line in parse_iteration_lines(output)
        if line.iteration > settle and phases.get(line.iteration) == STOCK_PHASE
    ]
    if len(stock) < 2:
        return [
            f"stock plan vs Megatron's own log: {len(stock)} stock iteration(s) past the first {settle} "
            "(needs --log-interval 1 and a run that profiles the stock clock)"
        ]
    times_s = [line.elapsed_ms / 1e3 for line in stock]
    figures = [_figure("iteration time", plan.baseline.iteration_time_s, times_s, "ms", TIME_TARGET)]
    energies = [line.energy_j for line in stock if line.energy_j is not None]
    if len(energies) == len(stock):
        per_pipeline = [plan.num_stages * energy_j for energy_j in energies]
        figures.append(
            _figure("energy, all stages", plan.baseline.energy_j, per_pipeline, "J", ENERGY_TARGET)
        )
    title = (
        f"stock plan vs Megatron's own log (measured by Megatron's timer and --log-energy, mean of "
        f"{len(stock)} stock iterations {stock[0].iteration}-{stock[-1].iteration}; energy per GPU x "
        f"{plan.num_stages} stage(s)):"
    )
    return [title, *(f"  {figure.text('measured')}" for figure in figures)]


def _figure(name: str, modelled: float, samples: list[float], unit: str, target: float) -> Figure:
    """A modelled figure against the mean of measured samples, with the mean's relative 95 % half-width."""
    interval = mean_interval(samples)
    return Figure(name, modelled, interval.mean, interval.halfwidth / interval.mean, unit, target)
