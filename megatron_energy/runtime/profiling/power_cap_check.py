"""Rank 0's power-cap check: the clock instructions held at the power cap ran at, against the model's.

The planning replica's ranks each send a ``PowerCapSamples`` (``runtime.profiling.power_cap_watch``),
gathered once over its pipeline at profiling's end. Per instruction kind, :func:`power_cap_check` sets the
median clock read while held at the cap (measured on GPUs; on a simulated GPU its own clock, modelled)
against the median of the clocks the model predicts for the same reads (modelled, from the instruction
classes' work as the profile fitted it, on the GPU spec named). :func:`check_line` is the one line rank 0
prints, only when some read was held at the cap; ``runtime.energy_log.power_cap_record`` keeps the same
figures in the energy log.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.runtime.profiling.power_cap_watch import CappedWork, PowerCapSamples
from megatron_energy.stats import Source

CLOCK_LABEL: dict[Source, tuple[str, str]] = {
    "measured": ("measured", "measured"),
    "modelled": ("simulated GPU: modelled", "simulated GPU"),
}
"""How the line names where the clocks read come from: beside a clock, and after the model's difference."""


@dataclass(frozen=True)
class KindCheck:
    """One instruction kind's reads held at the power cap, over the planning replica."""

    kind: str
    """``forward``, ``backward`` or ``fused``."""
    classes: int
    """Instruction classes (stage, chunk) of the kind seen held at the cap."""
    capped_reads: int
    """Reads held at the cap."""
    reads: int
    """Reads of those classes in all."""
    measured_mhz: float
    """Median clock of the reads held at the cap (measured or modelled: ``PowerCapCheck.clock_source``)."""
    modelled_mhz: float
    """Median of the model's clock for the same reads (modelled)."""

    @property
    def model_change(self) -> float:
        """The model's clock relative to the one read: ``modelled / measured - 1``."""
        return self.modelled_mhz / self.measured_mhz - 1.0


@dataclass(frozen=True)
class PowerCapCheck:
    """The power-cap check of one job's profiling (see the module docstring)."""

    gpu_spec: str
    """The GPU spec whose model predicted the clocks."""
    stock_clock_mhz: int
    """The clock the profiled steps asked for."""
    clock_source: Source
    """Where the clocks read come from: ``measured`` (NVML on GPUs) or ``modelled`` (simulated GPUs)."""
    kinds: tuple[KindCheck, ...]
    """Per instruction kind seen held at the cap, in the order forward, backward, fused."""


def power_cap_check(
    gathered: Sequence[PowerCapSamples | None], gpu_spec: str, stock_clock_mhz: int, clock_source: Source
) -> PowerCapCheck | None:
    """The check over the planning replica's samples; ``None`` when no read was held at the power cap.

    Args:
        gathered: Each stage's samples (``None`` for a rank without a watch).
        gpu_spec: The GPU spec of the model's predictions.
        stock_clock_mhz: The stock clock.
        clock_source: Where the clocks read come from.
    """
    by_kind: dict[str, list[CappedWork]] = defaultdict(list)
    for samples in gathered:
        for capped in () if samples is None else samples.capped:
            by_kind[capped.kind].append(capped)
    kinds = tuple(_kind_check(kind, by_kind[kind]) for kind in _ordered(by_kind))
    return PowerCapCheck(gpu_spec, stock_clock_mhz, clock_source, kinds) if kinds else None


def _ordered(kinds: dict[str, list[CappedWork]]) -> list[str]:
    order = {"forward": 0, "backward": 1}
    return sorted(kinds, key=lambda kind: (order.get(kind, 2), kind))


def _kind_check(kind: str, classes: Sequence[CappedWork]) -> KindCheck:
    measured = [clock for capped in classes for clock in capped.clocks_mhz]
    modelled = [capped.predicted_mhz for capped in classes for _ in capped.clocks_mhz]
    return KindCheck(
        kind=kind,
        classes=len(classes),
        capped_reads=len(measured),
        reads=sum(capped.reads for capped in classes),
        measured_mhz=float(statistics.median(measured)),
        modelled_mhz=float(statistics.median(modelled)),
    )


def check_line(check: PowerCapCheck) -> str:
    """The one line rank 0 prints: per kind, the clock read at the cap against the model's."""
    label, short = CLOCK_LABEL[check.clock_source]
    parts = [
        f"{kind.kind} held at the power cap in {kind.capped_reads} of {kind.reads} reads ({kind.classes} "
        f"instruction class{'es' if kind.classes > 1 else ''}) ran at {kind.measured_mhz:.0f} MHz (median, "
        f"{label}) where the model predicts {kind.modelled_mhz:.0f} MHz (median, modelled, "
        f"{check.gpu_spec}): model {round(100 * kind.model_change, 1) + 0.0:+.1f} % vs {short}"
        for kind in check.kinds
    ]
    return f"[energy] power-cap check at the stock clock ({check.stock_clock_mhz} MHz): " + "; ".join(parts)


def unavailable_line(gathered: Sequence[PowerCapSamples | None]) -> str | None:
    """One line naming the ranks on which the check could not be made, and why; ``None`` if none."""
    ranks_by_reason: dict[str, list[int]] = defaultdict(list)
    for samples in gathered:
        if samples is not None and samples.unavailable is not None:
            ranks_by_reason[samples.unavailable].append(samples.global_rank)
    if not ranks_by_reason:
        return None
    reasons = "; ".join(
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {reason}"
        for reason, ranks in ranks_by_reason.items()
    )
    return f"[energy] power-cap check unavailable ({reasons}); training goes on without it"
