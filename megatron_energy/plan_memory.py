"""The memory clock of a plan: one per pipeline rank, static over the run phase (an optional plan field).

A memory clock switch is slow (the driver retrains the memory interface; it may flush in-flight work), so a
plan does not switch it per instruction or phase: each rank locks its memory clock once when the run phase
starts and the clock guard restores the stock one at exit, like the SM clocks. A plan whose ranks all run at
the stock (top) memory clock carries no field, so its file is the one written before the lever existed.

This module checks the field (``plan_file`` reads and writes it) against the GPU spec's supported memory
clocks: a clock the GPU does not list is refused with a message naming the supported ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.errors import EnergyValueError


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
