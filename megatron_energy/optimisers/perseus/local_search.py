"""Exact local search on a frontier plan, judged by the simulator's energy accounting.

A plan is an option index per compute node. With ``c_i = e_i − λ_i·t_i`` the marginal cost of node
``i``'s option (``λ_i`` its marginal power: blocked power, idle power for a stage's last instruction),
``start(last_s)`` the start of stage ``s``'s last instruction and ``T`` the iteration time, the
simulator's energy is exactly::

    E = Σ_i c_i + (P_blocked − P_idle)·Σ_s start(last_s) + S·P_idle·T

Two kinds of step, both exact (the deadline holds and ``E`` is recomputed, never estimated):

* **fill**: one backward pass gives every node the cheapest option that fits between its earliest start and
  the latest end its successors allow, within a cap on ``T`` (the current one, or the deadline). Floats are
  handed backwards, so a whole chain can slow down in one pass. Kept only if ``E`` drops.
* **trade**: a near-critical node one step slower, paid for by a neighbour (at most two edges away, through a
  transfer) on the same critical paths one step faster, or two steps where one frees too little time. Only
  nodes whose float is too small for their next slower option are tried (the others are the fill's), and
  only neighbours with no more float than them (the others are not on their critical paths). Once pairs
  stall, **compound trades** try one node against two or three partners (also from its own stage, up to
  ``CHAIN_REACH`` places away): a step slower paid for by several a step faster, or the reverse.

Trying a trade is cheap where it fails, which is most of the time: its time and cost balance is checked
first, then the new end of the slowed node against the latest end its successors allow (from the latest
starts of the plan the sweep began with); only then are the durations changed and the earliest starts after
them updated incrementally (node indices are topological), the shift given up at the first node that runs
past its latest start, or far enough to cost more time than the trade saves. Within a sweep the latest
starts are not updated after a kept trade (that walk back over the ancestors cost more than the trades):
they only prune, so a stale one may spare or cost a try, but every kept trade is judged exactly (the
deadline from the shifted earliest starts, the energy change summed over them).

The search alternates trade sweeps (most promising first, by the change of marginal cost) and fills, and
stops after ``sweeps`` of them, when a round gains less than the caller's ``min_gain_j`` or when the energy
reaches ``target_j``: it is bounded by what it still gains, not by luck in reaching the lower bound.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from megatron_energy.optimisers.perseus.longest_path import earliest_starts, latest_starts, neighbour_pairs
from megatron_energy.pipeline.profile import ClockOption

REL_TOL = 1e-12
"""Relative tolerance of deadline checks (floating-point noise)."""
CHAIN_REACH = 3
"""Compound trades also take partners up to this many places before and after a node on its stage."""
TRADE_SWEEPS = 2
"""Trade sweeps per search by default. Measured on issue 13's family (S=8 M=64, 5 seeds): the first sweep
gains most of what trades gain, later ones at most 0.03 % of the energy for more than their cost."""


class OptionTable:
    """An instruction's options, time ascending, with the cheapest (least ``e − λ·t``) one up to each time.

    ``λ`` is the instruction's marginal power: blocked power, or idle power for a stage's last instruction.

    Attributes:
        options: The options, time ascending (then energy).
        times_s: Their times.
        energies_j: Their energies.
        costs: Their marginal costs ``e − λ·t``.
        slower: Per option, the next option of the (time, cost) staircase after it, or -1: the step a trade
            slows a node by.
        faster: Per option, the last staircase option before it, or -1: the step a trade speeds a node by.
    """

    def __init__(self, options: Sequence[ClockOption], marginal_power_w: float):
        self.options = sorted(options, key=lambda option: (option.time_s, option.energy_j))
        self.times_s = [option.time_s for option in self.options]
        self.energies_j = [option.energy_j for option in self.options]
        self.costs = [option.energy_j - float(marginal_power_w) * option.time_s for option in self.options]
        self._best_up_to: list[int] = []
        staircase: list[int] = []
        for k, cost in enumerate(self.costs):
            if not staircase or cost < self.costs[staircase[-1]]:
                staircase.append(k)
            self._best_up_to.append(staircase[-1])
        self.slower = [-1] * len(self.options)
        self.faster = [-1] * len(self.options)
        for k in range(len(self.options)):
            position = bisect.bisect_right(staircase, k)
            self.slower[k] = staircase[position] if position < len(staircase) else -1
            before = bisect.bisect_left(staircase, k)
            self.faster[k] = staircase[before - 1] if before > 0 else -1

    def choose(self, window_s: float) -> int:
        """Index of the cheapest option that fits ``window_s`` (the fastest one when none fits)."""
        k = bisect.bisect_right(self.times_s, window_s * (1 + REL_TOL)) - 1
        return self._best_up_to[k] if k >= 0 else 0


class LocalSearch:
    """Exact local search on plans of one DAG (see the module docstring).

    Args:
        preds: Predecessor indices of every node (indices are topological).
        succs: Successor indices of every node.
        tables: Option table of every compute node, ``None`` for other nodes.
        fixed_s: Duration of every node that is not a compute node.
        last_nodes: Index of every stage's last instruction.
        sink: Index of the sink.
        powers: Blocked and idle power.
        chains: Every stage's instructions in execution order (node indices). A node trades in pairs with
            the compute nodes within two edges of it, in compound trades also with those within
            ``CHAIN_REACH`` places of it on its stage.
    """

    def __init__(
        self,
        preds: list[list[int]],
        succs: list[list[int]],
        tables: Sequence[OptionTable | None],
        fixed_s: Sequence[float],
        last_nodes: Sequence[int],
        sink: int,
        powers: tuple[float, float],
        chains: Sequence[Sequence[int]] = (),
    ):
        self.preds, self.succs, self.sink = preds, succs, sink
        self._pred_pairs, self._succ_pairs = neighbour_pairs(preds), neighbour_pairs(succs)
        self.tables = list(tables)
        self.compute = [i for i, table in enumerate(self.tables) if table is not None]
        self.fixed_s = list(fixed_s)
        self.last_nodes = list(last_nodes)
        self.is_last = [False] * len(preds)
        for i in last_nodes:
            self.is_last[i] = True
        blocked_w, idle_w = powers
        self.end_weight_w = blocked_w - idle_w
        self.time_weight_w = len(last_nodes) * idle_w
        self.neighbours = {i: sorted(self._near(i) - {i}) for i in self.compute}
        partners = {i: set(near) for i, near in self.neighbours.items()}
        for chain in chains:
            for place, i in enumerate(chain):
                partners[i].update(chain[max(0, place - CHAIN_REACH) : place + CHAIN_REACH + 1])
        self.partners = {i: sorted(near - {i}) for i, near in partners.items()}
        self.choice: list[int] = []
        self.durations: list[float] = []
        self.start: list[float] = []
        self.energy_j = 0.0
        self.deadline_s = float("inf")
        self._latest: list[float] = []

    def _near(self, i: int) -> set[int]:
        """Compute nodes at most two edges away from ``i`` (through a transfer node), either direction."""
        near: set[int] = set()
        for step in (self.preds, self.succs):
            for j in step[i]:
                near.add(j)
                near.update(step[j])
        return {j for j in near if self.tables[j] is not None}

    # ----- plan state ------------------------------------------------------------------------------------

    def load(self, choice: Sequence[int], start: list[float] | None = None) -> float:
        """Make ``choice`` the current plan; its energy.

        Args:
            choice: Option index per node, -1 for non-compute nodes.
            start: The plan's earliest starts where the caller has just computed them (else computed here).
        """
        self.choice = list(choice)
        self.durations = list(self.fixed_s)
        for i in self.compute:
            self.durations[i] = self.tables[i].times_s[self.choice[i]]  # type: ignore[union-attr]
        self.start = self._earliest_starts(self.durations) if start is None else start
        self.energy_j = self._energy()
        return self.energy_j

    @property
    def makespan_s(self) -> float:
        """Iteration time of the current plan."""
        return self.start[self.sink]

    def _earliest_starts(self, durations: list[float]) -> list[float]:
        """ASAP start of every node."""
        return earliest_starts(self.preds, self._pred_pairs, durations)

    def _latest_starts(self, durations: list[float], makespan_s: float) -> list[float]:
        """Latest start of every node that lets the sink start by ``makespan_s``."""
        return latest_starts(self.succs, self._succ_pairs, durations, makespan_s)

    def _energy(self) -> float:
        """Energy of the current plan (see the module docstring)."""
        costs = 0.0
        for i in self.compute:
            costs += self.tables[i].costs[self.choice[i]]  # type: ignore[union-attr]
        last_starts = sum([self.start[i] for i in self.last_nodes])
        return costs + self.end_weight_w * last_starts + self.time_weight_w * self.start[self.sink]

    # ----- search ----------------------------------------------------------------------------------------

    def improve(
        self, deadline_s: float, min_gain_j: float, target_j: float = 0.0, sweeps: int = TRADE_SWEEPS
    ) -> list[int]:
        """Improve the current plan (see :meth:`load`; it must meet ``deadline_s``) within the deadline.

        Args:
            deadline_s: The iteration-time budget.
            min_gain_j: A round of trades and fills that gains less than this ends the search.
            target_j: The search also ends once the energy is at most this.
            sweeps: At most this many trade sweeps (0: only fill).

        Returns:
            The improved plan (option index per node, -1 for non-compute nodes).
        """
        self.deadline_s = deadline_s = deadline_s * (1 + REL_TOL)
        self.fill(self.makespan_s)
        if self.makespan_s < deadline_s:
            self.fill(deadline_s)
        compound = False
        for _ in range(sweeps):
            if self.energy_j <= target_j:
                break
            before_j = self.energy_j
            if self.trade(deadline_s, compound):
                self.fill(self.makespan_s)
            if before_j - self.energy_j >= min_gain_j:
                compound = False
            elif compound:
                break
            else:
                compound = True
        return self.choice

    def fill(self, cap_s: float) -> bool:
        """One backward pass of cheapest options within the floats (iteration time at most ``cap_s``).

        Returns:
            Whether the plan changed (it is kept only if its energy drops).
        """
        choice, durations, start, succs = list(self.choice), list(self.durations), self.start, self.succs
        pairs, tables, is_last = self._succ_pairs, self.tables, self.is_last
        latest = [0.0] * len(durations)
        end_weight = self.end_weight_w
        changed = False
        for v in range(len(durations) - 1, -1, -1):
            pair = pairs[v]
            if pair is not None:
                first, second = latest[pair[0]], latest[pair[1]]
                latest_end = first if first < second else second
            else:
                latest_end = min([latest[w] for w in succs[v]]) if succs[v] else cap_s
            table = tables[v]
            if table is not None:
                k = table.choose(latest_end - start[v])
                if table.costs[k] < table.costs[choice[v]]:
                    choice[v], durations[v], changed = k, table.times_s[k], True
            latest[v] = latest_end - durations[v]
            if is_last[v] and end_weight > 0 and latest[v] > start[v]:
                latest[v] = start[v]  # a later stage end costs blocked over idle power
        if not changed:
            return False
        old = self.choice, self.durations, self.start, self.energy_j
        self.choice, self.durations = choice, durations
        self.start = self._earliest_starts(durations)
        self.energy_j = self._energy()
        limit_s = min(cap_s * (1 + REL_TOL), self.deadline_s)
        if self.energy_j < old[3] - 1e-9 and self.makespan_s <= limit_s:
            return True
        self.choice, self.durations, self.start, self.energy_j = old
        return False

    def trade(self, deadline_s: float, compound: bool = False) -> bool:
        """One sweep of trades, most promising first; each is kept if the deadline holds and energy drops.

        Pairs first (one node a step slower, a neighbour a step faster, or two steps where one frees too
        little time); with ``compound``, then trades for
        the nodes no pair moved of one node a step slower paid for by two or three neighbours or nodes close
        on its stage a step faster each, or a critical node a step faster paying for two or three of them a
        step slower each. Compound trades cost more to try, so the search uses them only once pairs stall.

        Returns:
            Whether any trade was kept.
        """
        self._latest = self._latest_starts(self.durations, deadline_s)
        slack = [late - early for late, early in zip(self._latest, self.start, strict=True)]
        tolerance_s = 1e-9 * deadline_s
        # Per node: (cost change, option, time) of a step slower that its float cannot take (time: what it
        # lacks), and of a step faster (time: what it frees).
        slower_steps: dict[int, tuple[float, int, float]] = {}
        faster_steps: dict[int, tuple[float, int, float]] = {}
        double_steps: dict[int, tuple[float, int, float]] = {}  # two steps faster
        for i in self.compute:
            table, k = self.tables[i], self.choice[i]
            times, costs = table.times_s, table.costs  # type: ignore[union-attr]
            slower, faster = table.slower[k], table.faster[k]  # type: ignore[union-attr]
            if slower >= 0 and slack[i] < times[slower] - times[k]:
                slower_steps[i] = (costs[k] - costs[slower], slower, times[slower] - times[k] - slack[i])
            if faster >= 0:
                faster_steps[i] = (costs[faster] - costs[k], faster, times[k] - times[faster])
                double = table.faster[faster]  # type: ignore[union-attr]
                if double >= 0:
                    double_steps[i] = (costs[double] - costs[k], double, times[k] - times[double])
        candidates = []
        for i, (gain, slower, lacks_s) in slower_steps.items():
            for j in self.neighbours[i]:
                if slack[j] > slack[i] + tolerance_s or j not in faster_steps:
                    continue
                step = faster_steps[j]
                if step[2] < lacks_s - tolerance_s:  # one step frees too little: try two
                    step = double_steps.get(j, step)
                if step[0] < gain and step[2] >= lacks_s - tolerance_s:
                    candidates.append((step[0] - gain, j, step[1], i, slower))
        candidates.sort()
        touched: set[int] = set()
        for change, j, faster, i, slower in candidates:
            if i in touched or j in touched or not self._plausible(j, faster, i, slower, deadline_s, change):
                continue
            if self._try(((j, faster), (i, slower)), deadline_s):
                touched.update((i, j))
        if compound:
            self._compound(slower_steps, faster_steps, slack, touched, deadline_s)
        return bool(touched)

    def _compound(
        self,
        slower_steps: dict[int, tuple[float, int, float]],
        faster_steps: dict[int, tuple[float, int, float]],
        slack: list[float],
        touched: set[int],
        deadline_s: float,
    ) -> None:
        """Trades of one node against two or three of its neighbours, the pivot's largest gain first."""
        tolerance_s = 1e-9 * deadline_s
        pivots = [(-gain, i, True) for i, (gain, _, _) in slower_steps.items()]
        critical_s = deadline_s - self.makespan_s + tolerance_s
        pivots += [(loss, j, False) for j, (loss, _, _) in faster_steps.items() if slack[j] <= critical_s]
        pivots.sort()
        for _, pivot, slows in pivots:
            if pivot in touched:
                continue
            own, partners = (slower_steps, faster_steps) if slows else (faster_steps, slower_steps)
            worth, step, time_s = own[pivot]
            # Partners on the pivot's critical paths: a faster one is at least as critical as the pivot, a
            # slower one at most as critical and lacking no more time than the pivot frees.
            sign = 1.0 if slows else -1.0
            near = [
                (sign * partners[j][0], j, partners[j][1], partners[j][2])
                for j in self.partners[pivot]
                if j in partners
                and j not in touched
                and sign * (slack[j] - slack[pivot]) <= tolerance_s
                and (slows or partners[j][2] <= time_s + tolerance_s)
            ]
            near.sort()
            for count in (2, 3):
                chosen = near[:count]
                change = sum(value for value, _, _, _ in chosen)
                if len(chosen) < count or (change >= worth if slows else worth + change >= 0):
                    break
                if slows and sum(freed for _, _, _, freed in chosen) < time_s - tolerance_s:
                    continue
                moves = ((pivot, step), *((j, k) for _, j, k, _ in chosen))
                if self._try(moves, deadline_s):
                    touched.update(node for node, _ in moves)
                    break

    def _try(self, moves: Sequence[tuple[int, int]], deadline_s: float) -> bool:
        """Apply ``moves`` and keep them if the deadline holds and the energy drops; True if kept."""
        undo = self._apply(moves, deadline_s)
        if undo is None:
            return False
        if self.start[self.sink] <= deadline_s and undo[-1] < -1e-9:
            self.energy_j += undo[-1]
            return True
        self._undo(undo)
        return False

    def _plausible(
        self, j: int, faster: int, i: int, slower: int, deadline_s: float, change_j: float
    ) -> bool:
        """Whether the trade can keep the deadline and save energy, judged at ``i``'s neighbours only.

        ``j`` lies within two edges of ``i``, before it (an ancestor) or after it (a descendant). The new end
        of ``i`` is computed from its predecessors (with ``j``'s new duration where it feeds them), and the
        latest end its successors allow for the deadline from theirs (with ``j``'s new duration where they
        feed it). Past that latest end the deadline fails; past the latest end for the current iteration time
        the iteration grows, at ``S·P_idle`` per second. Cheap, and it spares most trades the full shift.
        """
        start, durations, preds, succs, latest = (
            self.start,
            self.durations,
            self.preds,
            self.succs,
            self._latest,
        )
        j_time = self.tables[j].times_s[faster]  # type: ignore[union-attr]
        i_time = self.tables[i].times_s[slower]  # type: ignore[union-attr]
        if j < i:
            begin = 0.0
            for u in preds[i]:
                if u == j:
                    end = start[j] + j_time
                elif j in preds[u]:
                    end = (
                        max([start[w] + (j_time if w == j else durations[w]) for w in preds[u]])
                        + durations[u]
                    )
                else:
                    end = start[u] + durations[u]
                begin = max(begin, end)
            end_i = begin + i_time
            limit = min([latest[w] for w in succs[i]])
        else:
            end_i = start[i] + i_time
            after_j = min([latest[x] for x in succs[j]]) if succs[j] else deadline_s
            limit = deadline_s
            for w in succs[i]:
                if w == j:
                    late = after_j - j_time
                elif j in succs[w]:
                    late = min([after_j - j_time if x == j else latest[x] for x in succs[w]]) - durations[w]
                else:
                    late = latest[w]
                limit = min(limit, late)
        if end_i > limit + REL_TOL * deadline_s:
            return False
        growth_s = end_i - limit + deadline_s - start[self.sink]
        return growth_s <= 0 or self.end_weight_w < 0 or change_j + self.time_weight_w * growth_s < 0

    def _apply(
        self, moves: Sequence[tuple[int, int]], deadline_s: float
    ) -> tuple[list[tuple[int, int, float]], list[tuple[int, float]], float] | None:
        """Set the moves' options, shift the earliest starts after them and account the energy change.

        The shift is given up (and undone; ``None`` returned) as soon as a node after both moved ones starts
        past its latest start for the deadline, or so late that the iteration time grows by more than the
        moves save: neither can be undone further down, since nothing after that node changed.
        """
        choice, durations, start = self.choice, self.durations, self.start
        preds, succs, latest, pairs = self.preds, self.succs, self._latest, self._pred_pairs
        undone: list[tuple[int, int, float]] = []
        delta_j = 0.0
        heap: list[int] = []
        for i, k in moves:
            table = self.tables[i]
            undone.append((i, choice[i], durations[i]))
            delta_j += table.costs[k] - table.costs[choice[i]]  # type: ignore[union-attr]
            choice[i], durations[i] = k, table.times_s[k]  # type: ignore[union-attr]
            heap.extend(succs[i])
        heapq.heapify(heap)
        queued = set(heap)
        after = max(i for i, _ in moves)
        tolerance_s = REL_TOL * deadline_s
        # Latest starts for the current iteration time are those for the deadline less the spare time.
        spare_s = deadline_s - start[self.sink]
        # With no later stage end cheaper (blocked >= idle power), a later start bounds the energy change.
        time_weight = self.time_weight_w if self.end_weight_w >= 0 else 0.0
        changed: list[tuple[int, float]] = []
        last_shift_s = sink_shift_s = 0.0
        while heap:
            v = heapq.heappop(heap)
            pair = pairs[v]
            if pair is not None:
                first, second = start[pair[0]] + durations[pair[0]], start[pair[1]] + durations[pair[1]]
                begin = first if first > second else second
            else:
                begin = max([start[u] + durations[u] for u in preds[v]])
            if begin == start[v]:
                continue
            if v > after and (
                begin > latest[v] + tolerance_s or delta_j + time_weight * (begin - latest[v] - spare_s) >= 0
            ):
                record = undone, changed, 0.0
                self._undo(record)
                return None
            changed.append((v, start[v]))
            if self.is_last[v]:
                last_shift_s += begin - start[v]
            elif v == self.sink:
                sink_shift_s = begin - start[v]
            start[v] = begin
            for w in succs[v]:
                if w not in queued:
                    queued.add(w)
                    heapq.heappush(heap, w)
        delta_j += self.end_weight_w * last_shift_s + self.time_weight_w * sink_shift_s
        return undone, changed, delta_j

    def _undo(self, record: tuple[list[tuple[int, int, float]], list[tuple[int, float]], float]) -> None:
        undone, changed, _ = record
        for i, k, duration in undone:
            self.choice[i], self.durations[i] = k, duration
        for v, begin in changed:
            self.start[v] = begin
