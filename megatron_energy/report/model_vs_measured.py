"""The job report's "model vs measured at stock clocks" section, and the run's savings against stock clocks.

Two parts, every figure labelled measured or modelled:

1. the stock plan's prediction (modelled: the simulator on the instruction times and energies measured while
   profiling) against the whole stock iterations profiling measured (``baseline.json``), per stage and in
   total, with the relative error (``runtime.energy_log.stock_check``);
2. the savings of the run against stock clocks, as the energy log computed them (``stats.relative_change``
   over the last window of planned iterations, 95 % interval, "within noise" when it covers zero), read from
   the run's ``--energy-log-file``; without one the section says how to get them. Their heading says what the
   log says they are: ``measured`` (energy counters) or ``modelled`` (simulated GPUs).
"""

from __future__ import annotations

from pathlib import Path

from megatron_energy.energy_dir import JobFiles
from megatron_energy.plan import Plan
from megatron_energy.runtime.energy_log.energy_line import NOT_SET, EnergyRecord, read_job_records
from megatron_energy.runtime.energy_log.stock_check import TITLE, compare_stock, comparison_lines
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.stats import ROUNDING

RUN_PHASES = ("planned",)
"""Log records whose window measures the plan (not profiling, a straggler's pace or the safety net)."""


def model_vs_measured_lines(folder: Path, plan: Plan, log_file: Path | None) -> list[str]:
    """The section's lines for the job in ``folder``.

    Args:
        folder: The job folder (its ``baseline.json`` holds the measured stock steps).
        plan: The job's plan.
        log_file: The run's ``--energy-log-file``, or None.

    Returns:
        The lines, starting with the section's title.

    Raises:
        ForeignLogError: The log file holds only other jobs' records (``runtime.energy_log.energy_line``).
        ValueError: ``baseline.json`` or the log file is malformed.
        OSError: A file cannot be read.
    """
    baseline_path = JobFiles(folder).baseline
    if not baseline_path.exists():
        lines = [
            f"{TITLE}: {folder} holds no {baseline_path.name} (measured stock steps); rerun the job to "
            "write it"
        ]
    else:
        baseline = StockBaseline.from_json(baseline_path.read_text(encoding="utf-8"))
        comparison = compare_stock(plan, baseline)
        lines = (
            comparison_lines(comparison)
            if comparison is not None
            else [f"{TITLE}: the stock baseline holds no measured time or energy"]
        )
    return lines + savings_lines(log_file, folder.name)


def savings_lines(log_file: Path | None, fingerprint: str) -> list[str]:
    """The run's changes against stock clocks, from the last planned record of its energy log.

    The heading names the record's source: ``measured`` savings, or ``modelled`` ones on simulated GPUs.

    Only job ``fingerprint``'s records count, wherever other jobs' sit between them
    (``runtime.energy_log.energy_line.read_job_records``).
    """
    if log_file is None:
        return [
            "savings against stock clocks: not shown; run the job with --energy-log-file FILE and pass "
            "--log-file FILE to the report"
        ]
    records = [
        record
        for record in read_job_records(log_file, fingerprint)
        if record.phase.split(" (")[0] in RUN_PHASES
    ]
    windowed = [record for record in records if "energy/change_vs_stock" in record.scalars]
    if not windowed:
        return [
            f"savings against stock clocks: {log_file} holds no planned iteration compared with stock "
            "clocks yet"
        ]
    last = windowed[-1]
    return [
        f"{last.source} savings against stock clocks (iteration {last.iteration}, last window of "
        f"{int(last.scalars.get('energy/window_iterations', 0))} planned iterations, 95 % CI, "
        f"as the energy log computed them; phase '{last.phase}'):",
        f"  energy per iteration: {_recorded_change(last, 'energy/change_vs_stock', saving=True)}",
        f"  iteration time: {_recorded_change(last, 'energy/iteration_change_vs_stock', saving=False)}",
    ]


def _recorded_change(record: EnergyRecord, prefix: str, saving: bool) -> str:
    """A change as the log recorded it: ``-8.1 % (saving; 95 % CI ...)`` or ``within noise (±x %)``.

    Where no clock was set (the phase says so), a resolved change is not called a saving.
    """
    scalars = record.scalars
    if prefix not in scalars:
        return "not compared"
    change, low, high = scalars[prefix], scalars[f"{prefix}_low"], scalars[f"{prefix}_high"]
    if high - low <= ROUNDING and abs(change) <= ROUNDING:
        return f"no change ({record.source})"
    if not scalars.get(f"{prefix}_resolved"):
        return f"within noise (±{100 * (high - low) / 2:.1f} %, {record.source})"
    what = ("saving" if change < 0 else "increase") if saving else ("faster" if change < 0 else "slower")
    if record.phase.endswith(NOT_SET):  # stock clocks all along: not the plan's doing
        what = "no clock was set: a change from outside the plan"
    return (
        f"{100 * change:+.1f} % ({what}; 95 % CI {100 * low:+.1f} % to {100 * high:+.1f} %, {record.source})"
    )
