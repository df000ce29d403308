"""The power of a rank's GPU over a log interval in ``--energy-log-file``: one typed record, and its scalars.

At each log interval a rank's power log (``runtime.energy_log.power_log``) makes one :class:`PowerRecord` of
its GPU (``runtime.energy_log.power_interval``: levels, SM clock, each iteration's swing). Rank 0 appends its
record to ``--energy-log-file``, beside the iteration records; its line carries ``"record": "power"``, which
``energy_line.read_records`` leaves out of the iteration records, and :func:`read_power_records` reads it::

    {"record": "power", "iteration": 20, "first_iteration": 11, "phase": "planned (clocks not set)",
     "rank": 0, "gpu": 0, "power": {"source": "measured", "instant_source": "instant field 186",
     "readings": 191, "resolution_s": 0.05, "band_resolution_s": 0.1, "band_hz": [0.1, 5.0],
     "average_w": 612.4, "instant_mean_w": 608.9, "instant_min_w": 309.0, "instant_max_w": 702.0,
     "sm_clock_median_mhz": 1980.0, "sm_clock_min_mhz": 1755.0, "iterations": [{"iteration": 11,
     "duration_s": 0.935, "swing_w": 330.2, ...}, ...], "note": ""}, "job": "...", "time_utc": "..."}

A rank with metric writers (Megatron's last rank) writes :func:`power_scalars`: the interval's levels at its
last iteration, each iteration's swing at that iteration. Its size does not grow with the job: one record of
one GPU, no collective.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from megatron_energy.runtime.energy_log.energy_line import written_time
from megatron_energy.runtime.energy_log.iteration_swings import IterationSwing
from megatron_energy.runtime.energy_log.power_interval import GpuPowerInterval

RECORD = "power"
"""The ``"record"`` value of the record's line."""


@dataclass(frozen=True)
class PowerRecord:
    """One GPU's power over one log interval, as ``--energy-log-file`` holds it."""

    iteration: int
    """The interval's last iteration, 1-based."""
    first_iteration: int
    """The interval's first iteration, 1-based."""
    phase: str
    """What ran in the interval's last iteration (``profiling``, ``planned``, ...)."""
    rank: int
    """The global rank whose GPU it is."""
    gpu: int
    """The GPU's local index."""
    power: GpuPowerInterval
    """The figures (each as ``power.source`` says: measured or modelled)."""
    job: str = ""
    """The job's fingerprint."""
    time_utc: str = ""
    """When the record was written (ISO 8601, UTC, seconds); set on writing when empty."""

    def to_json(self) -> dict[str, Any]:
        """The record's line as a JSON object (the time of writing filled in)."""
        return {
            "record": RECORD,
            **asdict(self),
            "time_utc": written_time(self.time_utc),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PowerRecord:
        """The record of a line written by :meth:`to_json`.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not such a record.
        """
        if data["record"] != RECORD:
            raise ValueError(f"a {data['record']!r} record, not a {RECORD!r} one")
        power = dict(data["power"])
        if power["source"] not in ("measured", "modelled"):
            raise ValueError(f"source must be measured or modelled, not {power['source']!r}")
        low, high = power.pop("band_hz")
        iterations = tuple(IterationSwing(**swing) for swing in power.pop("iterations"))
        figures = GpuPowerInterval(**power, band_hz=(float(low), float(high)), iterations=iterations)
        return cls(
            int(data["iteration"]),
            int(data["first_iteration"]),
            str(data["phase"]),
            int(data["rank"]),
            int(data["gpu"]),
            figures,
            str(data["job"]),
            str(data["time_utc"]),
        )


def read_power_records(path: Path) -> list[PowerRecord]:
    """The power records of a ``--energy-log-file``, in the order they were written.

    Raises:
        ValueError: A power line is not such a record.
    """
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        data = json.loads(line)
        if data.get("record") != RECORD:
            continue
        try:
            records.append(PowerRecord.from_json(data))
        except (KeyError, TypeError, ValueError) as problem:
            raise ValueError(f"{path}:{number} is not a power record ({problem})") from None
    return records


def power_scalars(record: PowerRecord) -> dict[int, dict[str, float]]:
    """The record's metric-writer scalars by iteration.

    The interval's levels (``energy/power_w``, ``energy/sm_clock_median_mhz``, ...) at its last iteration,
    each iteration's swing (``energy/swing_w``, ``energy/ramp_up_w_per_s``, ...) at its own.
    """
    power = record.power
    scalars: dict[int, dict[str, float]] = {
        swing.iteration: {
            "energy/swing_w": swing.swing_w,
            "energy/ramp_up_w_per_s": swing.ramp_up_w_per_s,
            "energy/ramp_down_w_per_s": swing.ramp_down_w_per_s,
            "energy/band_share": swing.band_share,
        }
        for swing in power.iterations
    }
    scalars.setdefault(record.iteration, {}).update(
        {
            "energy/power_w": power.average_w,
            "energy/power_instant_mean_w": power.instant_mean_w,
            "energy/power_instant_min_w": power.instant_min_w,
            "energy/power_instant_max_w": power.instant_max_w,
            "energy/sm_clock_median_mhz": power.sm_clock_median_mhz,
            "energy/sm_clock_min_mhz": power.sm_clock_min_mhz,
        }
    )
    return scalars
