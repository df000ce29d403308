"""The job at stock clocks as profiling measured it: what every measured change is set against.

Cached as ``baseline.json`` beside the plan; read by the energy log, the model-vs-measured check and the
reports.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StockBaseline:
    """The job at stock clocks, as profiling measured it (modelled on simulated GPUs)."""

    iteration_s: float | None = None
    """Iteration time (the slowest rank's), ``None`` if not measured."""

    energy_by_rank: dict[int, float] = field(default_factory=dict)
    """Energy per iteration of each planning-replica rank's GPU (one per stage: the replica and tensor rank of
    global rank 0, whose profiles the plan is made from), by global rank."""

    step_iteration_s: tuple[float, ...] = ()
    """Each measured stock step's iteration time (the slowest rank's), in the order the steps ran."""

    step_energy_j: tuple[float, ...] = ()
    """Each measured stock step's energy over every GPU of the job."""

    stage_by_rank: dict[int, int] = field(default_factory=dict)
    """The pipeline stage of each global rank in ``energy_by_rank`` (empty in caches written before it)."""

    source: str = "measured"
    """``measured`` (a real GPU's counter and timers) or ``modelled`` (simulated GPUs)."""

    @property
    def steps(self) -> int:
        """Measured stock steps (per-step samples kept)."""
        return len(self.step_energy_j)

    @property
    def iteration_noise_s(self) -> float:
        """Standard deviation of the stock steps' iteration times (0 with fewer than three steps)."""
        times = self.step_iteration_s
        return statistics.stdev(times) if len(times) >= 3 else 0.0

    def to_json(self) -> str:
        """The baseline as the cache stores it."""
        return json.dumps(
            {
                "stock_time_s": self.iteration_s,
                "stock_energy_by_rank": self.energy_by_rank,
                "stock_step_time_s": list(self.step_iteration_s),
                "stock_step_energy_j": list(self.step_energy_j),
                "stage_by_rank": self.stage_by_rank,
                "source": self.source,
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> StockBaseline:
        """Parse :meth:`to_json`'s text.

        Raises:
            ValueError: The text is not such a baseline.
        """
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the baseline is not a JSON object")
        time_s = data.get("stock_time_s")
        return cls(
            iteration_s=None if time_s is None else float(time_s),
            energy_by_rank={int(k): float(v) for k, v in data.get("stock_energy_by_rank", {}).items()},
            step_iteration_s=tuple(float(v) for v in data.get("stock_step_time_s", ())),
            step_energy_j=tuple(float(v) for v in data.get("stock_step_energy_j", ())),
            stage_by_rank={int(k): int(v) for k, v in data.get("stage_by_rank", {}).items()},
            source=str(data.get("source", "measured")),
        )
