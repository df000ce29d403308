"""Merging phases too short to hold their own clock under the switch latency.

A clock switch takes up to ``L`` seconds to land. :mod:`.switching` requests a switch to a higher clock
``L`` before its phase and one to a lower clock at its phase's start, so two requests never overlap (and
always land in order) only when every phase lasts at least ``2 L``; shorter phases cannot be given a clock of
their own. :func:`merge_short_phases` merges each phase shorter than the minimum into the shorter of its
neighbours (their work adds), shortest first, until every phase is long enough or one phase is left.
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron_energy.pipeline.phase_timeline import Phase

SWITCH_WINDOWS_PER_PHASE = 2.0
"""A phase must last this many switch latencies to hold its own clock (see the module docstring)."""


def min_phase_s(switch_latency_s: float, factor: float = SWITCH_WINDOWS_PER_PHASE) -> float:
    """The shortest phase that may hold its own clock under ``switch_latency_s``."""
    return factor * switch_latency_s


def merge(first: Phase, second: Phase) -> Phase:
    """Two adjacent phases as one (their work adds; ``mixed`` when their classes differ)."""
    kind = first.kind if first.kind == second.kind else "mixed"
    return Phase(kind, first.start_s, first.work + second.work, first.kernels + second.kernels)


def merge_short_phases(phases: Sequence[Phase], minimum_s: float) -> list[Phase]:
    """Merge phases shorter than ``minimum_s`` into neighbours (see the module docstring).

    Args:
        phases: Phases in time order.
        minimum_s: The shortest phase allowed (:func:`min_phase_s`).

    Returns:
        Phases in time order, each at least ``minimum_s`` long unless only one is left; total work unchanged.
    """
    merged = list(phases)
    while len(merged) > 1:
        index = min(range(len(merged)), key=lambda i: merged[i].duration_s)
        if merged[index].duration_s >= minimum_s:
            break
        if index == 0:
            partner = 1
        elif index == len(merged) - 1:
            partner = index - 1
        else:
            before, after = merged[index - 1], merged[index + 1]
            partner = index - 1 if before.duration_s <= after.duration_s else index + 1
        low, high = sorted((index, partner))
        merged[low : high + 1] = [merge(merged[low], merged[high])]
    return merged
