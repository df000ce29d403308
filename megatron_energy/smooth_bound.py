"""The bound a ``smooth:`` target puts on a job's power swing, in the form grid operators use, and its parser.

``--energy-target smooth:floor=0.8,ramp=3000,job-ramp=5e6@16384,slowdown=0.05`` reads, every key optional
but at least one bound:

- ``floor=F`` (0 < F <= 1): no GPU's binned power below ``F`` times the iteration's peak, the highest bin of
  the busiest GPU (a share of the peak, as GB200's firmware power floor and ``sim.swing_cases``' filler floor
  hold it);
- ``ramp=R``: no GPU's power rises or falls faster than ``R`` W/s between adjacent bins;
- ``job-ramp=J@N``: the job's power, ``N`` GPUs with their data-parallel replicas in phase (the worst case),
  rises or falls no faster than ``J`` W/s (``5e6@16384``: 5 MW/s at 16k GPUs);
- ``slowdown=X`` (0 < X < 1): the time bound, as ``slowdown:X``; without it the plan keeps the iteration
  time of stock clocks (iso-time).

Power is read at :data:`~megatron_energy.power_swing.DEFAULT_RESOLUTION_S` bins (20 ms), as
:func:`~megatron_energy.power_swing.swing_figures` reads it. The parsed bound is typed
(:class:`SmoothBound`); its ``str`` is the flag's value again.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from megatron_energy.power_swing import DEFAULT_RESOLUTION_S

USAGE = (
    "use smooth:KEY=VALUE,... with at least one of floor=F (0 < F <= 1: no GPU's power below F times its "
    "peak), ramp=R (W/s per GPU), job-ramp=J@N (W/s for the job of N GPUs in phase), and optionally "
    "slowdown=X (0 < X < 1; default iso-time), e.g. smooth:floor=0.8 or smooth:ramp=3000,slowdown=0.05"
)
"""What a ``smooth:`` target looks like; every refusal of one ends with it."""


@dataclass(frozen=True)
class SmoothBound:
    """A bound on a job's power swing (see the module docstring); at least one of the three is set."""

    floor_share: float | None = None
    """Each GPU's binned power stays at least this share of the busiest one's peak bin; ``None``: no floor."""

    ramp_w_per_s: float | None = None
    """The largest rise or fall of one GPU's power between adjacent bins, in W/s; ``None``: no limit."""

    job_ramp_w_per_s: float | None = None
    """The largest rise or fall of the job's power (``job_gpus`` GPUs in phase) in W/s; ``None``: no limit."""

    job_gpus: int | None = None
    """GPUs the job ramp is counted over (replicas in phase); set exactly when ``job_ramp_w_per_s`` is."""

    resolution_s: float = DEFAULT_RESOLUTION_S
    """The bin width power is read at (grid operators' figures; 20 ms)."""

    def __post_init__(self) -> None:
        if self.floor_share is None and self.ramp_w_per_s is None and self.job_ramp_w_per_s is None:
            raise ValueError("a smooth bound needs a floor, a ramp or a job ramp")
        if self.floor_share is not None and not 0.0 < self.floor_share <= 1.0:
            raise ValueError(f"the floor share must be in (0, 1], got {self.floor_share!r}")
        for name, value in (("ramp", self.ramp_w_per_s), ("job ramp", self.job_ramp_w_per_s)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"the {name} must be positive and finite W/s, got {value!r}")
        if (self.job_ramp_w_per_s is None) != (self.job_gpus is None):
            raise ValueError("a job ramp and its GPU count come together")
        if self.job_gpus is not None and self.job_gpus < 1:
            raise ValueError(f"a job ramp needs at least one GPU, got {self.job_gpus!r}")
        if not (math.isfinite(self.resolution_s) and self.resolution_s > 0):
            raise ValueError(f"the resolution must be positive seconds, got {self.resolution_s!r}")

    def __str__(self) -> str:
        parts = []
        if self.floor_share is not None:
            parts.append(f"floor={self.floor_share:g}")
        if self.ramp_w_per_s is not None:
            parts.append(f"ramp={self.ramp_w_per_s:g}")
        if self.job_ramp_w_per_s is not None:
            parts.append(f"job-ramp={self.job_ramp_w_per_s:g}@{self.job_gpus}")
        return ",".join(parts)


def parse_smooth(text: str, body: str) -> tuple[SmoothBound, float]:
    """Parse the ``KEY=VALUE,...`` of ``smooth:KEY=VALUE,...``.

    Args:
        text: The whole flag value (for messages).
        body: What follows ``smooth:``, lower-cased.

    Returns:
        The bound, and the allowed slowdown (0 for iso-time).

    Raises:
        argparse.ArgumentTypeError: An unknown, repeated or malformed key, or no bound at all.
    """
    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or key not in ("floor", "ramp", "job-ramp", "slowdown") or key in values:
            what = "repeated" if key in values else "not a key=value of smooth"
            raise argparse.ArgumentTypeError(f"'{text}': '{item}' is {what}; {USAGE}")
        values[key] = value.strip()
    try:
        slowdown = _number(values["slowdown"]) if "slowdown" in values else 0.0
        if "slowdown" in values and not 0.0 < slowdown < 1.0:
            raise ValueError("the slowdown must be strictly between 0 and 1")
        job_ramp, job_gpus = _job_ramp(values["job-ramp"]) if "job-ramp" in values else (None, None)
        bound = SmoothBound(
            floor_share=_number(values["floor"]) if "floor" in values else None,
            ramp_w_per_s=_number(values["ramp"]) if "ramp" in values else None,
            job_ramp_w_per_s=job_ramp,
            job_gpus=job_gpus,
        )
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"'{text}': {error}; {USAGE}") from None
    return bound, slowdown


def _number(value: str) -> float:
    """A finite number, or a ValueError naming the text."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"'{value}' is not a finite number")
    return number


def _job_ramp(value: str) -> tuple[float, int]:
    """``J@N``: the job's ramp in W/s and its GPU count."""
    ramp, at, gpus = value.partition("@")
    if not at or not gpus.strip().isdigit():
        raise ValueError(f"job-ramp '{value}' needs the job's GPU count: job-ramp=J@N, e.g. 5e6@16384")
    return _number(ramp), int(gpus)
