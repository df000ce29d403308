"""Step 2 of the switch-latency post-pass: fix up-switches that come late on the critical path (*modelled*).

While the latency-aware iteration is over the deadline, each instruction on its critical path that took
longer than planned either asks for its clock one instruction earlier or asks for a higher clock that makes
up for the stale part, whichever adds less energy; failing that, stages run at their fastest clock one by one
(:mod:`~megatron_energy.optimisers.perseus.switch_latency`).
"""

from __future__ import annotations

from collections.abc import Mapping

from megatron_energy.optimisers.perseus.switch_quantise import quantise
from megatron_energy.optimisers.perseus.switch_search import REL_TOL, SearchState, SwitchSearch
from megatron_energy.pipeline.dag_nodes import SINK, NodeId
from megatron_energy.sim.simulator import Slice

MAX_REPAIR_ROUNDS = 200
"""Critical-path repair rounds before falling back to all-fastest stages."""


def repair(search: SwitchSearch, state: SearchState, planned_s: Mapping[NodeId, float]) -> SearchState:
    """Fix late up-switches on the critical path until the deadline is met, else use all-fastest stages.

    A late instruction either asks for its clock one instruction earlier (the nearest earlier instruction
    of its stage with a slower clock gets it) or asks for a higher clock that makes up for the stale part,
    whichever adds less busy energy by the profile. Clocks only rise, so the loop ends.

    Args:
        search: The search, on the latency-aware simulator.
        state: A quantised state.
        planned_s: Duration of every compute node under the input plan with instant switches: a node
            that takes longer ran at a stale, slower clock.
    """
    for _ in range(MAX_REPAIR_ROUNDS):
        late = _late_on_critical_path(search, state, planned_s)
        if late is None:
            return state
        if not late:
            break
        state = [list(clocks) for clocks in state]
        for piece in late:
            stage, i = search.place[piece.node]
            fixes = [_earlier_request(search, state[stage], stage, i)]
            fixes.append(_compensation(search, state[stage], stage, i, piece, planned_s[piece.node]))
            fix = min((fix for fix in fixes if fix is not None), key=lambda fix: fix[0], default=None)
            if fix is not None:
                _, j, clock = fix
                state[stage][j] = clock
        state = quantise(search, state)
    return _fallback(search, state, planned_s)


def _earlier_request(
    search: SwitchSearch, clocks: list[int], stage: int, i: int
) -> tuple[float, int, int] | None:
    """Ask for instruction ``i``'s clock one instruction earlier: ``(extra energy, index, clock)``."""
    keys = search.keys[stage]
    for back in range(1, len(clocks)):
        j = (i - back) % len(clocks)
        if clocks[j] < clocks[i] and clocks[i] in search.options[keys[j]]:
            extra_j = search.marginal_j(stage, j, clocks[i]) - search.marginal_j(stage, j, clocks[j])
            return extra_j, j, clocks[i]
    return None


def _compensation(
    search: SwitchSearch, clocks: list[int], stage: int, i: int, piece: Slice, planned_s: float
) -> tuple[float, int, int] | None:
    """The lowest higher clock with which instruction ``i`` ends on time despite its stale part.

    Returns:
        ``(extra energy, i, clock)``, or None if no clock does.
    """
    if piece.stale_clock_mhz is None:
        return None
    options = search.options[search.keys[stage][i]]
    stale = options.get(piece.stale_clock_mhz)
    if stale is None or piece.stale_s >= stale.time_s:
        return None
    left = 1.0 - piece.stale_s / stale.time_s
    for clock in search.grids[stage]:
        if clock > clocks[i] and piece.stale_s + left * options[clock].time_s <= planned_s * (1.0 + REL_TOL):
            return (
                left * (search.marginal_j(stage, i, clock) - search.marginal_j(stage, i, clocks[i])),
                i,
                clock,
            )
    return None


def _fallback(search: SwitchSearch, state: SearchState, planned_s: Mapping[NodeId, float]) -> SearchState:
    """Put the stage with the most late critical instructions at its fastest clock, until on time."""
    fastest = search.all_fastest()
    state = [list(clocks) for clocks in state]
    while state != fastest:
        late = _late_on_critical_path(search, state, planned_s)
        if late is None:
            return state
        stages = [search.place[piece.node][0] for piece in late] or [
            s for s in range(len(state)) if state[s] != fastest[s]
        ]
        stage = max(set(stages), key=stages.count)
        if state[stage] == fastest[stage]:
            stage = next(s for s in range(len(state)) if state[s] != fastest[s])
        state[stage] = list(fastest[stage])
    return state


def _late_on_critical_path(
    search: SwitchSearch, state: SearchState, planned_s: Mapping[NodeId, float]
) -> list[Slice] | None:
    """Slices of the critical path's compute nodes that took longer than planned.

    Returns:
        The slices, or None when the state meets the deadline.
    """
    result = search.simulator.run(search.to_clocks(state))
    search.evaluations += 1
    if search.feasible(result.iteration_time_s):
        return None
    end = {piece.node: piece.end_s for piece in result.timeline}
    start = {piece.node: piece.start_s for piece in result.timeline}
    graph = search.dag.graph
    pieces = {piece.node: piece for piece in result.timeline}
    late = []
    node = max(graph.predecessors(SINK), key=end.__getitem__)
    while True:
        if node in search.place and end[node] - start[node] > planned_s[node] * (1.0 + REL_TOL):
            late.append(pieces[node])
        preds = [pred for pred in graph.predecessors(node) if pred in end]
        if not preds:
            return late
        node = max(preds, key=end.__getitem__)
