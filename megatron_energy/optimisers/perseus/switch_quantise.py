"""Step 1 of the switch-latency post-pass: merge clock segments shorter than the switch latency (*modelled*).

Per stage, consecutive instructions with equal clocks form segments. A segment whose span (its first
instruction's start to the next segment's, waits included) is shorter than L is merged into a neighbour at
the faster clock of the two, the neighbour whose merge adds less busy energy; merging repeats on the
re-simulated timeline until every span is at least L
(:mod:`~megatron_energy.optimisers.perseus.switch_latency`).
"""

from __future__ import annotations

from megatron_energy.optimisers.perseus.switch_search import SearchState, SwitchSearch


def quantise(search: SwitchSearch, state: SearchState) -> SearchState:
    """Merge segments whose span is shorter than L into a neighbour, at the faster clock of the two."""
    while True:
        starts, iteration_s = _starts(search, state)
        merged = False
        new_state = []
        for stage, clocks in enumerate(state):
            clocks = list(clocks)
            requests = [i for i in range(len(clocks)) if clocks[i] != clocks[i - 1]]
            spans = [
                (starts[stage][requests[(j + 1) % len(requests)]] - starts[stage][r]) % iteration_s
                or iteration_s
                for j, r in enumerate(requests)
            ]
            touched: set[int] = set()
            for j in sorted(range(len(requests)), key=spans.__getitem__):
                if spans[j] >= search.latency_s or len(requests) < 2:
                    break
                near = {(j + k) % len(requests) for k in (-1, 0, 1)}
                if touched & near:
                    continue
                if _merge(search, stage, clocks, requests, j):
                    touched |= near
                    merged = True
            new_state.append(clocks)
        state = new_state
        if not merged:
            return state


def _merge(search: SwitchSearch, stage: int, clocks: list[int], requests: list[int], j: int) -> bool:
    """Merge cyclic segment ``j`` with the neighbour whose merge at the faster clock costs less energy.

    Returns:
        Whether a clock changed (an instruction without an option at the merged clock keeps its own).
    """
    n = len(clocks)
    options = []
    for other in ((j - 1) % len(requests), (j + 1) % len(requests)):
        first, second = (other, j) if other == (j - 1) % len(requests) else (j, other)
        members = _segment(requests, first, n) + _segment(requests, second, n)
        clock = max(clocks[members[0]], clocks[members[-1]])
        extra_j = sum(
            search.marginal_j(stage, i, clock) - search.marginal_j(stage, i, clocks[i])
            for i in members
            if clock in search.options[search.keys[stage][i]]
        )
        options.append((extra_j, clock, members))
    _, clock, members = min(options, key=lambda option: option[0])
    changed = False
    for i in members:
        if clocks[i] != clock and clock in search.options[search.keys[stage][i]]:
            clocks[i] = clock
            changed = True
    return changed


def _segment(requests: list[int], j: int, n: int) -> list[int]:
    """Step indices of cyclic segment ``j`` (from request ``j`` up to the next request)."""
    first, after = requests[j], requests[(j + 1) % len(requests)]
    length = (after - first) % n or n
    return [(first + k) % n for k in range(length)]


def _starts(search: SwitchSearch, state: SearchState) -> tuple[list[list[float]], float]:
    """Latency-aware start of every compute node per stage, and the iteration time."""
    result = search.simulator.run(search.to_clocks(state))
    search.evaluations += 1
    start = {piece.node: piece.start_s for piece in result.timeline}
    return [[start[node] for node in order] for order in search.orders], result.iteration_time_s
