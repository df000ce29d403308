"""One rank's part of the energy log: its phase window, the job's reductions, the line, scalars and records.

Every ``log_interval`` steps each rank puts its interval means and its window of the current phase
(``runtime.energy_log.log_window``) into two fixed-size vectors, reduced over the job's pipeline, tensor and
data-parallel groups (``runtime.energy_log.log_aggregate``,
``runtime.control_plane.group_chain.reduction_stages``: a sum and a max in flight together over each group,
no gather, no broadcast): every rank then holds the job's interval. Rank 0 formats the line
(``runtime.energy_log.energy_line``), prints it and appends the record to ``--energy-log-file``; a rank with
metric writers (Megatron keeps its TensorBoard and W&B writers on the last rank) formats the same scalars
from the same figures and writes them, so nothing is sent to it but the reductions' results.

How the reductions run depends on what they cost (``runtime.control_plane.exchange_period``, modelled): when
the chain over the three groups costs at most one exchange's share of the control plane's budget per step
(``EXCHANGE_BUDGET_S``, 0.5 ms), it runs at the interval's end and the line follows at once. On a larger job
(e.g. 16,384 ranks: 22 ms) the training thread never waits for it: the chain runs as a staged exchange
(``runtime.control_plane.staged_exchange``), one link a step, begun at an interval's end at most every K
steps, and the line is printed when its last link completes (a few steps later, naming the iteration its
interval ended at). An interval's end that comes before K steps have passed begins nothing: its steps join
the next interval, and that line names the iterations it covers. No collective runs at close: rank 0 says
which iterations no line covered, then prints the run's totals over the iterations the lines covered and
appends their record (``runtime.energy_log.run_totals``: each line's reductions carry the energy of every
step since the previous one, so the totals need no collective of their own).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from megatron_energy.plan_band import SavingBand
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import GROUPS, RankComms
from megatron_energy.runtime.control_plane.exchange_period import (
    EXCHANGE_BUDGET_S,
    exchange_cost_s,
    exchange_period,
)
from megatron_energy.runtime.control_plane.group_chain import reduction_stages, run_at_once
from megatron_energy.runtime.control_plane.staged_exchange import StagedExchange, Stages
from megatron_energy.runtime.energy_log.energy_line import (
    EnergyRecord,
    StageEnergy,
    StockSamples,
    append_json_line,
    append_record,
    format_energy_line,
    publish,
    write_scalars,
)
from megatron_energy.runtime.energy_log.log_aggregate import interval_vectors, job_interval
from megatron_energy.runtime.energy_log.log_window import PhaseWindow
from megatron_energy.runtime.energy_log.power_cap_record import PowerCapRecord
from megatron_energy.runtime.energy_log.power_record import PowerRecord
from megatron_energy.runtime.energy_log.run_totals import RunTally, RunTotals, tokens_per_iteration
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.runtime.running.power_watch import with_power_budget
from megatron_energy.runtime.session_phase import SessionPhase
from megatron_energy.runtime.step_figures import StepFigures
from megatron_energy.stats import Source
from megatron_energy.target import EnergyTarget

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _IntervalEnd:
    """What a line says besides the job's figures, taken when its interval ended."""

    first_iteration: int
    """The first iteration the line covers, 1-based."""
    iteration: int
    """The last, 1-based as in Megatron's log."""
    phase: str
    """What ran."""
    stock: StockSamples | None
    """The stock baseline to compare with."""
    period_s: float
    """The energy counter's period (0: exact energies)."""


@dataclass(frozen=True)
class _ReducedInterval:
    """An interval's end and the job's reduced vectors for it."""

    end: _IntervalEnd
    maxima: list[float]
    sums: list[float]


class EnergyLogger:
    """The energy log of one rank (see the module docstring).

    Args:
        context: This rank's place in the job (log interval, sinks, ranks).
        comms: Collectives of the job.
        source: ``measured`` or ``modelled``: where the figures come from.
        counter_period_s: The energy counter's period, for figures read from it.

    Attributes:
        log_file: ``--energy-log-file``; ``None`` (none, or after a write failed).
        power_target: ``--energy-target`` when it is a power budget: the line then shows the measured power
            per GPU against it (``runtime.running.power_watch``); ``None`` otherwise.
        plan_band: The running plan's saving band around zero (``plan_outcome.run_band``), set when a plan
            takes effect: a modelled energy change of the planned phase carries it around its own value.
        job: The job's fingerprint, written into every record (``EnergyRecord.job``).
        grid_gco2_per_kwh: ``--energy-grid-gco2-per-kwh``: the run's totals then state their CO₂.
        tally: Rank 0's running sums of the lines' job-wide figures, for the run's totals.
    """

    def __init__(
        self,
        context: JobContext,
        comms: RankComms,
        source: Source,
        counter_period_s: float,
    ) -> None:
        self.context = context
        self.comms = comms
        self.source: Source = source
        self.counter_period_s = counter_period_s
        self.window = PhaseWindow()
        self.log_file: Path | None = None
        self.power_target: EnergyTarget | None = None
        self.plan_band: SavingBand | None = None
        self.job = ""
        self.grid_gco2_per_kwh: float | None = None
        self.tally = RunTally()
        self._run_j = 0.0  # this rank's energy over every step since the previous line (any phase)
        self._run_steps = 0
        sizes = [comms.size(group) for group in GROUPS]
        self._staged: StagedExchange[_ReducedInterval] | None = None
        """Where the chain costs more than its share of the budget: the staged exchange that runs it."""
        if exchange_cost_s(sizes) > EXCHANGE_BUDGET_S:
            self._staged = StagedExchange(exchange_period(sizes, None))
        self._first_step: int | None = None  # the first step no line covers yet
        self._in_flight_first = 0  # the first step of the interval whose exchange is in flight
        self._last_step = -1

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
        self._run_j += figures.energy_j
        self._run_steps += 1
        self._last_step = step
        if self._first_step is None:
            self._first_step = step
        due = (step + 1) % self.context.log_interval == 0
        if self._staged is None:
            if due:
                self._log(run_at_once(self._reduction(step, phase, predicted_j, baseline, figures.exact)))
            return
        begin = (lambda: self._reduction(step, phase, predicted_j, baseline, figures.exact)) if due else None
        reduced = self._staged.step(begin)
        if reduced is not None:
            self._log(reduced)

    def add_unlogged(self, step: int, phase: str, figures: StepFigures) -> None:
        """Record a step no line will cover (flushed at close or before a suspension; no collective runs)."""
        self.window.add(step, phase, figures)
        self._last_step = max(self._last_step, step)

    def close(self) -> None:
        """At the end of the run (no collective may start): rank 0's last words on the energy log.

        It names the iterations no line covered, then prints the run's totals and appends their record.
        """
        if self.context.global_rank != 0:
            return
        if self._staged is not None:
            first = self._in_flight_first if self._staged.in_flight else self._first_step
            if first is not None and first <= self._last_step:
                logger.info(
                    f"[energy] iterations {first + 1}-{self._last_step + 1}: no job-wide energy line (their "
                    "reductions had not completed when the run ended, and no collective runs at close)"
                )
        shape = self.context.shape
        tokens = (
            None
            if shape is None
            else tokens_per_iteration(
                shape.micro_batch_size,
                shape.seq_length,
                self.context.num_microbatches,
                self.context.data_parallel_size,
            )
        )
        totals = self.tally.totals(
            self.source, tokens, self.grid_gco2_per_kwh, self.context.megatron_log_energy, self.job
        )
        if totals is None:
            return
        logger.info(totals.line())
        self.write_record(totals)
        after = totals.last_iteration + 1
        if self._staged is None and after <= self._last_step + 1:
            logger.info(
                f"[energy] run totals leave out iterations {after}-{self._last_step + 1}: they ended after "
                "the last energy log line"
            )

    def _reduction(
        self, step: int, phase: str, predicted_j: float | None, baseline: StockBaseline, exact: bool
    ) -> Stages[_ReducedInterval]:
        """The interval that ends at ``step``: this rank's vectors, reduced over the job's groups."""
        steps = self.window.take_interval()
        first = step if self._first_step is None else self._first_step
        self._in_flight_first, self._first_step = first, None
        mine = StageEnergy(
            stage=self.context.pipeline_rank,
            measured_j_per_iter=sum(s.energy_j for s in steps) / len(steps),
            predicted_j_per_iter=predicted_j,
            iteration_s=sum(s.iteration_s for s in steps) / len(steps),
            window=self.window.rank_window(),
            run_energy_j=self._run_j,
            run_steps=self._run_steps,
        )
        self._run_j, self._run_steps = 0.0, 0
        end = _IntervalEnd(first + 1, step + 1, phase, self._stock(baseline, exact), self._period(exact))
        stages = self.context.pipeline_size
        maxima, sums = yield from reduction_stages(self.comms, GROUPS, *interval_vectors(mine, stages, step))
        return _ReducedInterval(end, maxima, sums)

    def _log(self, reduced: _ReducedInterval) -> None:
        """Rank 0 prints the line and writes the record; a rank with metric writers writes the scalars."""
        root = self.context.global_rank == 0
        if not root and not self.context.log_sinks:
            return
        end = reduced.end
        job = job_interval(reduced.maxima, reduced.sums, self.context.pipeline_size)
        merged = end.first_iteration < end.iteration - self.context.log_interval + 1
        line, scalars = format_energy_line(
            end.iteration,
            job,
            self.source,
            end.phase,
            end.stock,
            end.first_iteration if merged else None,
            self.plan_band if end.phase == SessionPhase.PLANNED else None,
        )
        if self.power_target is not None:
            target = self.power_target
            line, scalars = with_power_budget(line, scalars, job, target, end.period_s, self.source)
        if not root:
            write_scalars(scalars, end.iteration, self.context.log_sinks)
            return
        publish(line, scalars, end.iteration, self.context.log_sinks)
        self.tally.add(job, end.first_iteration, end.iteration, end.stock)
        self.write_record(EnergyRecord(end.iteration, end.phase, self.source, scalars, self.job))

    def _period(self, exact: bool) -> float:
        """The energy counter's period; 0 when the energies are exact (simulated GPUs)."""
        return 0.0 if exact else self.counter_period_s

    def _stock(self, baseline: StockBaseline, exact: bool) -> StockSamples | None:
        """The stock baseline's iterations, as the log compares with them; ``None`` when it has none."""
        if not baseline.steps:
            return None
        period_s = 0.0 if exact else self.counter_period_s
        return StockSamples(baseline.step_energy_j, baseline.step_iteration_s, period_s)

    def write_record(self, record: EnergyRecord | PowerCapRecord | RunTotals | PowerRecord) -> None:
        """Append the record to ``--energy-log-file``; a file that cannot be written is reported once."""
        if self.log_file is None:
            return
        try:
            if isinstance(record, EnergyRecord):
                append_record(self.log_file, record)
            else:
                append_json_line(self.log_file, record.to_json())
        except OSError as problem:
            logger.info(f"[energy] cannot append to {self.log_file} ({problem}); no more --energy-log-file")
            self.log_file = None
