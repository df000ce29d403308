"""A rank's raw power trace (``--energy-power-trace``): every reading and every iteration's end, in one file.

Each rank with ``--energy-power-trace jsonl|csv`` appends its GPU's readings
(``dvfs.power_sampler``) and the host's iteration ends to ``<energy-dir>/<job>/power_trace.rank<r>.<ext>``
(``energy_dir.JobFiles.power_trace``) at each log interval (on the sampler's thread, in chunks of
:data:`CHUNK_ROWS` rows with the GIL let go between them) and at the end of the run. Times are the
sampler's clock in seconds (``time.monotonic`` on a GPU, which every process of the machine shares; virtual
time on a simulated GPU). Rows are of two kinds: a reading (``average_w``, ``instant_w``,
``sm_clock_mhz``) and an iteration's end (``iteration_end``, 1-based). JSON lines begin with a header
(``"record": "power trace"``: rank, GPU, source, what the instant power was read from, the period, how long
the instant value holds still); CSV rows carry the same in columns of their own. :func:`read_power_trace`
reads either back into the readings and the iteration ends, from which
``runtime.energy_log.power_interval.interval_power`` gives the figures offline.
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import numpy as np

from megatron_energy.dvfs.power_sampler import PowerSamples

TraceFormat = Literal["jsonl", "csv"]
HEADER = "power trace"
"""The ``"record"`` value of a JSON-lines trace's first line."""
READING_COLUMNS = ("time_s", "average_w", "instant_w", "sm_clock_mhz")
"""A reading's figures, in the order of ``PowerSamples``' arrays."""
CSV_COLUMNS = (*READING_COLUMNS, "iteration_end", "source", "instant_source", "period_s", "refresh_s")
"""A CSV trace's columns (a reading leaves ``iteration_end`` empty, an iteration's end the powers)."""
Row = tuple[float, dict[str, float | int]]
CHUNK_ROWS = 250
"""Rows formatted and written at a time (about 1.5 ms of Python): the sampler's thread, which appends the
trace, lets go of the GIL between chunks."""


@dataclass(frozen=True)
class PowerTraceFile:
    """What a trace file holds."""

    samples: PowerSamples
    """The readings, oldest first."""
    ends: tuple[tuple[int, float], ...]
    """Each iteration's end: ``(iteration, time)``, oldest first."""


class PowerTraceWriter:
    """Appends one rank's readings and iteration ends to its trace file (module docstring).

    Args:
        path: The file (its folder is made when missing).
        fmt: ``jsonl`` or ``csv``.
        rank: The global rank.
        gpu: The GPU's local index.
    """

    def __init__(self, path: Path, fmt: TraceFormat, rank: int, gpu: int) -> None:
        self.path = path
        self.fmt: TraceFormat = fmt
        self.rank = rank
        self.gpu = gpu
        self._started = False
        self._last_s = -math.inf  # the newest reading written

    def append(self, samples: PowerSamples, ends: list[tuple[int, float]]) -> None:
        """Append the readings not written yet and ``ends``, in time order.

        Raises:
            OSError: The file cannot be written.
        """
        fresh = samples.time_s > self._last_s
        columns = (samples.time_s, samples.average_w, samples.instant_w, samples.sm_clock_mhz)
        rows: list[Row] = [
            (t, {"average_w": a, "instant_w": i, "sm_clock_mhz": c})
            for t, a, i, c in zip(*(column[fresh].tolist() for column in columns), strict=True)
        ]
        rows += [(time_s, {"iteration_end": iteration}) for iteration, time_s in ends]
        rows.sort(key=lambda row: row[0])
        if fresh.any():
            self._last_s = float(samples.time_s[fresh][-1])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8", newline="") as handle:
            for first in range(0, max(len(rows), 1), CHUNK_ROWS):
                if first:
                    time.sleep(0)  # between chunks a waiting thread (the training thread) takes the GIL
                chunk = rows[first : first + CHUNK_ROWS]
                if self.fmt == "jsonl":
                    self._jsonl(handle, samples, chunk)
                else:
                    self._csv(handle, samples, chunk)
                self._started = True

    def _jsonl(self, handle: TextIO, samples: PowerSamples, rows: list[Row]) -> None:
        lines = []
        if not self._started:
            header = {
                "record": HEADER,
                "rank": self.rank,
                "gpu": self.gpu,
                "source": samples.source,
                "instant_source": samples.instant_source,
                "period_s": samples.period_s,
                "refresh_s": samples.refresh_s,
            }
            lines.append(json.dumps(header))
        lines += [json.dumps({"time_s": time_s, **fields}) for time_s, fields in rows]
        handle.write("".join(line + "\n" for line in lines))

    def _csv(self, handle: TextIO, samples: PowerSamples, rows: list[Row]) -> None:
        writer = csv.DictWriter(handle, CSV_COLUMNS)
        if not self._started:
            writer.writeheader()
        meta = {
            "source": samples.source,
            "instant_source": samples.instant_source,
            "period_s": samples.period_s,
            "refresh_s": samples.refresh_s,
        }
        writer.writerows({"time_s": time_s, **fields, **meta} for time_s, fields in rows)


def read_power_trace(path: Path) -> PowerTraceFile:
    """The readings and iteration ends of a trace file (JSON lines or CSV, told by its suffix).

    Raises:
        ValueError: The file is not such a trace, or holds no reading.
    """
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".csv":
            rows = list(csv.DictReader(text.splitlines()))
            meta: dict[str, str] = rows[0] if rows else {}
            parsed = [{k: float(v) for k, v in row.items() if v and k in CSV_COLUMNS[:5]} for row in rows]
        else:
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
            if not lines or lines[0].get("record") != HEADER:
                raise ValueError(f"its first line is not a {HEADER!r} header")
            meta, parsed = lines[0], lines[1:]
        readings = [row for row in parsed if "iteration_end" not in row]
        ends = tuple(
            (int(row["iteration_end"]), float(row["time_s"])) for row in parsed if "iteration_end" in row
        )
        columns = [np.array([float(row[key]) for row in readings]) for key in READING_COLUMNS]
        source = meta["source"]
        if source not in ("measured", "modelled") or not readings:
            raise ValueError("no reading, or a source other than measured or modelled")
        instant_source, period_s = str(meta["instant_source"]), float(meta["period_s"])
        refresh_s = float(meta["refresh_s"])
    except (KeyError, TypeError, ValueError) as problem:
        raise ValueError(f"{path} is not a power trace ({problem})") from None
    times, average, instant, clock = columns
    origin: Literal["measured", "modelled"] = "measured" if source == "measured" else "modelled"
    samples = PowerSamples(times, average, instant, clock, origin, instant_source, period_s, refresh_s)
    return PowerTraceFile(samples, ends)
