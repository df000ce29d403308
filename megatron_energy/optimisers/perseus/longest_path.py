"""Earliest and latest starts on a DAG whose node indices are topological: the passes the frontier repeats.

A pipeline DAG's nodes have one or two predecessors and successors each (the source and sink aside), so the
passes read the first two neighbours of every node as a pair (:func:`neighbour_pairs`) and take their
maximum or minimum with one comparison: about twice as fast in CPython as ``max`` over a list per node.
"""

from __future__ import annotations

from collections.abc import Sequence

Pairs = list[tuple[int, int] | None]
"""Per node, its two neighbours (the one twice if it has one); ``None`` if it has none or more than two."""


def neighbour_pairs(neighbours: Sequence[Sequence[int]]) -> Pairs:
    """The :data:`Pairs` of adjacency lists (predecessors or successors by node)."""
    return [(near[0], near[-1]) if 1 <= len(near) <= 2 else None for near in neighbours]


def earliest_starts(preds: Sequence[Sequence[int]], pairs: Pairs, durations: Sequence[float]) -> list[float]:
    """ASAP start of every node (0 for nodes without predecessors).

    Args:
        preds: Predecessor indices by node.
        pairs: ``neighbour_pairs(preds)``.
        durations: Duration by node.
    """
    end = [0.0] * len(durations)
    start = [0.0] * len(durations)
    for v, pair in enumerate(pairs):
        if pair is not None:
            first, second = end[pair[0]], end[pair[1]]
            begin = first if first > second else second
        else:
            begin = max([end[u] for u in preds[v]]) if preds[v] else 0.0
        start[v] = begin
        end[v] = begin + durations[v]
    return start


def latest_starts(
    succs: Sequence[Sequence[int]], pairs: Pairs, durations: Sequence[float], makespan_s: float
) -> list[float]:
    """Latest start of every node that lets every node without successors end by ``makespan_s``.

    Args:
        succs: Successor indices by node.
        pairs: ``neighbour_pairs(succs)``.
        durations: Duration by node.
        makespan_s: The time by which nodes without successors must end.
    """
    latest = [0.0] * len(durations)
    for v in range(len(durations) - 1, -1, -1):
        pair = pairs[v]
        if pair is not None:
            first, second = latest[pair[0]], latest[pair[1]]
            latest[v] = (first if first < second else second) - durations[v]
        else:
            latest[v] = (min([latest[w] for w in succs[v]]) if succs[v] else makespan_s) - durations[v]
    return latest
