"""The energy log's last words at a session's close: the plugin's own host time, and model vs measured.

Every rank logs its own host time in the hooks (``runtime.energy_log.host_cost``); rank 0 of a job that ran
a plan then logs the stock plan's prediction against the measured stock steps
(``runtime.energy_log.stock_check``): the run's last word on how well the model matched. A closing line never
fails the job.
"""

from __future__ import annotations

import logging

from megatron_energy.plan import Plan
from megatron_energy.runtime.energy_log.host_cost import HostCost
from megatron_energy.runtime.energy_log.stock_check import TITLE, compare_stock, comparison_line
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline

logger = logging.getLogger(__name__)


def log_closing_lines(
    rank: int, host_cost: HostCost, plan: Plan | None, baseline: StockBaseline, measured: bool
) -> None:
    """Log this rank's host-time line and, on rank 0 after a plan ran, the stock check's line.

    Args:
        rank: This rank's global rank.
        host_cost: The hooks' host time on this rank.
        plan: The plan every rank adopted, if any.
        baseline: The measured stock baseline.
        measured: Whether the timings are measured (the host time's share of the iteration is given only
            against a measured iteration, never against a modelled one).
    """
    host_line = host_cost.summary(rank, baseline.iteration_s if measured else None)
    if host_line is not None:
        logger.info(host_line)
    if rank != 0 or plan is None:
        return
    try:
        comparison = compare_stock(plan, baseline)
    except (ValueError, ZeroDivisionError) as problem:
        logger.info(f"[energy] {TITLE}: not computed ({problem})")
        return
    if comparison is not None:
        logger.info(comparison_line(comparison))
