"""The search state of the switch-latency post-pass and its latency-aware evaluation (*modelled*).

A :data:`SearchState` holds the clock of every compute node, per stage in execution order; a
:class:`SwitchSearch` prices states on the latency-aware simulator (memoised, resuming from the pass of the
state the search stands on) and knows each stage's clock grid and each instruction's options. The steps of
the post-pass (:mod:`~megatron_energy.optimisers.perseus.switch_latency`) are functions of it: quantise
(``switch_quantise``), repair (``switch_repair``) and improve (``switch_improve``).
"""

from __future__ import annotations

from typing import Any

from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import NodeId
from megatron_energy.pipeline.instruction import Step
from megatron_energy.sim.simulator import ProfileLike, Simulator
from megatron_energy.sim.switching_pass import PassCheckpoint

REL_TOL = 1e-9
"""Relative tolerance of the deadline check and of an energy improvement (floating-point noise)."""

SearchState = list[list[int]]
"""Clock of every compute node, per stage in that rank's execution order."""


class SwitchSearch:
    """What the quantise, repair and improve steps share: states priced on the latency-aware simulator.

    Evaluations are memoised and counted (:attr:`evaluations`); :attr:`place`, :attr:`options` and
    :attr:`grids` index a state's nodes, their instructions' options and each stage's common clocks.
    """

    def __init__(self, dag: PipelineDag, profile: ProfileLike, simulator: Simulator, deadline_s: float):
        """Index ``dag``'s stage orders and ``profile``'s options for searches under ``deadline_s``."""
        self.dag = dag
        self.simulator = simulator
        self.deadline_s = deadline_s
        self.latency_s = simulator.switch_latency_s
        self.blocked_power_w = simulator.powers.blocked_power_w
        self.orders = [dag.stage_steps(stage) for stage in range(dag.num_stages)]
        self.keys = [[node.work for node in order] for order in self.orders]
        self.place: dict[NodeId, tuple[int, int]] = {
            node: (s, i) for s, order in enumerate(self.orders) for i, node in enumerate(order)
        }
        """Each compute node's (stage, index in its stage's order)."""
        self.options = {
            key: {option.clock_mhz: option for option in profile.options(key)}
            for key in {key for keys in self.keys for key in keys}
        }
        """Each instruction's options by clock."""
        self._fastest = {key: profile.fastest(key).clock_mhz for key in self.options}
        self.grids = [
            sorted(set.intersection(*(set(self.options[key]) for key in set(keys)))) for keys in self.keys
        ]
        """Per stage, the clocks every instruction of the stage has an option at, ascending."""
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

    def fastest_clock(self, node: Step) -> int:
        """Clock of the fastest option of a compute node's instruction."""
        stage, i = self.place[node]
        return self._fastest[self.keys[stage][i]]

    def to_clocks(self, state: SearchState) -> dict[Step, int]:
        """The clock plan of a state."""
        return {
            node: clock
            for order, clocks in zip(self.orders, state, strict=True)
            for node, clock in zip(order, clocks, strict=True)
        }

    def evaluate(self, state: SearchState) -> tuple[float, float]:
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

    def stand_on(self, state: SearchState) -> None:
        """Resume later simulations from ``state``'s pass, if it was the last one simulated."""
        key, checkpoint = self._recent
        if checkpoint is not None and key == tuple(map(tuple, state)):
            self._base = checkpoint

    def _chosen(self, state: SearchState) -> list[Any]:
        """The profile's option of every node of ``state``, by the simulator's compute position.

        What ``Simulator.evaluate`` would pick for ``to_clocks(state)``, without building that mapping: the
        grids hold only clocks every instruction of a stage has an option at.
        """
        chosen: list[Any] = [None] * self._num_compute
        for positions, keys, clocks in zip(self._positions, self.keys, state, strict=True):
            for position, key, clock in zip(positions, keys, clocks, strict=True):
                chosen[position] = self.options[key][clock]
        return chosen

    def feasible(self, time_s: float) -> bool:
        """Whether an iteration time meets the deadline (up to rounding)."""
        return time_s <= self.deadline_s * (1.0 + REL_TOL)

    def cost(self, state: SearchState) -> tuple[float, float]:
        """Ranking of states: overshoot of the deadline first, then energy."""
        time_s, energy_j = self.evaluate(state)
        return (0.0 if self.feasible(time_s) else time_s - self.deadline_s, energy_j)

    def all_fastest(self) -> SearchState:
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
            time_s = sum(self.options[key][clock].time_s for key in keys)
            energy_j = sum(self.options[key][clock].energy_j for key in keys)
            if best is None or (time_s, energy_j) < best[:2]:
                best = (time_s, energy_j, clock)
        return None if best is None else best[2]

    def marginal_j(self, stage: int, i: int, clock: int) -> float:
        """Energy of instruction ``i`` at ``clock`` less blocked power over its time.

        What running the instruction at that clock costs where the time it saves is spent waiting.
        """
        option = self.options[self.keys[stage][i]][clock]
        return option.energy_j - self.blocked_power_w * option.time_s
