"""One rank's part of the energy log: its phase window, the job's reductions, the line, scalars and records.

Every ``log_interval`` steps each rank puts its interval means and its window of the current phase
(``runtime.log_window``) into two fixed-size vectors, reduced over the job's pipeline, tensor and
data-parallel groups (``runtime.log_aggregate``, ``runtime.group_chain.reduce_over``: a sum and a max in
flight together over each group, no gather, no broadcast): every rank then holds the job's interval. Rank 0
formats the line (``runtime.energy_log``), prints it and appends the record to ``--energy-log-file``; a rank
with metric writers (Megatron keeps its TensorBoard and W&B writers on the last rank) formats the same
scalars from the same figures and writes them, so nothing is sent to it but the reductions' results.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from megatron_energy.config import EnergyTarget
from megatron_energy.runtime.comms import GROUPS, RankComms
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.energy_log import (
    EnergyRecord,
    StageEnergy,
    StockSamples,
    append_record,
    format_energy_line,
    publish,
    write_scalars,
)
from megatron_energy.runtime.group_chain import reduce_over
from megatron_energy.runtime.log_aggregate import interval_vectors, job_interval
from megatron_energy.runtime.log_window import PhaseWindow
from megatron_energy.runtime.planning import StockBaseline
from megatron_energy.runtime.power_budget import with_power_budget
from megatron_energy.runtime.step_figures import StepFigures
from megatron_energy.stats import Source


class EnergyLogger:
    """The energy log of one rank (see the module docstring).

    Args:
        context: This rank's place in the job (log interval, sinks, ranks).
        comms: Collectives of the job.
        source: ``measured`` or ``modelled``: where the figures come from.
        counter_period_s: The energy counter's period, for figures read from it.
        printer: Where the line goes.

    Attributes:
        log_file: ``--energy-log-file``; ``None`` (none, or after a write failed).
        power_target: ``--energy-target`` when it is a power budget: the line then shows the measured power
            per GPU against it (``runtime.power_budget``); ``None`` otherwise.
        job: The job's fingerprint, written into every record (``EnergyRecord.job``).
    """

    def __init__(
        self,
        context: JobContext,
        comms: RankComms,
        source: Source,
        counter_period_s: float,
        printer: Callable[[str], Any],
    ) -> None:
        self.context = context
        self.comms = comms
        self.source: Source = source
        self.counter_period_s = counter_period_s
        self.printer = printer
        self.window = PhaseWindow()
        self.log_file: Path | None = None
        self.power_target: EnergyTarget | None = None
        self.job = ""

    def add(
        self,
        step: int,
        phase: str,
        figures: StepFigures,
        predicted_j: float | None,
        baseline: StockBaseline,
    ) -> None:
        """Record a finished step; at the end of a log interval, log it (every rank joins the reductions).

        Args:
            step: The step (0-based).
            phase: What ran in it.
            figures: What it measured on this rank.
            predicted_j: The running plan point's prediction for this rank's GPU, if a plan ran.
            baseline: The stock baseline to compare with (empty: no comparison, as while profiling).
        """
        self.window.add(step, phase, figures)
        if (step + 1) % self.context.log_interval != 0:
            return
        steps = self.window.take_interval()
        mine = StageEnergy(
            stage=self.context.pipeline_rank,
            measured_j_per_iter=sum(s.energy_j for s in steps) / len(steps),
            predicted_j_per_iter=predicted_j,
            iteration_s=sum(s.iteration_s for s in steps) / len(steps),
            window=self.window.rank_window(),
        )
        iteration = step + 1  # 1-based, as Megatron counts iterations in its log and scalars
        stages = self.context.pipeline_size
        maxima, sums = reduce_over(self.comms, GROUPS, *interval_vectors(mine, stages, step))
        root = self.context.global_rank == 0
        if not root and not self.context.log_sinks:
            return
        job = job_interval(maxima, sums, stages)
        line, scalars = format_energy_line(
            iteration, job, self.source, phase, self._stock(baseline, figures.exact)
        )
        if self.power_target is not None:
            line, scalars = with_power_budget(
                line, scalars, job, self.power_target, self._period(figures.exact), self.source
            )
        if not root:
            write_scalars(scalars, iteration, self.context.log_sinks)
            return
        publish(line, scalars, iteration, self.context.log_sinks, self.printer)
        self._write_record(EnergyRecord(iteration, phase, self.source, scalars, self.job))

    def _period(self, exact: bool) -> float:
        """The energy counter's period; 0 when the energies are exact (simulated GPUs)."""
        return 0.0 if exact else self.counter_period_s

    def _stock(self, baseline: StockBaseline, exact: bool) -> StockSamples | None:
        """The stock baseline's iterations, as the log compares with them; ``None`` when it has none."""
        if not baseline.steps:
            return None
        period_s = 0.0 if exact else self.counter_period_s
        return StockSamples(baseline.step_energy_j, baseline.step_iteration_s, period_s)

    def _write_record(self, record: EnergyRecord) -> None:
        """Append the record to ``--energy-log-file``; a file that cannot be written is reported once."""
        if self.log_file is None:
            return
        try:
            append_record(self.log_file, record)
        except OSError as problem:
            self.printer(f"[energy] cannot append to {self.log_file} ({problem}); no more --energy-log-file")
            self.log_file = None
