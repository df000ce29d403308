"""Make a per-instruction clock plan executable when a clock switch takes time (switch latency L).

The frontier solver picks a clock per pipeline instruction as if switches were instant. On a GPU a locked
clock takes effect L after the request (10 ms on H100/H200, 20 ms on A100), and a newer request replaces a
pending one, so a plan whose instructions last a few ms mostly runs at stale clocks: too slow where it
switches up (the iteration gets longer) and too fast where it switches down (the saving is lost).
:func:`make_switch_aware` turns such a plan into one that meets the deadline in the latency-aware simulation
(:class:`~megatron_energy.sim.simulator.Simulator` with ``switch_latency_s``) while keeping as much of the
saving as it can:

1. **Quantise.** Per stage, consecutive instructions with equal clocks form segments. A segment whose span
   (its first instruction's start to the next segment's, waits included) is shorter than L is merged into a
   neighbour, the merged run taking the faster (higher) clock of the two, so no instruction runs slower than
   planned; of the two neighbours, the one whose merge adds less busy energy. Merging repeats on the
   re-simulated timeline until every span is at least L, so every remaining request takes effect.
2. **Repair.** While the latency-aware iteration is over the deadline, each instruction on its critical path
   that took longer than planned (its up-switch came late) is fixed, by whichever adds less energy: ask for
   its clock one instruction earlier (the nearest earlier instruction of its stage with a slower clock gets
   it), or ask for a higher clock that makes up for the stale part. Clocks only rise, so this ends. If it
   does not meet the deadline, the stage with the most lateness runs at its fastest clock throughout (zero
   switches), then the next, and so on.
3. **Improve.** A first-improvement local search on the segments, each move judged by the latency-aware
   simulation: move a segment's clock down or up by 16, 4, then 1 grid steps, merge a segment into a
   neighbour, or shift a boundary between segments by one instruction. A move is kept when the iteration
   stays within the deadline and the energy drops.

The result is compared with every stage at its fastest clock (zero switches) and the better one returned, so
it never uses more energy than the all-fastest plan. With L = 0 the input clocks are returned unchanged. All
times and energies are *modelled*. Profiles are assumed to get no slower as the clock rises (as modelled ones
do, and measured ones up to noise), so a higher clock is a faster one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from megatron_energy.pipeline.dag import SINK, NodeId, PipelineDag
from megatron_energy.pipeline.instruction import Step
from megatron_energy.sim.simulator import (
    ProfileLike,
    SimResult,
    Simulator,
    Slice,
    StagePowers,
)
from megatron_energy.sim.switching_pass import PassCheckpoint

_REL_TOL = 1e-9
"""Relative tolerance of the deadline check and of an energy improvement (floating-point noise)."""
_MAX_REPAIR_ROUNDS = 200
"""Critical-path repair rounds before falling back to all-fastest stages."""


@dataclass(frozen=True)
class SwitchAwarePlan:
    """A clock plan that is executable with switch latency (all figures modelled).

    Attributes:
        clocks: SM clock every compute node asks for when it starts.
        result: Latency-aware simulation of ``clocks``.
        unadjusted: Latency-aware simulation of the input clocks, for comparison.
        deadline_s: Iteration-time budget.
        switch_latency_s: The switch latency planned for.
        switches_per_iteration: Clock requests per iteration, all stages (a stage asks when an instruction's
            clock differs from its predecessor's, its first instruction following the previous iteration's
            last).
        evaluations: Latency-aware simulations the post-pass ran.
    """

    clocks: dict[Step, int]
    result: SimResult
    unadjusted: SimResult
    deadline_s: float
    switch_latency_s: float
    switches_per_iteration: int
    evaluations: int

    @property
    def meets_deadline(self) -> bool:
        """Whether the latency-aware iteration time is within the deadline (up to rounding)."""
        return self.result.iteration_time_s <= self.deadline_s * (1.0 + _REL_TOL)


def count_switches(dag: PipelineDag, clocks: Mapping[Step, int]) -> int:
    """Clock requests per iteration in the steady state.

    Per stage, the instructions whose clock differs from the previous instruction's (the first one compared
    with the last one, of the previous iteration).

    Args:
        dag: The iteration DAG.
        clocks: Clock of every compute node.
    """
    switches = 0
    for stage in range(dag.num_stages):
        order = [clocks[node] for node in dag.stage_steps(stage)]
        switches += sum(1 for i, clock in enumerate(order) if clock != order[i - 1])
    return switches


def make_switch_aware(
    dag: PipelineDag,
    profile: ProfileLike,
    clocks: Mapping[Step, int],
    switch_latency_s: float,
    deadline_s: float,
    powers: StagePowers | None = None,
    max_evaluations: int = 2000,
) -> SwitchAwarePlan:
    """Turn an instant-switch clock plan into one that meets ``deadline_s`` with switch latency.

    Args:
        dag: The iteration DAG.
        profile: Time and energy per clock of every instruction.
        clocks: SM clock per compute node, planned for instant switches; a missing node runs its fastest
            option.
        switch_latency_s: Switch latency L (``GpuSpec.switch_latency_s``).
        deadline_s: The iteration time the plan was solved for (the all-maximum-clocks time for iso-time).
        powers: Blocked and idle power; the profile's when ``None``.
        max_evaluations: Budget of latency-aware simulations for the improvement search; quantise and repair
            always run to the end. The search usually converges well within it on small pipelines (hundreds
            of evaluations at PP=4, M=8); one evaluation costs about 40 ms at PP=16, M=256, VPP=2.

    Returns:
        The adjusted clocks and their latency-aware simulation. With L = 0 the input clocks, unchanged. If
        even the all-fastest plan misses the deadline (a deadline below the fastest iteration time), the
        all-fastest plan, with ``meets_deadline`` False.

    Raises:
        ValueError: If a clock is not among its instruction's profiled options, or L is negative.
    """
    simulator = Simulator(dag, profile, powers, switch_latency_s)
    unadjusted = simulator.run(clocks)
    if simulator.switch_latency_s == 0.0:
        switches = count_switches(dag, _filled(dag, profile, clocks))
        return SwitchAwarePlan(dict(clocks), unadjusted, unadjusted, deadline_s, 0.0, switches, 1)
    instant = simulator.run(clocks, switch_latency_s=0.0)
    planned_s = {piece.node: piece.end_s - piece.start_s for piece in instant.timeline}
    search = _Search(dag, profile, simulator, deadline_s)
    state = [[clocks.get(node, search.fastest_clock(node)) for node in order] for order in search.orders]
    state = search.repair(search.quantise(state), planned_s)
    state = search.improve(state, max_evaluations)
    fastest = search.all_fastest()
    if search.cost(fastest) <= search.cost(state):
        state = fastest
    adjusted = search.to_clocks(state)
    return SwitchAwarePlan(
        clocks=adjusted,
        result=simulator.run(adjusted),
        unadjusted=unadjusted,
        deadline_s=deadline_s,
        switch_latency_s=simulator.switch_latency_s,
        switches_per_iteration=count_switches(dag, adjusted),
        evaluations=search.evaluations + 2,
    )


def _filled(dag: PipelineDag, profile: ProfileLike, clocks: Mapping[Step, int]) -> dict[Step, int]:
    """``clocks`` with the fastest option's clock for every compute node it lacks."""
    filled = {}
    for node in dag.compute_steps():
        clock = clocks.get(node)
        filled[node] = clock if clock is not None else profile.fastest(node.work).clock_mhz
    return filled


_State = list[list[int]]
"""Clock of every compute node, per stage in that rank's execution order."""


class _Search:
    """Quantise, repair and improve clock plans on the latency-aware simulator (memoised)."""

    def __init__(self, dag: PipelineDag, profile: ProfileLike, simulator: Simulator, deadline_s: float):
        self.dag = dag
        self.simulator = simulator
        self.deadline_s = deadline_s
        self.latency_s = simulator.switch_latency_s
        self.blocked_power_w = simulator.powers.blocked_power_w
        self.orders = [dag.stage_steps(stage) for stage in range(dag.num_stages)]
        self.keys = [[node.work for node in order] for order in self.orders]
        self._place: dict[NodeId, tuple[int, int]] = {
            node: (s, i) for s, order in enumerate(self.orders) for i, node in enumerate(order)
        }
        self._options = {
            key: {option.clock_mhz: option for option in profile.options(key)}
            for key in {key for keys in self.keys for key in keys}
        }
        self._fastest = {key: profile.fastest(key).clock_mhz for key in self._options}
        self.grids = [
            sorted(set.intersection(*(set(self._options[key]) for key in set(keys)))) for keys in self.keys
        ]
        positions: dict[NodeId, int] = simulator.compute_positions()
        self._positions = [[positions[node] for node in order] for order in self.orders]
        """The simulator's compute position of every node of a state, per stage in execution order."""
        self._num_compute = len(positions)
        assert sum(map(len, self._positions)) == self._num_compute, "the stages' orders hold every node"
        self.evaluations = 0
        self._cache: dict[tuple[tuple[int, ...], ...], tuple[float, float]] = {}
        self._base: PassCheckpoint | None = None
        """The pass new simulations resume from (the state the improvement search stands on)."""
        self._recent: tuple[tuple[tuple[int, ...], ...], PassCheckpoint | None] = ((), None)
        """The last simulated state and its pass."""

    # ----- evaluation --------------------------------------------------------------------------------------

    def fastest_clock(self, node: Step) -> int:
        """Clock of the fastest option of a compute node's instruction."""
        stage, i = self._place[node]
        return self._fastest[self.keys[stage][i]]

    def to_clocks(self, state: _State) -> dict[Step, int]:
        """The clock plan of a state."""
        return {
            node: clock
            for order, clocks in zip(self.orders, state, strict=True)
            for node, clock in zip(order, clocks, strict=True)
        }

    def evaluate(self, state: _State) -> tuple[float, float]:
        """Latency-aware iteration time and energy of a state (memoised).

        The simulation resumes from the pass of the state the search stands on (:meth:`stand_on`), so a move
        that changes clocks late in the iteration re-simulates only from there (the same floats).
        """
        key = tuple(map(tuple, state))
        found = self._cache.get(key)
        if found is None:
            self.evaluations += 1
            time_s, energy_j, checkpoint = self.simulator.evaluate_options(self._chosen(state), self._base)
            found = self._cache[key] = (time_s, energy_j)
            self._recent = (key, checkpoint)
            if self._base is None:
                self._base = checkpoint
        return found

    def stand_on(self, state: _State) -> None:
        """Resume later simulations from ``state``'s pass, if it was the last one simulated."""
        key, checkpoint = self._recent
        if checkpoint is not None and key == tuple(map(tuple, state)):
            self._base = checkpoint

    def _chosen(self, state: _State) -> list[Any]:
        """The profile's option of every node of ``state``, by the simulator's compute position.

        What ``Simulator.evaluate`` would pick for ``to_clocks(state)``, without building that mapping: the
        grids hold only clocks every instruction of a stage has an option at.
        """
        chosen: list[Any] = [None] * self._num_compute
        for positions, keys, clocks in zip(self._positions, self.keys, state, strict=True):
            for position, key, clock in zip(positions, keys, clocks, strict=True):
                chosen[position] = self._options[key][clock]
        return chosen

    def feasible(self, time_s: float) -> bool:
        """Whether an iteration time meets the deadline (up to rounding)."""
        return time_s <= self.deadline_s * (1.0 + _REL_TOL)

    def cost(self, state: _State) -> tuple[float, float]:
        """Ranking of states: overshoot of the deadline first, then energy."""
        time_s, energy_j = self.evaluate(state)
        return (0.0 if self.feasible(time_s) else time_s - self.deadline_s, energy_j)

    def all_fastest(self) -> _State:
        """Every stage at one clock, the fastest for all its instructions (zero switches)."""
        state = []
        for stage, keys in enumerate(self.keys):
            top = self._top_clock(stage)
            state.append([top if top is not None else self._fastest[key] for key in keys])
        return state

    def _top_clock(self, stage: int) -> int | None:
        """The stage clock with the least busy time (then energy) over its instructions; None if none."""
        keys = self.keys[stage]
        best = None
        for clock in self.grids[stage]:
            time_s = sum(self._options[key][clock].time_s for key in keys)
            energy_j = sum(self._options[key][clock].energy_j for key in keys)
            if best is None or (time_s, energy_j) < best[:2]:
                best = (time_s, energy_j, clock)
        return None if best is None else best[2]

    def _marginal_j(self, stage: int, i: int, clock: int) -> float:
        """Energy of instruction ``i`` at ``clock`` less blocked power over its time.

        What running the instruction at that clock costs where the time it saves is spent waiting.
        """
        option = self._options[self.keys[stage][i]][clock]
        return option.energy_j - self.blocked_power_w * option.time_s

    # ----- 1. quantise -------------------------------------------------------------------------------------

    def quantise(self, state: _State) -> _State:
        """Merge segments whose span is shorter than L into a neighbour, at the faster clock of the two."""
        while True:
            starts, iteration_s = self._starts(state)
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
                    if spans[j] >= self.latency_s or len(requests) < 2:
                        break
                    near = {(j + k) % len(requests) for k in (-1, 0, 1)}
                    if touched & near:
                        continue
                    if self._merge(stage, clocks, requests, j):
                        touched |= near
                        merged = True
                new_state.append(clocks)
            state = new_state
            if not merged:
                return state

    def _merge(self, stage: int, clocks: list[int], requests: list[int], j: int) -> bool:
        """Merge cyclic segment ``j`` with the neighbour whose merge at the faster clock costs less energy.

        Returns:
            Whether a clock changed (an instruction without an option at the merged clock keeps its own).
        """
        n = len(clocks)
        options = []
        for other in ((j - 1) % len(requests), (j + 1) % len(requests)):
            first, second = (other, j) if other == (j - 1) % len(requests) else (j, other)
            members = self._segment(requests, first, n) + self._segment(requests, second, n)
            clock = max(clocks[members[0]], clocks[members[-1]])
            extra_j = sum(
                self._marginal_j(stage, i, clock) - self._marginal_j(stage, i, clocks[i])
                for i in members
                if clock in self._options[self.keys[stage][i]]
            )
            options.append((extra_j, clock, members))
        _, clock, members = min(options, key=lambda option: option[0])
        changed = False
        for i in members:
            if clocks[i] != clock and clock in self._options[self.keys[stage][i]]:
                clocks[i] = clock
                changed = True
        return changed

    @staticmethod
    def _segment(requests: list[int], j: int, n: int) -> list[int]:
        """Step indices of cyclic segment ``j`` (from request ``j`` up to the next request)."""
        first, after = requests[j], requests[(j + 1) % len(requests)]
        length = (after - first) % n or n
        return [(first + k) % n for k in range(length)]

    def _starts(self, state: _State) -> tuple[list[list[float]], float]:
        """Latency-aware start of every compute node per stage, and the iteration time."""
        result = self.simulator.run(self.to_clocks(state))
        self.evaluations += 1
        start = {piece.node: piece.start_s for piece in result.timeline}
        return [[start[node] for node in order] for order in self.orders], result.iteration_time_s

    # ----- 2. repair ---------------------------------------------------------------------------------------

    def repair(self, state: _State, planned_s: Mapping[NodeId, float]) -> _State:
        """Fix late up-switches on the critical path until the deadline is met, else use all-fastest stages.

        A late instruction either asks for its clock one instruction earlier (the nearest earlier instruction
        of its stage with a slower clock gets it) or asks for a higher clock that makes up for the stale part,
        whichever adds less busy energy by the profile. Clocks only rise, so the loop ends.

        Args:
            state: A quantised state.
            planned_s: Duration of every compute node under the input plan with instant switches: a node
                that takes longer ran at a stale, slower clock.
        """
        for _ in range(_MAX_REPAIR_ROUNDS):
            late = self._late_on_critical_path(state, planned_s)
            if late is None:
                return state
            if not late:
                break
            state = [list(clocks) for clocks in state]
            for piece in late:
                stage, i = self._place[piece.node]
                fixes = [self._earlier_request(state[stage], stage, i)]
                fixes.append(self._compensation(state[stage], stage, i, piece, planned_s[piece.node]))
                fix = min((fix for fix in fixes if fix is not None), key=lambda fix: fix[0], default=None)
                if fix is not None:
                    _, j, clock = fix
                    state[stage][j] = clock
            state = self.quantise(state)
        return self._fallback(state, planned_s)

    def _earlier_request(self, clocks: list[int], stage: int, i: int) -> tuple[float, int, int] | None:
        """Ask for instruction ``i``'s clock one instruction earlier: ``(extra energy, index, clock)``."""
        keys = self.keys[stage]
        for back in range(1, len(clocks)):
            j = (i - back) % len(clocks)
            if clocks[j] < clocks[i] and clocks[i] in self._options[keys[j]]:
                extra_j = self._marginal_j(stage, j, clocks[i]) - self._marginal_j(stage, j, clocks[j])
                return extra_j, j, clocks[i]
        return None

    def _compensation(
        self, clocks: list[int], stage: int, i: int, piece: Slice, planned_s: float
    ) -> tuple[float, int, int] | None:
        """The lowest higher clock with which instruction ``i`` ends on time despite its stale part.

        Returns:
            ``(extra energy, i, clock)``, or None if no clock does.
        """
        if piece.stale_clock_mhz is None:
            return None
        options = self._options[self.keys[stage][i]]
        stale = options.get(piece.stale_clock_mhz)
        if stale is None or piece.stale_s >= stale.time_s:
            return None
        left = 1.0 - piece.stale_s / stale.time_s
        for clock in self.grids[stage]:
            if clock > clocks[i] and piece.stale_s + left * options[clock].time_s <= planned_s * (
                1.0 + _REL_TOL
            ):
                return (
                    left * (self._marginal_j(stage, i, clock) - self._marginal_j(stage, i, clocks[i])),
                    i,
                    clock,
                )
        return None

    def _fallback(self, state: _State, planned_s: Mapping[NodeId, float]) -> _State:
        """Put the stage with the most late critical instructions at its fastest clock, until on time."""
        fastest = self.all_fastest()
        state = [list(clocks) for clocks in state]
        while state != fastest:
            late = self._late_on_critical_path(state, planned_s)
            if late is None:
                return state
            stages = [self._place[piece.node][0] for piece in late] or [
                s for s in range(len(state)) if state[s] != fastest[s]
            ]
            stage = max(set(stages), key=stages.count)
            if state[stage] == fastest[stage]:
                stage = next(s for s in range(len(state)) if state[s] != fastest[s])
            state[stage] = list(fastest[stage])
        return state

    def _late_on_critical_path(self, state: _State, planned_s: Mapping[NodeId, float]) -> list[Slice] | None:
        """Slices of the critical path's compute nodes that took longer than planned.

        Returns:
            The slices, or None when the state meets the deadline.
        """
        result = self.simulator.run(self.to_clocks(state))
        self.evaluations += 1
        if self.feasible(result.iteration_time_s):
            return None
        end = {piece.node: piece.end_s for piece in result.timeline}
        start = {piece.node: piece.start_s for piece in result.timeline}
        graph = self.dag.graph
        pieces = {piece.node: piece for piece in result.timeline}
        late = []
        node = max(graph.predecessors(SINK), key=end.__getitem__)
        while True:
            if node in self._place and end[node] - start[node] > planned_s[node] * (1.0 + _REL_TOL):
                late.append(pieces[node])
            preds = [pred for pred in graph.predecessors(node) if pred in end]
            if not preds:
                return late
            node = max(preds, key=end.__getitem__)

    # ----- 3. improve --------------------------------------------------------------------------------------

    def improve(self, state: _State, max_evaluations: int) -> _State:
        """First-improvement local search over segment clocks, boundaries and merges (see the module doc)."""
        time_s, energy_j = self.evaluate(state)
        if not self.feasible(time_s):
            return state
        self.stand_on(state)
        budget = self.evaluations + max_evaluations
        for step in (16, 4, 1):
            improved = True
            while improved and self.evaluations < budget:
                improved = False
                for stage in range(len(state)):
                    k = 0
                    while k < len(_segments(state[stage])) and self.evaluations < budget:
                        for candidate in self._moves(state[stage], stage, k, step):
                            trial = [*state[:stage], candidate, *state[stage + 1 :]]
                            trial_s, trial_j = self.evaluate(trial)
                            if self.feasible(trial_s) and trial_j < energy_j * (1.0 - _REL_TOL):
                                state, energy_j, improved = trial, trial_j, True
                                self.stand_on(state)
                                break
                        k += 1
        return state

    def _moves(self, clocks: list[int], stage: int, k: int, step: int) -> list[list[int]]:
        """Candidate clock lists of a stage, from moving segment ``k``.

        Its clock ``step`` grid clocks down or up, its clock set to a neighbour's (a merge), or its boundary
        with the next segment shifted by one instruction either way.
        """
        segments = _segments(clocks)
        first, after, clock = segments[k]
        grid = self.grids[stage]
        moves = []
        if clock in grid:
            at = grid.index(clock)
            for to in (at - step, at + step):
                if 0 <= to < len(grid):
                    moves.append(self._set(clocks, stage, range(first, after), grid[to]))
        for other in (k - 1, k + 1):
            if 0 <= other < len(segments):
                moves.append(self._set(clocks, stage, range(first, after), segments[other][2]))
        if k + 1 < len(segments):
            next_clock = segments[k + 1][2]
            moves.append(self._set(clocks, stage, [after - 1], next_clock))
            moves.append(self._set(clocks, stage, [after], clock))
        return [move for move in moves if move is not None]

    def _set(self, clocks: list[int], stage: int, indices: range | list[int], clock: int) -> list[int] | None:
        """``clocks`` with ``indices`` at ``clock``; None if an instruction has no option at that clock."""
        keys = self.keys[stage]
        if any(clock not in self._options[keys[i]] for i in indices):
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
