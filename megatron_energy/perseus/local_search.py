"""Exact local search on a rounded frontier plan, judged by the simulator's energy accounting."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from megatron_energy.pipeline.profile import ClockOption

REL_TOL = 1e-12
"""Relative tolerance of deadline checks (floating-point noise)."""


class OptionTable:
    """An instruction's options, time ascending, and the cheapest (least ``e − λ·t``) one up to each time.

    ``λ`` is the instruction's marginal power: blocked power, or idle power for a stage's last instruction.
    """

    def __init__(self, options: Sequence[ClockOption], marginal_power_w: float):
        self.options = sorted(options, key=lambda option: (option.time_s, option.energy_j))
        self.times_s = [option.time_s for option in self.options]
        self.costs = [option.energy_j - marginal_power_w * option.time_s for option in self.options]
        self._best_up_to = [0]
        for k in range(1, len(self.options)):
            previous = self._best_up_to[-1]
            self._best_up_to.append(k if self.costs[k] < self.costs[previous] else previous)

    def choose(self, window_s: float) -> int:
        """Index of the cheapest option that fits ``window_s`` (the fastest one when none fits)."""
        k = bisect.bisect_right(self.times_s, window_s * (1 + REL_TOL)) - 1
        return self._best_up_to[k] if k >= 0 else 0


_Undo = tuple[int, int, float, list[tuple[int, float]], float]
"""A move's node, its previous option and duration, the earliest starts it changed, and its energy change."""


class LocalSearch:
    """Exact local search on a rounded plan, judged by the simulator's energy accounting.

    Moves: one instruction to the option of least marginal cost that fits its float, or a pair of neighbouring
    instructions (one a step slower, the other a step faster). A move is kept only if the deadline still holds
    and the energy drops. Earliest starts are updated incrementally (node indices are topological), so a move
    costs time proportional to the part of the schedule it shifts.
    """

    def __init__(
        self,
        preds: list[list[int]],
        succs: list[list[int]],
        tables: dict[int, OptionTable],
        last_nodes: Sequence[int],
        sink: int,
        powers: tuple[float, float],
    ):
        self.preds, self.succs, self.tables, self.sink = preds, succs, tables, sink
        self.is_last = [False] * len(preds)
        for i in last_nodes:
            self.is_last[i] = True
        self.blocked_w, self.idle_w = powers
        self.num_stages = len(last_nodes)
        self.neighbours = {i: sorted(self._near(i) - {i}) for i in tables}
        self.choice: list[int] = []
        self.durations: list[float] = []
        self.start: list[float] = []

    def _near(self, i: int) -> set[int]:
        """Compute nodes at most two edges away from ``i`` (through a transfer node), either direction."""
        near: set[int] = set()
        for step in (self.preds, self.succs):
            for j in step[i]:
                near.add(j)
                near.update(step[j])
        return near & self.tables.keys()

    def improve(
        self, choice: list[int], durations: list[float], deadline_s: float, target_j: float
    ) -> list[int]:
        """Return an improved copy of ``choice`` that still meets ``deadline_s``.

        The search stops once the energy is at most ``target_j`` or no move helps.
        """
        self.choice, self.durations = list(choice), list(durations)
        self.start = [0.0] * len(durations)
        for v, preds in enumerate(self.preds):
            self.start[v] = max([self.start[u] + self.durations[u] for u in preds]) if preds else 0.0
        self.deadline_s = deadline_s * (1 + REL_TOL)
        self.excess_j = self._energy() - target_j
        while self.excess_j > 0 and (self._sweep(pairs=False) or self._sweep(pairs=True)):
            pass
        return self.choice

    def _energy(self) -> float:
        """Energy of the current plan (see the module docstring)."""
        ends = sum(self.start[i] + self.durations[i] for i, last in enumerate(self.is_last) if last)
        busy = sum(
            table.options[self.choice[i]].energy_j - self.blocked_w * self.durations[i]
            for i, table in self.tables.items()
        )
        iteration_s = self.start[self.sink]
        return busy + (self.blocked_w - self.idle_w) * ends + self.num_stages * self.idle_w * iteration_s

    def _moves(self, pairs: bool) -> list[tuple[float, tuple[tuple[int, int], ...]]]:
        """Candidate moves with their change of marginal cost (negative: promising), most promising first."""
        latest_end = [0.0] * len(self.durations)
        for v in range(len(self.durations) - 1, -1, -1):
            succs = self.succs[v]
            latest_end[v] = (
                min([latest_end[w] - self.durations[w] for w in succs]) if succs else self.deadline_s
            )
        moves = []
        for i, table in self.tables.items():
            current = self.choice[i]
            if not pairs:
                best = table.choose(latest_end[i] - self.start[i])
                if table.costs[best] < table.costs[current]:
                    moves.append((table.costs[best] - table.costs[current], ((i, best),)))
                continue
            if current + 1 == len(table.costs):
                continue
            slower = table.costs[current + 1] - table.costs[current]
            for j in self.neighbours[i]:
                other, at = self.tables[j], self.choice[j]
                if at > 0 and slower + other.costs[at - 1] - other.costs[at] < 0:
                    moves.append(
                        (slower + other.costs[at - 1] - other.costs[at], ((j, at - 1), (i, current + 1)))
                    )
        return sorted(moves)

    def _sweep(self, pairs: bool) -> bool:
        """Try every single (or pair) move once; True if any was kept."""
        kept = False
        for _, move in self._moves(pairs):
            undo = [self._apply(i, k) for i, k in move if self.choice[i] != k]
            delta_j = sum(record[-1] for record in undo)
            if self.start[self.sink] <= self.deadline_s and delta_j < -1e-9:
                self.excess_j += delta_j
                kept = True
            else:
                for record in reversed(undo):
                    self._undo(record)
        return kept

    def _apply(self, i: int, k: int) -> _Undo:
        """Move node ``i`` to option ``k``, shift the earliest starts after it and account the energy."""
        table, sink = self.tables[i], self.sink
        old_k, old_duration = self.choice[i], self.durations[i]
        self.choice[i], self.durations[i] = k, table.times_s[k]
        step_s = self.durations[i] - old_duration
        end_shift_s, time_shift_s = (step_s if self.is_last[i] else 0.0), 0.0
        changed: list[tuple[int, float]] = []
        heap = list(self.succs[i])
        heapq.heapify(heap)
        queued = set(heap)
        while heap:
            v = heapq.heappop(heap)
            start = max([self.start[u] + self.durations[u] for u in self.preds[v]])
            if start == self.start[v]:
                continue
            shift = start - self.start[v]
            changed.append((v, self.start[v]))
            self.start[v] = start
            end_shift_s += shift if self.is_last[v] else 0.0
            time_shift_s += shift if v == sink else 0.0
            for w in self.succs[v]:
                if w not in queued:
                    queued.add(w)
                    heapq.heappush(heap, w)
        delta_j = (
            table.options[k].energy_j
            - table.options[old_k].energy_j
            - self.blocked_w * step_s
            + (self.blocked_w - self.idle_w) * end_shift_s
            + self.num_stages * self.idle_w * time_shift_s
        )
        return i, old_k, old_duration, changed, delta_j

    def _undo(self, record: _Undo) -> None:
        i, k, duration, changed, _ = record
        self.choice[i], self.durations[i] = k, duration
        for v, start in changed:
            self.start[v] = start
