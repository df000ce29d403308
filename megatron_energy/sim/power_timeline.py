"""Each GPU's power over a simulated iteration: the plan's power as the model prices it (*modelled*).

The simulator's slices give each compute node's time and energy on its stage; between them the GPU draws
blocked power (before its last compute node) or idle power (after it), and over its iteration tail the tail's
energy spread evenly. A node that started at a stale clock (switch latency) is two pieces, each at its own
power. The trace of a stage integrates to exactly the stage's energy in the simulated iteration.
"""

from __future__ import annotations

import numpy as np

from megatron_energy.power_swing import PowerTrace
from megatron_energy.sim.simulator import SimResult, Slice, StagePowers

TAIL_KINDS = frozenset({"dp_sync", "optimizer", "outside"})
"""Slice kinds of a stage's iteration tail."""


def stage_power_traces(result: SimResult, powers: StagePowers) -> list[PowerTrace]:
    """The power of every stage's GPU over one simulated iteration (*modelled*), stage by stage.

    Args:
        result: A simulated iteration.
        powers: The blocked and idle power the simulator charged (``Simulator.powers``).

    Returns:
        One trace per stage from 0 to the iteration time.
    """
    traces = []
    for stage in result.stages:
        slices = [piece for piece in result.timeline if piece.stage == stage.stage]
        pieces = [part for piece in slices if piece.clock_mhz is not None for part in _compute_parts(piece)]
        tail_w = stage.tail_energy_j / stage.tail_s if stage.tail_s > 0 else 0.0
        pieces += [
            (p.start_s, p.end_s, tail_w) for p in slices if p.kind in TAIL_KINDS and p.end_s > p.start_s
        ]
        last_compute_end = max((p.end_s for p in slices if p.clock_mhz is not None), default=0.0)
        traces.append(_with_gaps_filled(pieces, result.iteration_time_s, last_compute_end, powers))
    return traces


def _compute_parts(piece: Slice) -> list[tuple[float, float, float]]:
    """A compute slice as ``(start, end, power)`` pieces: its stale-clock part first, when it has one."""
    duration = piece.end_s - piece.start_s
    if duration <= 0:
        return []
    stale_s = min(piece.stale_s, duration) if piece.stale_clock_mhz is not None else 0.0
    if stale_s <= 0:
        return [(piece.start_s, piece.end_s, piece.energy_j / duration)]
    split = piece.start_s + stale_s
    parts = [(piece.start_s, split, piece.stale_energy_j / stale_s)]
    if piece.end_s > split:
        parts.append((split, piece.end_s, (piece.energy_j - piece.stale_energy_j) / (piece.end_s - split)))
    return parts


def _with_gaps_filled(
    pieces: list[tuple[float, float, float]],
    iteration_s: float,
    last_compute_end_s: float,
    powers: StagePowers,
) -> PowerTrace:
    """A step function over ``[0, iteration_s]``: the pieces, and blocked or idle power between them."""
    edges: list[float] = [0.0]
    power: list[float] = []

    def hold(until_s: float, watts: float) -> None:
        if until_s > edges[-1] + 1e-12:
            edges.append(until_s)
            power.append(watts)

    def gap(until_s: float) -> None:
        blocked_until = min(until_s, last_compute_end_s)
        hold(blocked_until, powers.blocked_power_w)
        hold(until_s, powers.idle_power_w)

    for start, end, watts in sorted(pieces):
        gap(start)
        hold(end, watts)
    gap(iteration_s)
    return PowerTrace(np.array(edges), np.array(power), "modelled")
