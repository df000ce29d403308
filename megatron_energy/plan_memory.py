"""The memory clock of a plan: one per pipeline rank, static over the run phase (Plan v2's optional field).

A memory clock switch is slow (the driver retrains the memory interface; it may flush in-flight work), so a
plan does not switch it per instruction or phase: each rank locks its memory clock once when the run phase
starts and the clock guard restores the stock one at exit, like the SM clocks. A plan whose ranks all run at
the stock (top) memory clock carries no field, so its file is the one written before the lever existed.

This module writes and reads the field and checks it against the GPU spec's supported memory clocks: a
clock the GPU does not list is refused with a message naming the supported ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.errors import EnergyValueError

FIELD = "memory_clocks_mhz"
"""The plan file's key: one memory clock (MHz) per pipeline rank."""


def memory_clocks_json(clocks: Sequence[int]) -> dict[str, Any]:
    """The plan file's entry for ``clocks``: none when every rank keeps the stock memory clock."""
    return {FIELD: list(clocks)} if clocks else {}


def parse_memory_clocks(value: object, num_stages: int) -> tuple[int, ...]:
    """The memory clocks of a plan file's entry (``None``: the field is absent, every rank at stock).

    Raises:
        TypeError: The entry is not a list of integers.
        ValueError: A clock is not positive, or the list does not give one clock per rank.
    """
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TypeError(f"{FIELD} must be a list of MHz, one per pipeline rank, got {value!r}")
    for clock in value:
        if isinstance(clock, bool) or not isinstance(clock, int) or clock <= 0:
            raise ValueError(f"{FIELD} must hold positive integers (MHz), got {clock!r}")
    if len(value) != num_stages:
        raise ValueError(f"{FIELD} gives {len(value)} memory clocks for {num_stages} pipeline ranks")
    return tuple(value)


def memory_clock_problem(clocks: Sequence[int], spec: GpuSpec) -> str | None:
    """Why ``clocks`` (one per rank) cannot run on ``spec``'s GPU; ``None`` when every one is supported."""
    supported = spec.memory_clocks_mhz
    for stage, clock in enumerate(clocks):
        if clock not in supported:
            listed = ", ".join(str(mhz) for mhz in supported)
            return (
                f"rank {stage}'s memory clock {clock} MHz is not one of {spec.name}'s supported memory "
                f"clocks ({listed} MHz)"
            )
    return None


def check_memory_clocks(clocks: Sequence[int], gpu_name: str) -> None:
    """Refuse memory clocks the plan's GPU (its spec, by name) does not support.

    Raises:
        EnergyValueError: The GPU has no spec to check against, or a clock is not among its memory clocks.
    """
    if not clocks:
        return
    try:
        spec = load_gpu_spec(gpu_name)
    except ValueError:
        raise EnergyValueError(
            f"the plan sets memory clocks for GPU {gpu_name!r}, which has no GPU spec to check them against"
        ) from None
    problem = memory_clock_problem(clocks, spec)
    if problem is not None:
        raise EnergyValueError(problem)
