"""The power-cap check in ``--energy-log-file``: one typed record beside the iteration records.

Rank 0 appends one :class:`PowerCapRecord` after profiling when some instruction was read held at the power
cap (``runtime.profiling.power_cap_check``). Its line carries ``"record": "power-cap check"``, which
``energy_line.read_records`` leaves out of the iteration records; :func:`read_power_cap_records` reads it::

    {"record": "power-cap check", "iteration": 12, "gpu_spec": "h100-sxm", "stock_clock_mhz": 1980,
     "clock_source": "measured", "kinds": [{"kind": "forward", "classes": 4, "capped_reads": 8, "reads": 8,
     "measured_mhz": 1380.0, "modelled_mhz": 1412.3}, ...], "job": "...", "time_utc": "..."}

``measured_mhz`` is what the GPU reported (``clock_source`` says measured, or modelled on simulated GPUs);
``modelled_mhz`` is always the model's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from megatron_energy.runtime.energy_log.energy_line import written_time
from megatron_energy.runtime.profiling.power_cap_check import KindCheck, PowerCapCheck

RECORD = "power-cap check"
"""The ``"record"`` value of the record's line."""


@dataclass(frozen=True)
class PowerCapRecord:
    """One job's power-cap check, as ``--energy-log-file`` holds it."""

    iteration: int
    """The last profiling iteration, 1-based: the check covers the stock clock's profile steps before it."""
    check: PowerCapCheck
    """The figures."""
    job: str = ""
    """The job's fingerprint."""
    time_utc: str = ""
    """When the record was written (ISO 8601, UTC, seconds); set on writing when empty."""

    def to_json(self) -> dict[str, Any]:
        """The record's line as a JSON object (the time of writing filled in)."""
        return {
            "record": RECORD,
            "iteration": self.iteration,
            **asdict(self.check),
            "job": self.job,
            "time_utc": written_time(self.time_utc),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PowerCapRecord:
        """The record of a line written by :meth:`to_json`.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not such a record.
        """
        if data["record"] != RECORD:
            raise ValueError(f"a {data['record']!r} record, not a {RECORD!r} one")
        source = data["clock_source"]
        if source not in ("measured", "modelled"):
            raise ValueError(f"clock_source must be measured or modelled, not {source!r}")
        check = PowerCapCheck(
            gpu_spec=str(data["gpu_spec"]),
            stock_clock_mhz=int(data["stock_clock_mhz"]),
            clock_source=source,
            kinds=tuple(KindCheck(**kind) for kind in data["kinds"]),
        )
        return cls(int(data["iteration"]), check, str(data["job"]), str(data["time_utc"]))


def read_power_cap_records(path: Path) -> list[PowerCapRecord]:
    """The power-cap check records of a ``--energy-log-file``, in the order they were written.

    Raises:
        ValueError: A power-cap check line is not such a record.
    """
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        data = json.loads(line)
        if data.get("record") != RECORD:
            continue
        try:
            records.append(PowerCapRecord.from_json(data))
        except (KeyError, TypeError, ValueError) as problem:
            raise ValueError(f"{path}:{number} is not a power-cap check record ({problem})") from None
    return records
