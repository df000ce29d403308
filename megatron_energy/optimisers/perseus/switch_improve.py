"""Step 3 of the switch-latency post-pass: a local search on the clock segments (*modelled*).

First improvement, each move judged by the latency-aware simulation: a segment's clock down or up by 16, 4,
then 1 grid steps, a segment merged into a neighbour, or a boundary between segments shifted by one
instruction; a move is kept when the iteration stays within the deadline and the energy drops
(:mod:`~megatron_energy.optimisers.perseus.switch_latency`).
"""

from __future__ import annotations

from megatron_energy.optimisers.perseus.switch_search import REL_TOL, SearchState, SwitchSearch


def improve(search: SwitchSearch, state: SearchState, max_evaluations: int) -> SearchState:
    """First-improvement local search over segment clocks, boundaries and merges (see the module doc)."""
    time_s, energy_j = search.evaluate(state)
    if not search.feasible(time_s):
        return state
    search.stand_on(state)
    budget = search.evaluations + max_evaluations
    for step in (16, 4, 1):
        improved = True
        while improved and search.evaluations < budget:
            improved = False
            for stage in range(len(state)):
                k = 0
                while k < len(_segments(state[stage])) and search.evaluations < budget:
                    for candidate in _moves(search, state[stage], stage, k, step):
                        trial = [*state[:stage], candidate, *state[stage + 1 :]]
                        trial_s, trial_j = search.evaluate(trial)
                        if search.feasible(trial_s) and trial_j < energy_j * (1.0 - REL_TOL):
                            state, energy_j, improved = trial, trial_j, True
                            search.stand_on(state)
                            break
                    k += 1
    return state


def _moves(search: SwitchSearch, clocks: list[int], stage: int, k: int, step: int) -> list[list[int]]:
    """Candidate clock lists of a stage, from moving segment ``k``.

    Its clock ``step`` grid clocks down or up, its clock set to a neighbour's (a merge), or its boundary
    with the next segment shifted by one instruction either way.
    """
    segments = _segments(clocks)
    first, after, clock = segments[k]
    grid = search.grids[stage]
    moves = []
    if clock in grid:
        at = grid.index(clock)
        for to in (at - step, at + step):
            if 0 <= to < len(grid):
                moves.append(_set(search, clocks, stage, range(first, after), grid[to]))
    for other in (k - 1, k + 1):
        if 0 <= other < len(segments):
            moves.append(_set(search, clocks, stage, range(first, after), segments[other][2]))
    if k + 1 < len(segments):
        next_clock = segments[k + 1][2]
        moves.append(_set(search, clocks, stage, [after - 1], next_clock))
        moves.append(_set(search, clocks, stage, [after], clock))
    return [move for move in moves if move is not None]


def _set(
    search: SwitchSearch, clocks: list[int], stage: int, indices: range | list[int], clock: int
) -> list[int] | None:
    """``clocks`` with ``indices`` at ``clock``; None if an instruction has no option at that clock."""
    keys = search.keys[stage]
    if any(clock not in search.options[keys[i]] for i in indices):
        return None
    changed = list(clocks)
    for i in indices:
        changed[i] = clock
    return changed


def _segments(clocks: list[int]) -> list[tuple[int, int, int]]:
    """Runs of equal clocks in execution order: ``(first index, index after the last, clock)``."""
    segments = []
    first = 0
    for i in range(1, len(clocks) + 1):
        if i == len(clocks) or clocks[i] != clocks[first]:
            segments.append((first, i, clocks[first]))
            first = i
    return segments
