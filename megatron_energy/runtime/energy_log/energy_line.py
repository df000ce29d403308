"""The energy log line: J/iteration per stage and in total, measured next to predicted, and the change.

Each rank keeps its own per-step figures (``runtime.energy_log.log_window``); at a log interval each rank's
``StageEnergy`` is reduced over the job into one :class:`JobInterval` on every rank
(``runtime.energy_log.log_aggregate``: fixed-size vectors, no gather); rank 0 formats and prints the line
and, with ``--energy-log-file``, appends its scalars to a JSON-lines file (:func:`append_record`,
:func:`read_records`); a rank with metric writers (TensorBoard / W&B, on Megatron's last rank) formats the
same scalars from the same figures and writes them.

A line speaks for one phase only. Its J/iteration figures are the means of the interval's steps (those of
the current phase); its changes against stock clocks compare the phase's window of iterations with the stock
baseline's iterations (``stats.relative_change`` with its 95 % interval, "within noise" when the interval
covers zero), for energy and for iteration time alike. Where no clock was set (a dry run, monitor-only), a
resolved change is said to come from outside the plan.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from megatron_energy.errors import EnergyValueError
from megatron_energy.plan_band import SavingBand
from megatron_energy.plan_outcome import band_ends
from megatron_energy.runtime.energy_log.log_window import RankWindow, block_size, compare_to_stock
from megatron_energy.stats import RelativeChange, Source

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageEnergy:
    """One rank's figures for a log line (``runtime.energy_log.log_aggregate`` reduces them over the job)."""

    stage: int
    """Pipeline stage of the rank."""

    measured_j_per_iter: float
    """Mean energy per iteration of this rank's GPU over the interval (``source`` says measured or
    modelled)."""

    predicted_j_per_iter: float | None
    """The plan's prediction for this rank's GPU, if a plan is running."""

    iteration_s: float
    """Mean iteration time over the interval."""

    window: RankWindow = field(default_factory=lambda: RankWindow(first_step=-1))
    """This rank's per-iteration figures over the phase's window."""

    run_energy_j: float = 0.0
    """This rank's GPU energy over every step since the previous line, whatever its phase (the run's totals,
    ``runtime.energy_log.run_totals``)."""

    run_steps: int = 0
    """The steps ``run_energy_j`` counts."""


@dataclass(frozen=True)
class JobInterval:
    """One log interval over every GPU of the job (``source`` as the line says: measured or modelled)."""

    stage_j: tuple[float, ...]
    """Per stage: the interval's mean energy per iteration summed over the stage's GPUs."""
    predicted_j: float | None
    """The plan's prediction summed over every GPU; ``None`` unless every GPU has one."""
    iteration_s: float
    """The slowest GPU's mean iteration time over the interval."""
    window_j: tuple[float, ...]
    """Per iteration of the window every GPU holds, oldest first: energy summed over the GPUs."""
    window_s: tuple[float, ...]
    """Per iteration of that window: the slowest GPU's time."""
    gpus: int
    """GPUs the figures sum over."""
    run_j: float = 0.0
    """Energy summed over the GPUs of every step since the previous line, whatever its phase."""
    run_steps: int = 0
    """The steps ``run_j`` counts (the most any rank counted; every rank counts the same)."""


@dataclass(frozen=True)
class StockSamples:
    """The stock baseline's per-iteration job figures, as the log compares with them."""

    energy_j: tuple[float, ...] = ()
    """Energy of every GPU of the job, per stock iteration."""

    iteration_s: tuple[float, ...] = ()
    """The slowest rank's iteration time, per stock iteration."""

    counter_period_s: float = 0.0
    """Period of the energy counter the figures were read from; 0 when they are exact (simulated GPUs)."""


def format_energy_line(
    iteration: int,
    job: JobInterval,
    source: Source,
    phase: str,
    stock: StockSamples | None = None,
    first_iteration: int | None = None,
    band: SavingBand | None = None,
) -> tuple[str, dict[str, float]]:
    """Build the log line and the scalars for one interval.

    Args:
        iteration: The interval's last training iteration, 1-based as in Megatron's log.
        job: The interval over every GPU of the job.
        source: ``measured`` (energy counters) or ``modelled`` (simulated GPUs).
        phase: ``profiling``, ``planned``, ``following straggler`` or ``stock (safety net)``.
        stock: The stock baseline's iterations, once measured.
        first_iteration: The interval's first iteration, when the line names the range it covers (a line
            of a staged exchange that covers several log intervals, ``runtime.energy_log.energy_logger``).
        band: The running plan's saving band around zero (``plan_outcome.run_band``): a resolved modelled
            energy change carries it around its own value, after its statistical interval.

    Returns:
        The line, and ``{scalar name: value}`` for metric writers.
    """
    per_stage = dict(enumerate(job.stage_j))
    total = sum(per_stage.values())
    covered = f"iteration {iteration}"
    if first_iteration is not None:
        covered = f"iterations {first_iteration}-{iteration}"
    parts = [f"[energy] {covered} | {phase}"]
    parts.append("J/iter " + source + ": " + " ".join(f"s{s}={value:.1f}" for s, value in per_stage.items()))
    parts.append(f"total={total:.1f}")
    scalars = {"energy/j_per_iter_total": total}
    scalars |= {f"energy/j_per_iter_stage{s}": value for s, value in per_stage.items()}
    if job.predicted_j is not None:
        parts.append(f"predicted (modelled)={job.predicted_j:.1f}")
        scalars["energy/j_per_iter_predicted"] = job.predicted_j
    energy_change = time_change = None
    if stock is not None and job.window_j:
        size = block_size(stock.iteration_s, stock.counter_period_s)
        energy_change = compare_to_stock(stock.energy_j, job.window_j, size, source)
        time_change = compare_to_stock(stock.iteration_s, job.window_s, size, source)
    if energy_change is not None:
        parts.append(f"energy vs stock: {_stated(energy_change, phase)}{_banded(energy_change, band)}")
        scalars |= energy_change.scalars("energy/change_vs_stock")
        scalars["energy/window_iterations"] = float(len(job.window_j))
    parts.append(f"iter {1e3 * job.iteration_s:.1f} ms ({source})")
    scalars["energy/iteration_s"] = job.iteration_s
    if time_change is not None:
        parts.append(f"time vs stock: {_stated(time_change, phase)}")
        scalars |= time_change.scalars("energy/iteration_change_vs_stock")
    return " | ".join(parts), scalars


LOGGED_PHASE = re.compile(r"\[energy\] iteration (\d+) \| ([^|]+?)\s*\|")
"""An energy log line's iteration and phase, as :func:`format_energy_line` writes them."""
NOT_SET = "(clocks not set)"
"""What a phase carries when the controller only recorded its clocks (dry run, monitor-only)."""


def _stated(change: RelativeChange, phase: str) -> str:
    """A change as ``RelativeChange.format`` states it; where no clock was set and it is resolved, why.

    In a dry run (or monitor-only) the phase's clocks are the stock ones, so a change whose interval excludes
    zero came from outside the plan (another tenant, temperature, a level the stock baseline did not see):
    the line says so rather than let it read as the plan's saving or cost.
    """
    text = change.format()
    if phase.endswith(NOT_SET) and change.excludes_zero:
        text += " (no clock was set: a change from outside the plan, not its effect)"
    return text


def _banded(change: RelativeChange, band: SavingBand | None) -> str:
    """The plan's band around a resolved modelled change (`` (-10.8 to -13.0 %, modelled)``), else nothing.

    A measured change keeps its statistical interval alone: the band is the model's, not the measurement's.
    """
    if band is None or change.source != "modelled" or not change.excludes_zero:
        return ""
    return " " + band_ends(band.shifted(change.change), digits=1)


def logged_phases(text: str) -> dict[int, str]:
    """The phase of every iteration an energy log line names in ``text`` (a run's output), 1-based.

    A dry run's ``(clocks not set)`` is left out: ``{12: "profiling", 30: "planned"}``.
    """
    return {
        int(match.group(1)): match.group(2).removesuffix(NOT_SET).strip()
        for match in LOGGED_PHASE.finditer(text)
    }


def publish(
    line: str,
    scalars: dict[str, float],
    iteration: int,
    sinks: Sequence[Callable[[str, float, int], Any]],
) -> None:
    """Log the line and write each scalar to every metric sink at ``iteration`` (1-based, as Megatron's)."""
    logger.info(line)
    write_scalars(scalars, iteration, sinks)


def write_scalars(
    scalars: dict[str, float], iteration: int, sinks: Sequence[Callable[[str, float, int], Any]]
) -> None:
    """Write each scalar to every metric sink at ``iteration``."""
    for sink in sinks:
        for name, value in scalars.items():
            sink(name, value, iteration)


@dataclass(frozen=True)
class EnergyRecord:
    """One energy log line's figures, as ``--energy-log-file`` holds them (one JSON object per line)."""

    iteration: int
    """The interval's last iteration, 1-based."""

    phase: str
    """What ran: ``profiling``, ``planned``, ``following straggler``, ``stock (safety net)``, ..."""

    source: str
    """``measured`` or ``modelled``: where the energy and time figures come from."""

    scalars: dict[str, float]
    """The line's scalars: interval means (``energy/j_per_iter_total``, ``energy/iteration_s``, ...) and the
    window's changes against stock clocks with their intervals (``energy/change_vs_stock`` and its ``_low``,
    ``_high``, ``_resolved``; ``energy/iteration_change_vs_stock`` likewise). A figure that is not finite (an
    interval without bounds) is ``null`` in the file and NaN when read back."""

    job: str = ""
    """The job's fingerprint (its folder's name under ``--energy-dir``); empty in records of older runs."""

    time_utc: str = ""
    """When the record was written (ISO 8601, UTC, seconds); empty in records of older runs."""


def written_time(time_utc: str) -> str:
    """A record's ``time_utc``: as given, or (empty) now, ISO 8601 in UTC to the second."""
    return time_utc or datetime.now(UTC).isoformat(timespec="seconds")


def append_record(path: Path, record: EnergyRecord) -> None:
    """Append ``record`` to the JSON-lines file ``path`` (created with its folder if missing) as strict JSON.

    Non-finite scalars are written as ``null`` (``NaN`` and ``Infinity`` are not JSON); a record without a
    time gets the time of writing.
    """
    data = asdict(record)
    data["scalars"] = {
        name: value if math.isfinite(value) else None for name, value in record.scalars.items()
    }
    data["time_utc"] = written_time(record.time_utc)
    append_json_line(path, data)


def append_json_line(path: Path, data: dict[str, Any]) -> None:
    """Append ``data`` to the JSON-lines file ``path`` (created with its folder if missing) as strict JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(data, allow_nan=False) + "\n")


def read_records(path: Path, start_byte: int = 0) -> list[EnergyRecord]:
    """The iteration records of a ``--energy-log-file``, in the order they were written.

    Lines of other record types (a ``"record"`` key names them: ``runtime.energy_log.power_cap_record``) are
    left out.

    Args:
        path: The log (runs append to it).
        start_byte: Where to start reading: the file's size when a run began reads that run's records alone.

    Raises:
        ValueError: A line is not such a record.
    """
    records: list[EnergyRecord] = []
    data = path.read_bytes()
    first_line = data[:start_byte].count(b"\n") + 1
    for number, line in enumerate(data[start_byte:].decode("utf-8").splitlines(), start=first_line):
        try:
            data = json.loads(line)
            if "record" in data:
                continue
            records.append(
                EnergyRecord(
                    int(data["iteration"]),
                    str(data["phase"]),
                    str(data["source"]),
                    {
                        str(name): math.nan if value is None else float(value)
                        for name, value in data["scalars"].items()
                    },
                    str(data.get("job", "")),
                    str(data.get("time_utc", "")),
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError) as problem:
            raise ValueError(f"{path}:{number} is not an energy log record ({problem})") from None
    return records


class ForeignLogError(EnergyValueError):
    """An energy log holds records of another job than the one asked about; the message names both."""


def read_job_records(path: Path, fingerprint: str, start_byte: int = 0) -> list[EnergyRecord]:
    """The records of ``path`` from ``start_byte`` on (:func:`read_records`): job ``fingerprint``'s alone.

    A log that several jobs appended to (``--energy-log-file`` appends) gives this job's records; records of
    older runs, which name no job, are taken as they are.

    Raises:
        ForeignLogError: The log holds records of other jobs and none of this one's.
        ValueError: A line is not a record.
    """
    records = read_records(path, start_byte)
    own = [record for record in records if not record.job or record.job == fingerprint]
    others = sorted({record.job for record in records if record.job and record.job != fingerprint})
    if others and not any(record.job == fingerprint for record in own):
        raise ForeignLogError(
            f"{path} is the energy log of job {', '.join(others)}, not of job {fingerprint}: pass the "
            f"--energy-log-file of the run that wrote {fingerprint}, or --job {others[0]} for that job"
        )
    return own
