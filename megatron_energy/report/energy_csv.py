"""``megatron-energy report --csv``: an energy log's records as CSV, for spreadsheets and plotting.

Three tables, each with a header row:

- **iterations**: one row per energy log line's record (``runtime.energy_log.energy_line.EnergyRecord``, one
  per ``--log-interval`` iterations), in the order written. Columns: ``iteration`` (the interval's last,
  1-based), ``phase``, ``source`` (``measured`` or ``modelled``: where every figure of the row comes from),
  ``job`` (fingerprint), ``time_utc``, then each scalar the log line carries, named as in TensorBoard without
  the ``energy/`` prefix, in the order the lines state them (:data:`ITERATION_COLUMNS` documents the usual
  ones). A figure a record does not carry, or that has no finite value, is an empty cell.
- **totals**: one row per run (``runtime.energy_log.run_totals.RunTotals``): the fields of the record, the
  saving's flattened as ``saving_<field>`` (:data:`RUN_COLUMNS`, :data:`SAVING_COLUMNS`).
- **power**: one row per GPU and log interval (``runtime.energy_log.power_record.PowerRecord``): where and
  when (:data:`POWER_RECORD_COLUMNS`), the interval's levels (:data:`POWER_COLUMNS`), and its iterations'
  power swing, median and largest (``swing_w_median``, ``swing_w_max``; empty where no iteration was long
  enough to bin).

``--csv FILE`` writes the iterations to ``FILE`` and, when the log holds them, the totals and the power
records beside it to ``<FILE stem>-totals.csv`` and ``<FILE stem>-power.csv``; ``--csv`` alone writes every
table to standard output, one empty line between two.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TextIO

from megatron_energy.runtime.energy_log.energy_line import EnergyRecord, read_records
from megatron_energy.runtime.energy_log.power_record import PowerRecord, read_power_records
from megatron_energy.runtime.energy_log.run_totals import RunTotals, SavingVsStock, read_run_totals

RECORD_COLUMNS = ("iteration", "phase", "source", "job", "time_utc")
"""The first columns of the iterations table."""
SCALAR_PREFIX = "energy/"
"""The scalars' prefix, left out of the column names."""
ITERATION_COLUMNS: dict[str, str] = {
    "j_per_iter_total": "mean energy per iteration of every GPU over the interval (J)",
    "j_per_iter_stage<N>": "the same for pipeline stage N's GPUs (J)",
    "j_per_iter_predicted": "the running plan's prediction for every GPU (J, modelled)",
    "change_vs_stock": "the window's energy change against stock clocks (fraction; -0.1: 10 % less)",
    "change_vs_stock_low, _high": "its 95 % interval",
    "change_vs_stock_resolved": "1 when the interval excludes zero, else 0",
    "window_iterations": "iterations of the window compared with stock clocks",
    "iteration_s": "the slowest GPU's mean iteration time over the interval (s)",
    "iteration_change_vs_stock[_low, _high, _resolved]": "the same for the iteration time",
}
"""The usual scalar columns of the iterations table and what each holds (others a line carries follow)."""
RUN_COLUMNS: tuple[str, ...] = tuple(item.name for item in fields(RunTotals) if item.name != "saving")
"""The totals table's columns from the run's fields (``RunTotals``)."""
SAVING_COLUMNS: tuple[str, ...] = tuple(item.name for item in fields(SavingVsStock))
"""Then the saving's fields (``SavingVsStock``), each as ``saving_<field>``; empty without a saving."""
POWER_RECORD_COLUMNS = ("iteration", "first_iteration", "phase", "rank", "gpu", "job", "time_utc")
"""The power table's first columns: the interval's last and first iteration, the phase, the GPU's rank and
NVML index, the job and the time the record was written."""
POWER_COLUMNS = (
    "source",
    "instant_source",
    "readings",
    "average_w",
    "instant_mean_w",
    "instant_min_w",
    "instant_max_w",
    "sm_clock_median_mhz",
    "sm_clock_min_mhz",
)
"""Then the interval's figures (``GpuPowerInterval``'s fields: ``source`` says measured or modelled), then
``swing_w_median``, ``swing_w_max`` and ``note``."""


@dataclass(frozen=True)
class EnergyTables:
    """An energy log's two tables, header first."""

    iterations: list[list[str]]
    """The iteration records."""
    totals: list[list[str]]
    """The run totals records (empty when the log holds none)."""
    power: list[list[str]]
    """The power records (empty when the log holds none)."""


def energy_tables(log_file: Path) -> EnergyTables:
    """Read ``log_file`` (a ``--energy-log-file``) into its two tables.

    Raises:
        ValueError: A line of the file is not a record.
        OSError: The file cannot be read.
    """
    return EnergyTables(
        iteration_rows(read_records(log_file)),
        totals_rows(read_run_totals(log_file)),
        power_rows(read_power_records(log_file)),
    )


def iteration_rows(records: Sequence[EnergyRecord]) -> list[list[str]]:
    """The iterations table: a header, then one row per record (see the module docstring)."""
    scalars: dict[str, None] = {}
    for record in records:
        scalars.update(dict.fromkeys(record.scalars))
    header = [*RECORD_COLUMNS, *(name.removeprefix(SCALAR_PREFIX) for name in scalars)]
    rows = [header]
    for record in records:
        fixed = [str(record.iteration), record.phase, record.source, record.job, record.time_utc]
        rows.append(fixed + [_cell(record.scalars.get(name)) for name in scalars])
    return rows


def totals_rows(totals: Sequence[RunTotals]) -> list[list[str]]:
    """The totals table: a header, then one row per run; empty when there is no run."""
    if not totals:
        return []
    rows = [[*RUN_COLUMNS, *(f"saving_{name}" for name in SAVING_COLUMNS)]]
    for run in totals:
        values = asdict(run)
        saving = values["saving"] or {}
        rows.append(
            [_cell(values[name]) for name in RUN_COLUMNS]
            + [_cell(saving.get(name)) for name in SAVING_COLUMNS]
        )
    return rows


def power_rows(records: Sequence[PowerRecord]) -> list[list[str]]:
    """The power table: a header, then one row per GPU interval; empty when there is none."""
    if not records:
        return []
    rows = [[*POWER_RECORD_COLUMNS, *POWER_COLUMNS, "swing_w_median", "swing_w_max", "note"]]
    for record in records:
        power = record.power
        swings = [swing.swing_w for swing in power.iterations]
        where = (record.iteration, record.first_iteration, record.phase, record.rank, record.gpu, record.job)
        rows.append(
            [_cell(value) for value in (*where, record.time_utc)]
            + [_cell(getattr(power, name)) for name in POWER_COLUMNS]
            + [_cell(statistics.median(swings) if swings else None), _cell(max(swings, default=None))]
            + [power.note]
        )
    return rows


def write_tables(rows: Iterable[Sequence[str]], out: TextIO) -> None:
    """Write rows as CSV (RFC 4180, one line feed per row)."""
    csv.writer(out, lineterminator="\n").writerows(rows)


def _cell(value: Any) -> str:
    """A cell: empty for a missing or non-finite figure, ``1``/``0`` for a truth value, else the value."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, bool):
        return str(int(value))
    return str(value)
