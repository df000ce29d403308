"""A modelled saving's band: the interval its plan's saving spans over what the GPU spec does not pin down.

A plan's saving (``plan_outcome.plan_saving``) is modelled from one value of every spec figure. Where the
spec declares a range (``dvfs.spec_ranges``: an assumed switch latency, a memory power, calibrations that
disagree), the same plan and its stock baseline are priced again at the range's ends
(``optimisers.saving_band``); the band is the lowest and highest saving over those variants and the nominal.
It is no statistical interval: it says how far the model's answer moves over the spec's declared ranges, not
how sure a measurement is. The plan file carries it (``saving_band``), so every output prints the same band
without pricing again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def energy_change(stock_j: float, planned_j: float) -> float:
    """The one definition of a plan's saving: its energy against stock clocks, ``planned / stock - 1``.

    Negative is a saving (-0.12: 12 % less). Every printed saving of a plan (the plan line of the log, the
    demo's table, ``simulate --compare``, ``report``) is this, of the plan file's latency-aware prediction,
    and so is every end of its band.
    """
    return planned_j / stock_j - 1.0


NOMINAL_TOLERANCE = 1e-9
"""How far outside its band a plan's own saving may lie (float rounding) before the file is refused."""


@dataclass(frozen=True)
class SavingBand:
    """The interval of a modelled energy change, as fractions like ``plan_saving`` (-0.12: 12 % less).

    Attributes:
        low: The lowest change over the variants (the largest saving).
        high: The highest change (the smallest saving).
        varied: The spec's range keys that were varied, in the spec's order; empty when it declares none.
    """

    low: float
    high: float
    varied: tuple[str, ...]

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low > self.high:
            raise ValueError(f"a saving band needs finite low <= high, got [{self.low!r}, {self.high!r}]")

    def holds(self, change: float) -> bool:
        """Whether ``change`` lies in the band (up to float rounding)."""
        return self.low - NOMINAL_TOLERANCE <= change <= self.high + NOMINAL_TOLERANCE

    def shifted(self, offset: float) -> SavingBand:
        """The band moved by ``offset``: the same width around another nominal (a run's mean change)."""
        return SavingBand(self.low + offset, self.high + offset, self.varied)

    def reversed(self) -> SavingBand:
        """The band of the opposite change: ``a / b - 1`` from the band of ``b / a - 1``, end for end."""
        return SavingBand(1 / (1 + self.high) - 1, 1 / (1 + self.low) - 1, self.varied)

    def to_json(self) -> dict[str, Any]:
        """The band as the plan file holds it."""
        return {"low": self.low, "high": self.high, "varied": list(self.varied)}

    @classmethod
    def from_json(cls, data: object, nominal: float) -> SavingBand:
        """Read a plan file's band and check that it holds the plan's own saving ``nominal``.

        Raises:
            TypeError: A field has the wrong type.
            ValueError: The ends are not finite and ordered, or the nominal lies outside them.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"saving_band must be an object, got {data!r}")
        ends = [data["low"], data["high"]]
        if any(isinstance(end, bool) or not isinstance(end, int | float) for end in ends):
            raise TypeError(f"saving_band.low and .high must be numbers, got {ends}")
        varied = data["varied"]
        if not isinstance(varied, list) or not all(isinstance(key, str) for key in varied):
            raise TypeError(f"saving_band.varied must be a list of range keys, got {varied!r}")
        band = cls(float(ends[0]), float(ends[1]), tuple(varied))
        if not band.holds(nominal):
            raise ValueError(
                f"saving_band [{band.low:g}, {band.high:g}] does not hold the plan's own saving {nominal:g}"
            )
        return band
