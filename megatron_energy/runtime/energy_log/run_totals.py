"""The run's totals over every GPU of the job: energy, Wh per token, the saving against stock clocks, CO₂.

Rank 0 keeps a :class:`RunTally` of the job-wide figures each energy log line's reductions already bring
(``runtime.energy_log.log_aggregate``: one more slot in the fixed-size vectors, each rank's energy over every
step since the previous line whatever its phase, and the steps it counts), so the totals cost no collective
of their own and none at close. When the run ends (``EnergyLogger.close``: a normal exit, or an exception
that ends in the launcher's ``atexit``), rank 0 prints one ``[energy] run totals`` line and appends a
:class:`RunTotals` record (``"record": "run totals"``) to ``--energy-log-file``:

- the energy in kWh (``measured`` from the GPUs' counters, ``modelled`` on simulated GPUs) over the
  iterations the lines covered (those after the last line are named by the log itself and left out);
- Wh per token, tokens = global batch × sequence length × iterations (``None`` when the job's shape is
  unknown);
- the saving against stock clocks in kWh: what the run's iterations would have cost at stock clocks (the
  stock baseline's mean energy per iteration of every GPU, times the iterations) less what they cost. The
  run's energy is counted in full, so the uncertainty is the stock mean's: its 95 % interval
  (``stats.mean_interval`` over the baseline's samples, grouped as the log groups them,
  ``log_window.block_size``) widened by the drift inside the baseline (``stats.baseline_drift``), as every
  change against stock clocks is stated (``stats``); "within noise" when it covers zero;
- CO₂ in kg (and the saving's) at ``--energy-grid-gco2-per-kwh``, when given.

Megatron's own ``--log-energy`` prints ``Total training energy (GPU): X MJ`` at the end of ``train()``: the
same NVML counter (``nvmlDeviceGetTotalEnergyConsumption``) summed over the same GPUs, from the loop's start,
paused during evaluation and checkpoint saving. The totals line then gives ours in MJ beside it and says so.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from megatron_energy.runtime.energy_log.energy_line import JobInterval, StockSamples, written_time
from megatron_energy.runtime.energy_log.log_window import block_size
from megatron_energy.stats import RelativeChange, Source, baseline_drift, block_means, mean_interval

RECORD = "run totals"
"""The ``"record"`` value of the record's line."""
J_PER_KWH = 3.6e6
"""Joules in a kilowatt-hour."""
CONFIDENCE = 0.95
"""The saving's interval's confidence level."""


@dataclass(frozen=True)
class SavingVsStock:
    """The run's energy saving against stock clocks (positive: less energy than at stock clocks)."""

    kwh: float
    """Stock energy per iteration × the run's iterations, less the run's energy (every GPU)."""
    low_kwh: float
    """Lower end of its 95 % interval."""
    high_kwh: float
    """Upper end of its 95 % interval."""
    fraction: float
    """The saving as a fraction of the stock energy (0.1: 10 % less)."""
    resolved: bool
    """Whether the interval excludes zero with enough samples on both sides (``RelativeChange``)."""
    source: Source
    """``measured`` or ``modelled``, as the run's energy."""
    stock_iterations: int
    """Stock baseline iterations the comparison rests on."""


@dataclass(frozen=True)
class RunTotals:
    """The whole run's totals over every GPU of the job, as ``--energy-log-file`` holds them."""

    first_iteration: int
    """The first iteration the totals cover, 1-based."""
    last_iteration: int
    """The last, 1-based."""
    iterations: int
    """Iterations covered."""
    gpus: int
    """GPUs the energy sums over."""
    energy_kwh: float
    """Energy of every GPU over those iterations."""
    source: Source
    """``measured`` (energy counters) or ``modelled`` (simulated GPUs)."""
    tokens: int | None = None
    """Global batch × sequence length × iterations; ``None`` when the job's shape is unknown."""
    wh_per_token: float | None = None
    """Energy per token in Wh; ``None`` without tokens."""
    saving: SavingVsStock | None = None
    """The saving against stock clocks; ``None`` without a stock baseline."""
    grid_gco2_per_kwh: float | None = None
    """``--energy-grid-gco2-per-kwh``; ``None``: no CO₂ figures."""
    co2_kg: float | None = None
    """The energy's CO₂ at that intensity."""
    co2_saved_kg: float | None = None
    """The saving's CO₂ at that intensity (``None`` without a saving)."""
    megatron_log_energy: bool = False
    """Megatron's ``--log-energy`` was on: its own total is printed beside ours."""
    job: str = ""
    """The job's fingerprint."""
    time_utc: str = ""
    """When the record was written (ISO 8601, UTC, seconds); set on writing when empty."""

    def line(self) -> str:
        """The ``[energy] run totals`` log line."""
        parts = [
            f"[energy] run totals, iterations {self.first_iteration}-{self.last_iteration} over {self.gpus} "
            f"GPU(s) ({self.source}): {self.energy_kwh:.4g} kWh"
        ]
        if self.wh_per_token is not None and self.tokens is not None:
            parts.append(f"{self.wh_per_token:.4g} Wh/token ({self.tokens:,} tokens)")
        saving = self.saving
        if saving is None:
            parts.append("saving vs stock clocks: no stock baseline was measured")
        else:
            less = f"{100 * abs(saving.fraction):.1f} % {'less' if saving.fraction >= 0 else 'more'}"
            spread = (
                f"95 % CI {saving.low_kwh:.4g} to {saving.high_kwh:.4g} kWh"
                if saving.high_kwh > saving.low_kwh
                else "no noise in modelled figures"
            )
            verdict = "" if saving.resolved else ", within noise"
            parts.append(
                f"saving vs stock clocks, profiling included: {saving.kwh:.4g} kWh ({less} energy; "
                f"{saving.source}, {spread}{verdict}, against {saving.stock_iterations} stock iterations)"
            )
        if self.co2_kg is not None:
            co2 = f"CO2 {self.co2_kg:.4g} kg at {self.grid_gco2_per_kwh:g} g/kWh"
            if self.co2_saved_kg is not None:
                co2 += f" (saved {self.co2_saved_kg:.4g} kg)"
            parts.append(co2)
        if self.megatron_log_energy:
            parts.append(
                f"{self.energy_kwh * J_PER_KWH / 1e6:.3f} MJ beside Megatron's --log-energy 'Total training "
                "energy (GPU)': the same NVML counter over the same GPUs, which Megatron also counts before "
                f"iteration {self.first_iteration} and after {self.last_iteration}, and pauses during "
                "evaluation and checkpoint saving"
            )
        return " | ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The record's line as a JSON object (the time of writing filled in)."""
        data = asdict(self)
        data["time_utc"] = written_time(self.time_utc)
        return {"record": RECORD, **data}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunTotals:
        """The record of a line written by :meth:`to_json`.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not such a record.
        """
        if data["record"] != RECORD:
            raise ValueError(f"a {data['record']!r} record, not a {RECORD!r} one")
        fields = {name: value for name, value in data.items() if name != "record"}
        saving = fields.pop("saving")
        return cls(**fields, saving=None if saving is None else SavingVsStock(**saving))


class RunTally:
    """Rank 0's running sums of the job-wide figures of each energy log line (see the module docstring)."""

    def __init__(self) -> None:
        self.energy_j = 0.0
        self.iterations = 0
        self.gpus = 0
        self.first_iteration: int | None = None
        self.last_iteration = 0
        self.stock: StockSamples | None = None

    def add(
        self, job: JobInterval, first_iteration: int, last_iteration: int, stock: StockSamples | None
    ) -> None:
        """Count one line's steps (every phase) and keep the latest stock baseline."""
        if job.run_steps <= 0:
            return
        self.energy_j += job.run_j
        self.iterations += job.run_steps
        self.gpus = job.gpus
        if self.first_iteration is None:
            self.first_iteration = first_iteration
        self.last_iteration = last_iteration
        if stock is not None and stock.energy_j:
            self.stock = stock

    def totals(
        self,
        source: Source,
        tokens_per_iteration: int | None,
        grid_gco2_per_kwh: float | None,
        megatron_log_energy: bool = False,
        job: str = "",
    ) -> RunTotals | None:
        """The totals so far; ``None`` when no line counted a step."""
        if self.first_iteration is None or self.iterations == 0:
            return None
        kwh = self.energy_j / J_PER_KWH
        tokens = None if tokens_per_iteration is None else tokens_per_iteration * self.iterations
        saving = self._saving(source)
        co2 = None if grid_gco2_per_kwh is None else kwh * grid_gco2_per_kwh / 1e3
        return RunTotals(
            first_iteration=self.first_iteration,
            last_iteration=self.last_iteration,
            iterations=self.iterations,
            gpus=self.gpus,
            energy_kwh=kwh,
            source=source,
            tokens=tokens,
            wh_per_token=None if not tokens else 1e3 * kwh / tokens,
            saving=saving,
            grid_gco2_per_kwh=grid_gco2_per_kwh,
            co2_kg=co2,
            co2_saved_kg=None
            if grid_gco2_per_kwh is None or saving is None
            else saving.kwh * grid_gco2_per_kwh / 1e3,
            megatron_log_energy=megatron_log_energy,
            job=job,
        )

    def _saving(self, source: Source) -> SavingVsStock | None:
        """The saving against the stock baseline, with the stock mean's interval (module docstring)."""
        stock = self.stock
        if stock is None:
            return None
        blocks = block_means(stock.energy_j, block_size(stock.iteration_s, stock.counter_period_s))
        if not blocks:
            return None
        mean = mean_interval(blocks, CONFIDENCE)
        stock_kwh = mean.mean * self.iterations / J_PER_KWH
        if stock_kwh <= 0:
            return None
        drift = baseline_drift(blocks)
        ratio = self.energy_j / J_PER_KWH / stock_kwh
        change = RelativeChange(
            change=ratio - 1.0,
            halfwidth=ratio * (mean.halfwidth / mean.mean + drift),
            n_baseline=len(blocks),
            n_treatment=self.iterations,
            confidence=CONFIDENCE,
            source=source,
            method="the stock mean's Student-t interval and drift; the run's energy counted in full",
            drift=drift,
        )
        saving_kwh = stock_kwh - self.energy_j / J_PER_KWH
        halfwidth_kwh = stock_kwh * (mean.halfwidth / mean.mean + drift)
        return SavingVsStock(
            kwh=saving_kwh,
            low_kwh=saving_kwh - halfwidth_kwh,
            high_kwh=saving_kwh + halfwidth_kwh,
            fraction=-change.change,
            resolved=change.excludes_zero,
            source=source,
            stock_iterations=len(stock.energy_j),
        )


def tokens_per_iteration(micro_batch_size: int, seq_length: int, microbatches: int, replicas: int) -> int:
    """Tokens one iteration trains: the global batch (micro batch × microbatches × replicas) × sequence."""
    return micro_batch_size * microbatches * replicas * seq_length


def read_run_totals(path: Path) -> list[RunTotals]:
    """The run totals records of a ``--energy-log-file``, in the order they were written (one per run).

    Raises:
        ValueError: A run totals line is not such a record.
    """
    records = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        data = json.loads(text)
        if data.get("record") != RECORD:
            continue
        try:
            records.append(RunTotals.from_json(data))
        except (KeyError, TypeError, ValueError) as problem:
            raise ValueError(f"{path}:{number} is not a run totals record ({problem})") from None
    return records
