"""The one table ``megatron-energy demo`` ends with: stock clocks against the plan, as run and as predicted.

Stock figures are the job's measured stock-clock steps while profiling (``baseline.json`` of the job
folder); planned figures are the iterations that ran the target plan, from the energy log the ranks wrote
(``--energy-log-file``, one record per iteration), less the first: it settles, starting from whatever clock
was in effect before (the last profiled clock), as profiling leaves out each clock's settling step. The
prediction is the plan file's. The relative change of
the run's figures comes from :func:`megatron_energy.stats.relative_change` when both sides have two samples
or more. On simulated GPUs every figure is modelled, and the labels say so: the run's energy change then
carries the plan's saving band too (``plan_outcome.run_band``: its extent over the GPU spec's ranges, around
the run's change), after its statistical interval, each in its own notation.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from megatron_energy.energy_dir import JobFiles
from megatron_energy.errors import EnergyValueError
from megatron_energy.plan import Plan
from megatron_energy.plan_file import load_plan
from megatron_energy.plan_outcome import band_ends, change_text, run_band, saving_text
from megatron_energy.report.tables import ComparisonRow, comparison_table
from megatron_energy.runtime.energy_log.energy_line import EnergyRecord, read_job_records
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.stats import relative_change


class SummaryError(EnergyValueError):
    """The run left nothing to compare; the message says why."""


@dataclass(frozen=True)
class JobFigures:
    """Per-iteration figures of the whole job."""

    time_s: tuple[float, ...]
    """Iteration time (the slowest rank's)."""

    energy_j: tuple[float, ...]
    """Energy of every GPU of the job."""


@dataclass(frozen=True)
class DemoSummary:
    """What the demo's table shows."""

    stock: JobFigures
    """The measured stock-clock steps while profiling."""

    planned: JobFigures
    """The iterations that ran the target plan, the settling one left out."""

    settling: EnergyRecord
    """The first iteration under the plan, left out of ``planned``."""

    plan: Plan
    """The plan file that ran."""

    source: str
    """``measured`` or ``modelled``: where the run's figures come from."""


def load_summary(job_folder: Path, log_file: Path, log_start_byte: int = 0) -> DemoSummary:
    """Read the job's baseline and plan and the run's energy log.

    Args:
        job_folder: ``<energy dir>/<fingerprint>`` of the job that ran.
        log_file: The ``--energy-log-file`` the ranks wrote (one record per iteration).
        log_start_byte: The log's size before the run: earlier runs' records (the log is appended) are
            left out.

    Raises:
        SummaryError: Fewer than two iterations ran the plan, or no stock baseline was measured.
        ValueError: A file is not what it should be.
        OSError: A file cannot be read.
    """
    files = JobFiles(job_folder)
    baseline = StockBaseline.from_json(files.baseline.read_text(encoding="utf-8"))
    plan = load_plan(files.plan, expected_fingerprint=files.fingerprint)
    records = [
        record
        for record in read_job_records(log_file, files.fingerprint, log_start_byte)
        if record.phase == "planned"
    ]
    if len(records) < 2:
        raise SummaryError(
            f"{len(records)} iteration(s) ran the plan (see {log_file}); the first settles, so give "
            "--run-iters 2 or more"
        )
    settling, records = records[0], records[1:]
    if baseline.step_energy_j:
        stock = JobFigures(baseline.step_iteration_s, baseline.step_energy_j)
    elif baseline.iteration_s is not None and baseline.energy_by_rank:
        stock = JobFigures((baseline.iteration_s,), (sum(baseline.energy_by_rank.values()),))
    else:
        raise SummaryError(f"{job_folder} holds no stock-clock baseline; remove the folder and run again")
    planned = JobFigures(
        tuple(record.scalars["energy/iteration_s"] for record in records),
        tuple(record.scalars["energy/j_per_iter_total"] for record in records),
    )
    return DemoSummary(stock, planned, settling, plan, records[0].source)


def _change(stock: tuple[float, ...], planned: tuple[float, ...], source: str) -> tuple[str, bool]:
    """The relative change's text, and whether it states a change (not ``no change`` or ``within noise``).

    With its 95 % interval where both sides have samples to spread, else plain.
    """
    if len(stock) >= 2 and len(planned) >= 2:
        change = relative_change(stock, planned, source=source)  # type: ignore[arg-type]
        return change.format(), change.excludes_zero
    change_ = statistics.mean(planned) / statistics.mean(stock) - 1.0
    return f"{100 * change_:+.2f} % ({source}, n={len(stock)} vs {len(planned)})", True


def _energy_change(summary: DemoSummary) -> str:
    """The run's energy change; modelled (simulated GPUs), the plan's band around it follows."""
    stock, planned = summary.stock.energy_j, summary.planned.energy_j
    text, stated = _change(stock, planned, summary.source)
    if summary.source != "modelled" or not stated:
        return text
    change = statistics.mean(planned) / statistics.mean(stock) - 1.0
    return f"{text} {band_ends(run_band(summary.plan, change), digits=1)}"


def _plain_change(change: float) -> str:
    """A predicted relative change (no samples, no interval), as :func:`change_text` prints it."""
    return f"{change_text(change)} (modelled)"


def summary_table(summary: DemoSummary, title: str, num_gpus: int) -> Table:
    """The demo's one table: the run's means and the plan file's prediction, stock against plan.

    Args:
        summary: The figures.
        title: What ran (model, GPUs, pipeline, target).
        num_gpus: GPUs of the job (for the energy rows' labels).
    """
    source, stock, planned = summary.source, summary.stock, summary.planned
    target, baseline = summary.plan.target_point, summary.plan.baseline
    return comparison_table(
        title,
        [
            ComparisonRow(
                f"iteration time, run ({source})",
                statistics.mean(stock.time_s),
                statistics.mean(planned.time_s),
                "ms",
                _change(stock.time_s, planned.time_s, source)[0],
            ),
            ComparisonRow(
                f"energy per iteration, {num_gpus} GPUs, run ({source})",
                statistics.mean(stock.energy_j),
                statistics.mean(planned.energy_j),
                "J",
                _energy_change(summary),
            ),
            ComparisonRow(
                "iteration time, plan file's prediction (modelled)",
                baseline.iteration_time_s,
                target.iteration_time_s,
                "ms",
                _plain_change(target.iteration_time_s / baseline.iteration_time_s - 1),
            ),
            ComparisonRow(
                f"energy per iteration, {num_gpus} GPUs, plan file's prediction (modelled)",
                baseline.energy_j,
                target.energy_j,
                "J",
                saving_text(summary.plan),
            ),
        ],
    )


def settling_note(summary: DemoSummary) -> str:
    """One line on the settling iteration the table leaves out."""
    record = summary.settling
    return (
        f"left out of the run's figures: iteration {record.iteration}, the first under the plan, which "
        f"starts at the clock in effect before it: {1e3 * record.scalars['energy/iteration_s']:.1f} ms, "
        f"{record.scalars['energy/j_per_iter_total']:.1f} J ({record.source})"
    )
