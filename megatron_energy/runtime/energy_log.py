"""The energy log line: J/iteration per stage and in total, measured next to predicted, and the saving.

Each rank keeps its own per-step energies; at a log interval the session gathers one ``StageEnergy`` per
rank on rank 0, which formats the line and hands scalars to TensorBoard / W&B writers and, with
``--energy-log-file``, appends them to a JSON-lines file (:func:`append_record`, :func:`read_records`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StageEnergy:
    """One rank's energy over the last log interval."""

    stage: int
    """Pipeline stage of the rank."""

    measured_j_per_iter: float
    """Mean energy per iteration of this rank's GPU (``source`` says measured or modelled)."""

    predicted_j_per_iter: float | None
    """The plan's prediction for this rank's GPU, if a plan is running."""

    stock_j_per_iter: float | None
    """This GPU's mean energy per iteration at stock clocks, from profiling."""

    iteration_s: float
    """Mean iteration time over the interval."""

    stock_iteration_s: float | None
    """Mean iteration time at stock clocks, from profiling."""


def format_energy_line(
    iteration: int, ranks: Sequence[StageEnergy], source: str, phase: str
) -> tuple[str, dict[str, float]]:
    """Build the log line and the scalars for one interval.

    Args:
        iteration: The interval's last training iteration, 1-based as in Megatron's log.
        ranks: Every rank's figures (any order).
        source: ``measured`` (energy counters) or ``modelled`` (simulated GPUs).
        phase: ``profiling``, ``planned``, ``following straggler`` or ``stock (safety net)``.

    Returns:
        The line, and ``{scalar name: value}`` for metric writers.
    """
    stages = sorted({rank.stage for rank in ranks})
    per_stage = {s: sum(r.measured_j_per_iter for r in ranks if r.stage == s) for s in stages}
    total = sum(per_stage.values())
    parts = [f"[energy] iteration {iteration} | {phase}"]
    parts.append("J/iter " + source + ": " + " ".join(f"s{s}={per_stage[s]:.1f}" for s in stages))
    parts.append(f"total={total:.1f}")
    scalars = {"energy/j_per_iter_total": total}
    scalars |= {f"energy/j_per_iter_stage{s}": value for s, value in per_stage.items()}
    predicted = [r.predicted_j_per_iter for r in ranks if r.predicted_j_per_iter is not None]
    if len(predicted) == len(ranks):
        predicted_total = sum(predicted)
        parts.append(f"predicted (modelled)={predicted_total:.1f}")
        scalars["energy/j_per_iter_predicted"] = predicted_total
    stock = [r.stock_j_per_iter for r in ranks if r.stock_j_per_iter is not None]
    if len(stock) == len(ranks) and sum(stock) > 0:
        saving = 1.0 - total / sum(stock)
        parts.append(f"saving vs stock ({source})={100 * saving:.1f}%")
        scalars["energy/saving_vs_stock"] = saving
    iteration_s = max(r.iteration_s for r in ranks)
    parts.append(f"iter {1e3 * iteration_s:.1f} ms ({source})")
    scalars["energy/iteration_s"] = iteration_s
    stock_s = [r.stock_iteration_s for r in ranks if r.stock_iteration_s is not None]
    if stock_s:
        parts.append(f"stock {1e3 * max(stock_s):.1f} ms ({source})")
    return " | ".join(parts), scalars


def publish(
    line: str,
    scalars: dict[str, float],
    iteration: int,
    sinks: Sequence[Callable[[str, float, int], Any]],
    printer: Callable[[str], Any] = print,
) -> None:
    """Print the line and write each scalar to every metric sink at ``iteration`` (1-based, as Megatron's)."""
    printer(line)
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
    """The line's scalars (``energy/j_per_iter_total``, ``energy/iteration_s``, ...): interval means."""


def append_record(path: Path, record: EnergyRecord) -> None:
    """Append ``record`` to the JSON-lines file ``path`` (created with its folder if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(asdict(record)) + "\n")


def read_records(path: Path) -> list[EnergyRecord]:
    """The records of a ``--energy-log-file``, in the order they were written.

    Raises:
        ValueError: A line is not such a record.
    """
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            data = json.loads(line)
            records.append(
                EnergyRecord(
                    int(data["iteration"]),
                    str(data["phase"]),
                    str(data["source"]),
                    {str(name): float(value) for name, value in data["scalars"].items()},
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError) as problem:
            raise ValueError(f"{path}:{number} is not an energy log record ({problem})") from None
    return records
