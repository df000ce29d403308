"""Where on the time–energy frontier a plan should land: ``--energy-target`` and its parser.

The one target -> deadline rule of every optimiser (:meth:`EnergyTarget.deadline_s`) lives here, below the
config and the optimisers that both use it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Literal

from megatron_energy.errors import EnergyValueError
from megatron_energy.smooth_bound import SmoothBound, parse_smooth


@dataclass(frozen=True)
class EnergyTarget:
    """Where on the time–energy frontier the planner should land.

    ``iso-time`` keeps the iteration time of all-maximum clocks, ``min-energy`` takes the frontier's
    minimum-energy point, ``slowdown:X`` allows the iteration to become ``(1 + X)`` times longer, and
    ``power:W[,peak:P]`` takes the fastest point whose predicted average power per GPU is at most ``W`` watts
    (and whose most power-hungry instruction draws at most ``P`` watts, when given). ``smooth:...`` bounds the
    power swing (:mod:`megatron_energy.smooth_bound`) at the least energy within its time bound (iso-time, or
    ``slowdown=X``).
    """

    kind: Literal["iso-time", "min-energy", "slowdown", "power", "smooth"]
    """Which target this is."""

    slowdown: float = 0.0
    """The allowed relative slowdown for ``slowdown`` and ``smooth`` (0 < X < 1; 0 in ``smooth``: iso-time); 0
    for the other kinds."""

    power_w: float = 0.0
    """The average power budget per GPU in watts for ``power``; 0 for the other kinds."""

    peak_w: float | None = None
    """The optional cap on any instruction's predicted power per GPU for ``power``; ``None`` for no cap."""

    smooth: SmoothBound | None = None
    """The bound on the power swing for ``smooth``; ``None`` for the other kinds."""

    def __post_init__(self) -> None:
        if (self.kind == "smooth") != (self.smooth is not None):
            raise EnergyValueError("a smooth target, and only a smooth target, carries a smooth bound")

    def deadline_s(self, fastest_s: float) -> float:
        """The longest iteration this target allows; the one target -> deadline rule of every optimiser.

        Args:
            fastest_s: The iteration time at stock clocks (every instruction at its fastest clock).

        Returns:
            ``fastest_s`` for ``iso-time``, ``(1 + X)`` times it for ``slowdown:X``, ``inf`` for
            ``min-energy`` (no bound); a ``smooth`` target's time bound alike (iso-time, or its slowdown).

        Raises:
            EnergyValueError: For a ``power`` target, which has no deadline: it picks the fastest point of the
                clock frontier within its budget (``perseus.power_point``).
        """
        if self.kind == "power":
            raise EnergyValueError(
                f"--energy-target {self}: a power budget picks the fastest frontier point within it and has "
                "no deadline; plan it with --energy-mode perseus or all"
            )
        if self.kind == "min-energy":
            return math.inf
        return fastest_s * (1.0 + self.slowdown)

    def __str__(self) -> str:
        if self.kind == "slowdown":
            return f"slowdown:{self.slowdown:g}"
        if self.kind == "power":
            peak = "" if self.peak_w is None else f",peak:{self.peak_w:g}"
            return f"power:{self.power_w:g}{peak}"
        if self.smooth is not None:
            slowdown = f",slowdown={self.slowdown:g}" if self.slowdown else ""
            return f"smooth:{self.smooth}{slowdown}"
        return self.kind


def parse_target(text: str) -> EnergyTarget:
    """Parse an ``--energy-target`` value.

    Args:
        text: ``iso-time``, ``min-energy``, ``slowdown:X`` with 0 < X < 1, ``power:W[,peak:P]`` or
            ``smooth:KEY=VALUE,...`` (:mod:`megatron_energy.smooth_bound`).

    Returns:
        The parsed target.

    Raises:
        argparse.ArgumentTypeError: the value is not one of the accepted forms.
    """
    value = text.strip().lower()
    if value.startswith("power:"):
        return _parse_power_target(text, value.removeprefix("power:"))
    if value.startswith("smooth:"):
        bound, slowdown = parse_smooth(text, value.removeprefix("smooth:"))
        return EnergyTarget(kind="smooth", slowdown=slowdown, smooth=bound)
    if value in ("iso-time", "min-energy"):
        return EnergyTarget(kind=value)  # type: ignore[arg-type]
    if value.startswith("slowdown:"):
        number = value.removeprefix("slowdown:")
        try:
            slowdown = float(number)
        except ValueError:
            slowdown = float("nan")
        if 0.0 < slowdown < 1.0:
            return EnergyTarget(kind="slowdown", slowdown=slowdown)
        raise argparse.ArgumentTypeError(
            f"'{text}': the slowdown must be a number strictly between 0 and 1, e.g. slowdown:0.05 "
            "for at most 5 % longer iterations"
        )
    raise argparse.ArgumentTypeError(
        f"'{text}' is not a target; use iso-time (same iteration time, the default), min-energy, "
        "slowdown:X with 0 < X < 1, power:W[,peak:P] (watts per GPU), or smooth:floor=F,ramp=R,job-ramp=J@N "
        "(a bound on the power swing)"
    )


def _parse_power_target(text: str, body: str) -> EnergyTarget:
    """Parse the ``W[,peak:P]`` of ``power:W[,peak:P]`` (watts per GPU, positive, peak not below W)."""
    average_text, _, rest = body.partition(",")
    peak_text = rest.strip().removeprefix("peak:") if rest else None
    usage = (
        f"'{text}': use power:W or power:W,peak:P with W the average and P the peak power per GPU in watts, "
        "e.g. power:450 or power:450,peak:600"
    )
    try:
        power_w = float(average_text)
        peak_w = None if peak_text is None else float(peak_text)
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None
    if rest and not rest.strip().startswith("peak:"):
        raise argparse.ArgumentTypeError(usage)
    if not (math.isfinite(power_w) and power_w > 0) or (
        peak_w is not None and not (math.isfinite(peak_w) and peak_w >= power_w)
    ):
        raise argparse.ArgumentTypeError(
            usage + "; both must be positive and finite, and the peak at least the average"
        )
    return EnergyTarget(kind="power", power_w=power_w, peak_w=peak_w)
