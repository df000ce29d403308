"""Model vs measured at stock clocks: the stock plan's prediction against what profiling measured.

The plan's baseline (``Plan.baseline``) is the simulator's iteration at stock clocks: the pipeline DAG
scheduled with the instruction times and energies *measured while profiling* at the stock clock, plus the
measured iteration tail (``sim.simulator``). The stock baseline (``baseline.json``, :class:`StockBaseline`)
is what the same profiling steps measured for the whole iteration: the iteration timer (what Megatron's
"elapsed time per iteration" times) and each GPU's energy counter. Setting one against the other checks the
simulator and the energy accounting where both are known; the issue's targets are 3 % in time and 2 % in
energy (:data:`TIME_TARGET`, :data:`ENERGY_TARGET`). On simulated GPUs both sides are modelled, so the lines
say there is nothing to check instead of setting the model against itself.

Per stage, the measured energy is the mean over the ranks of that stage (the plan counts one GPU per stage,
as ``runtime.profiling.collector.merge_rows`` does); in total, the sum over stages. The measured figures' 95 %
intervals come from the per-step samples (:func:`megatron_energy.stats.mean_interval`).

The job report prints :func:`comparison_lines` in its "model vs measured at stock clocks" section and the
session prints :func:`comparison_line` on rank 0 when the run ends.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from megatron_energy.plan import Plan
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.stats import mean_interval

TIME_TARGET = 0.03
"""Largest relative error of the modelled stock iteration time the issue accepts."""
ENERGY_TARGET = 0.02
"""Largest relative error of the modelled stock energy the issue accepts."""
TITLE = "model vs measured at stock clocks"
"""The section's title (the report's and the log line's)."""


@dataclass(frozen=True)
class Figure:
    """One figure, modelled and measured.

    Attributes:
        name: What it is, e.g. ``"iteration time"``, ``"energy, stage 0"``.
        modelled: The stock plan's prediction (seconds or joules).
        measured: What profiling measured at stock clocks.
        halfwidth: Relative half-width of the measured mean's 95 % interval (None when unknown).
        unit: ``"ms"`` (seconds shown in ms) or ``"J"``.
        target: Largest accepted relative error.
    """

    name: str
    modelled: float
    measured: float
    halfwidth: float | None
    unit: str
    target: float

    @property
    def error(self) -> float:
        """``modelled / measured - 1``."""
        return self.modelled / self.measured - 1.0

    @property
    def within_target(self) -> bool:
        """Whether the error is inside the target."""
        return abs(self.error) <= self.target

    def text(self, source: str) -> str:
        """``iteration time 1705.8 ms modelled vs 1702.1 ms measured (±1.2 %): +0.22 % (target ±3 %)``."""
        scale = 1e3 if self.unit == "ms" else 1.0
        interval = "" if self.halfwidth is None else f" (±{100 * self.halfwidth:.1f} %, 95 % CI)"
        verdict = "within" if self.within_target else "OUTSIDE"
        return (
            f"{self.name} {scale * self.modelled:.1f} {self.unit} modelled vs {scale * self.measured:.1f} "
            f"{self.unit} {source}{interval}: {100 * self.error:+.2f} % "
            f"({verdict} the ±{100 * self.target:g} % target)"
        )


@dataclass(frozen=True)
class StockComparison:
    """The stock plan against the measured stock steps.

    Attributes:
        figures: Iteration time, total energy, then each stage's energy.
        steps: Measured stock steps behind the measured figures.
        source: ``measured`` or ``modelled`` (simulated GPUs): where the "measured" side comes from.
    """

    figures: tuple[Figure, ...]
    steps: int
    source: str


def compare_stock(plan: Plan, baseline: StockBaseline) -> StockComparison | None:
    """Set the plan's stock prediction against the stock baseline.

    Args:
        plan: The plan (its ``baseline`` is the modelled stock iteration).
        baseline: The stock steps profiling measured.

    Returns:
        The comparison, or None when the baseline holds no measured time or energy. Per-stage energies are
        compared when the baseline knows each rank's stage (caches written before it did not).
    """
    if baseline.iteration_s is None or not baseline.energy_by_rank:
        return None
    stage_of = baseline.stage_by_rank
    if not stage_of and len(baseline.energy_by_rank) == plan.num_stages == 1:
        stage_of = dict.fromkeys(baseline.energy_by_rank, 0)
    energy_spread = _relative_halfwidth(baseline.step_energy_j)
    figures = [
        Figure(
            "iteration time",
            plan.baseline.iteration_time_s,
            baseline.iteration_s,
            _relative_halfwidth(baseline.step_iteration_s),
            "ms",
            TIME_TARGET,
        )
    ]
    by_stage: dict[int, list[float]] = {}
    for rank, energy_j in baseline.energy_by_rank.items():
        if rank in stage_of:
            by_stage.setdefault(stage_of[rank], []).append(energy_j)
    stages = plan.baseline.stage_energy_j
    if stages and sorted(by_stage) == list(range(len(stages))):
        measured = [statistics.fmean(by_stage[stage]) for stage in range(len(stages))]
        figures.append(
            Figure("energy, all stages", sum(stages), sum(measured), energy_spread, "J", ENERGY_TARGET)
        )
        figures += [
            Figure(f"energy, stage {stage}", stages[stage], measured[stage], None, "J", ENERGY_TARGET)
            for stage in range(len(stages))
        ]
    elif len(baseline.energy_by_rank) == plan.num_stages:  # one GPU per stage, stages unknown: total only
        total = sum(baseline.energy_by_rank.values())
        figures.append(
            Figure("energy, all stages", plan.baseline.energy_j, total, energy_spread, "J", ENERGY_TARGET)
        )
    return StockComparison(tuple(figures), baseline.steps, baseline.source)


def _relative_halfwidth(samples: tuple[float, ...]) -> float | None:
    """Half-width of the samples' mean's 95 % interval over the mean; None with fewer than two samples."""
    if len(samples) < 2:
        return None
    interval = mean_interval(samples)
    return (
        interval.halfwidth / interval.mean
        if interval.mean > 0 and math.isfinite(interval.halfwidth)
        else None
    )


def comparison_lines(comparison: StockComparison) -> list[str]:
    """The report's section: a title line, then one line per figure (one line on simulated GPUs)."""
    if comparison.source == "modelled":
        return [_not_checked()]
    return [
        f"{TITLE} (the stock plan simulated from the instruction times and energies measured while "
        f"profiling, against the whole iterations {comparison.source} over {comparison.steps} stock steps):",
        *(f"  {figure.text(comparison.source)}" for figure in comparison.figures),
    ]


def comparison_line(comparison: StockComparison) -> str:
    """One ``[energy]`` log line with every figure (on simulated GPUs, that there is nothing to check)."""
    if comparison.source == "modelled":
        return f"[energy] {_not_checked()}"
    figures = "; ".join(figure.text(comparison.source) for figure in comparison.figures)
    return f"[energy] {TITLE} ({comparison.steps} stock steps): {figures}"


def _not_checked() -> str:
    """Why simulated GPUs give no check: their stock steps are modelled too."""
    return (
        f"{TITLE}: not checked on simulated GPUs (their stock steps are modelled too, so the figures would "
        "set the model against itself); run on GPUs to check the model"
    )
