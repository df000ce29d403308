"""A starting basis for the relaxed frontier program: a longest-path tree, dual feasible by construction.

From the slack basis HiGHS' dual simplex must bring every event time ``τ`` into the basis one iteration at a
time (about 30,000 iterations on S=16 M=256 VPP=2). This basis has them basic from the start: every node but
the source hangs from the incoming edge that ends latest with every instruction at its slowest useful
duration (that edge's row is tight), so the ``τ`` and the tight rows form a spanning tree, which is
non-singular. Its row multipliers are the tree's flows: each tight row carries the ``τ`` costs of the subtree
below it (``y ≥ 0`` where those costs are), so every basic ``τ`` has reduced cost 0. A segment is put at its
upper bound where its reduced cost (its cost plus the flow leaving its node) is negative, else at its lower
bound: the basis is dual feasible and the dual simplex only repairs primal infeasibilities.
"""

from __future__ import annotations

import numpy as np

LOWER, BASIC, UPPER = 0, 1, 2
"""Basis statuses (HiGHS' numbering): nonbasic at the lower bound, basic, nonbasic at the upper bound."""


def tree_basis(
    edges: np.ndarray,
    lengths_s: np.ndarray,
    node_cost: np.ndarray,
    segment_node: np.ndarray,
    segment_cost: np.ndarray,
    segment_len_s: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The longest-path-tree basis of the program ``τ_u − τ_v + Σ_k δ_uk ≤ −length_uv`` (see the module).

    Args:
        edges: ``(u, v)`` per row; node indices are topological.
        lengths_s: Fixed time per row (the tail's fastest duration and any bypassed transfers).
        node_cost: Cost of every node's ``τ`` (the program's first columns).
        segment_node: Node of every segment column (the columns after the ``τ``), grouped by node.
        segment_cost: Cost of every segment column.
        segment_len_s: Upper bound of every segment column.

    Returns:
        The status of every column (``τ`` then segments) and of every row (:data:`LOWER`, :data:`BASIC`,
        :data:`UPPER`; a tight row is at its upper bound).
    """
    num_nodes = len(node_cost)
    slowest_s = lengths_s + np.bincount(segment_node, segment_len_s, minlength=num_nodes)[edges[:, 0]]
    order = np.argsort(edges[:, 1], kind="stable")
    first_in = np.searchsorted(edges[order, 1], np.arange(num_nodes + 1)).tolist()
    tails, ends = edges[order, 0].tolist(), slowest_s[order].tolist()
    start = [0.0] * num_nodes
    parent = [-1] * num_nodes  # position in ``order`` of the row each node hangs from
    for v in range(num_nodes):
        best = -1
        for k in range(first_in[v], first_in[v + 1]):
            if best < 0 or start[tails[k]] + ends[k] > start[v]:
                start[v], best = start[tails[k]] + ends[k], k
        parent[v] = best
    subtree = node_cost.tolist()
    flow = np.zeros(len(edges))
    for v in range(num_nodes - 1, -1, -1):
        if parent[v] >= 0:
            row = int(order[parent[v]])
            flow[row] = subtree[v]
            subtree[tails[parent[v]]] += subtree[v]
    leaving = np.bincount(edges[:, 0], flow, minlength=num_nodes)
    hangs = np.asarray(parent) >= 0
    columns = np.full(num_nodes + len(segment_node), LOWER, dtype=np.int64)
    columns[:num_nodes][hangs] = BASIC
    columns[num_nodes:][segment_cost + leaving[segment_node] < 0] = UPPER
    rows = np.full(len(edges), BASIC, dtype=np.int64)
    rows[order[np.asarray(parent)[hangs]]] = UPPER
    return columns, rows
