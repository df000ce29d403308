"""What each ``EnergyConfig`` value may be: one check per value, shared by the flag parser and the config.

A check takes a parsed value and returns what is wrong with it and what to give instead, or ``None``. Each
field names its check in its flag (``flag.EnergyFlag.check``): the flag's ``argparse`` type parses the text
and calls it, and ``EnergyConfig`` calls it when it is constructed, so a config built in code is held to the
rules a command line is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

MIN_GRID_MHZ = 100
MAX_GRID_MHZ = 4000

STOCK_CLOCK_MODES: tuple[str, ...] = ("kareus", "kernel")
"""Modes that, alone, keep every instruction at its stock clock: they cannot trade time for power."""

type Check = Callable[[object], str | None]
"""A value check: what is wrong with the value, or ``None``."""


def whole_number_problem(value: object) -> str | None:
    """Why ``value`` is not a whole number >= 1, or ``None``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return "must be a whole number >= 1"
    return None


def fraction_problem(value: object) -> str | None:
    """Why ``value`` is not a fraction strictly between 0 and 1, or ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value < 1.0:
        return "must be a fraction strictly between 0 and 1, e.g. 0.05"
    return None


def block_problem(value: object) -> str | None:
    """Why ``value`` is neither 0 (off) nor a block of at least 2 iterations, or ``None``."""
    if isinstance(value, bool) or not isinstance(value, int) or (value != 0 and value < 2):
        return "must be 0 (off) or a block of at least 2 iterations (the first of a block is left out)"
    return None


def grid_intensity_problem(value: object) -> str | None:
    """Why ``value`` is neither ``None`` (no CO₂ figure) nor a positive finite grid intensity, or ``None``."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        return "must be a positive finite number of grams of CO2 per kWh, e.g. 400"
    return None


def sample_period_problem(value: object) -> str | None:
    """Why ``value`` is neither 0 (off) nor a sampling period of 10-1000 ms, or ``None``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value == 0 or 10 <= value <= 1000)
    ):
        return (
            "must be 0 (off) or a period of 10-1000 ms (NVML refreshes the instant power about every 100 ms)"
        )
    return None


def clock_grid_problem(value: object) -> str | None:
    """Why ``value`` is not a profiling grid (``None`` for auto, or two or more plausible clocks in MHz)."""
    if value is None:
        return None
    if not isinstance(value, tuple) or not all(isinstance(c, int) and not isinstance(c, bool) for c in value):
        return "must be a tuple of SM clocks in MHz, or None for the GPU's own clocks"
    if len(set(value)) < 2:
        return "has fewer than two distinct clocks; a frontier needs at least two, or use 'auto'"
    bad = sorted(c for c in value if not MIN_GRID_MHZ <= c <= MAX_GRID_MHZ)
    if bad:
        return (
            f"has clock(s) {bad} MHz outside {MIN_GRID_MHZ}-{MAX_GRID_MHZ} MHz; give SM clocks in MHz "
            "(see `nvidia-smi -q -d SUPPORTED_CLOCKS`) or 'auto'"
        )
    return None


def choice_check(choices: Sequence[str]) -> Check:
    """A check that ``value`` is one of ``choices``."""

    def problem(value: object) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"

    return problem


def power_target_problem(mode: str, target: str) -> str | None:
    """Why ``--energy-mode mode`` cannot plan a ``power`` target ``target``, or ``None``.

    A power budget picks the fastest point of the clock frontier within it; a mode that keeps stock clocks
    has no such point to pick.
    """
    if mode not in STOCK_CLOCK_MODES or not target.startswith("power:"):
        return None
    return (
        f"--energy-target {target} needs a planner that trades time for power on the clock frontier, but "
        f"--energy-mode {mode} alone keeps stock clocks; use --energy-mode perseus or all with a power budget"
    )


def smooth_target_problem(mode: str, kind: str, target: str) -> str | None:
    """Why ``--energy-mode mode`` cannot plan a ``smooth`` target ``target`` (of kind ``kind``), or ``None``.

    Filler is placed on the pipeline simulator's power timeline of the clock plan (``perseus.smooth_point``);
    the collective and phase optimisers price their plans with other models that have no power timeline.
    """
    if kind != "smooth" or mode not in STOCK_CLOCK_MODES:
        return None
    return (
        f"--energy-target {target} is planned on the clock planner's power timeline, which --energy-mode "
        f"{mode} does not price; use --energy-mode perseus or all (all then keeps the clock plan alone)"
    )


def power_floor_problem(target: str, power_w: float, spec_name: str, idle_power_w: float) -> str | None:
    """Why a power budget of ``power_w`` W per GPU is out of reach on the GPU ``spec_name``, or ``None``.

    Known before profiling: a GPU draws at least its idle power (the spec's, also the static part of its busy
    power) at any clock, so no plan's average reaches below it. A budget above it may still be out of reach;
    that is known once the profile is planned (``perseus.power_point``).
    """
    if power_w >= idle_power_w:
        return None
    return (
        f"--energy-target {target}: no plan can meet it: a GPU draws at least its idle power at any clock, "
        f"{idle_power_w:g} W for {spec_name} (GPU spec); give a budget of at least that, or use min-energy "
        "for the least energy"
    )
