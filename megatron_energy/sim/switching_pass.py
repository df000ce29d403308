"""The simulator's switch-latency pass, and its rerun of only the nodes a change of options reaches.

With a switch latency, each compute node's time depends on the clock in effect on its stage when it starts,
which the stage's earlier requests set (the rules are in :mod:`megatron_energy.sim.simulator`, the switch
itself :mod:`megatron_energy.dvfs.clock_switch`'s). A node's
figures are a function of three things only: the end times of its predecessors, its own option, and its
stage's clock state left by the stage's previous compute node. So once a pass is kept
(:class:`PassCheckpoint`), a pass of other options reruns only the nodes whose inputs changed: the nodes with
another option, then, in index (topological) order, every node a rerun node's new end time or new stage state
reaches. A node whose figures come out unchanged stops the spread. Every node that is rerun computes the same
floats from the same inputs as in a whole pass, and every other node's inputs are those of the kept pass, so
the result is the whole pass's to the last float. A whole pass is the same loop with every node to be run.

A change of a stage's last compute node changes the steady state every stage starts the iteration from (the
clock of its last instruction), so such a pass runs whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from megatron_energy.dvfs.clock_switch import SwitchState, straddle
from megatron_energy.pipeline.instruction import Work


class Option(Protocol):
    """One profiled clock of an instruction: what the pass reads of it."""

    @property
    def clock_mhz(self) -> int:
        """The SM clock of this option."""
        ...

    @property
    def time_s(self) -> float:
        """The instruction's time at this clock."""
        ...

    @property
    def energy_j(self) -> float:
        """The instruction's energy at this clock."""
        ...


class Pass(NamedTuple):
    """What one schedule pass gives: node times by index, effective busy figures by compute position."""

    start_s: list[float]
    end_s: list[float]
    iteration_s: float
    times_s: list[float]
    energies_j: list[float]
    stale_clock_mhz: list[int | None]
    stale_s: list[float]
    stale_energy_j: list[float]


class PassCheckpoint(NamedTuple):
    """A switch-latency pass kept so that a pass of other options reruns only the nodes they reach."""

    chosen: list[Option]
    """The options it ran, by compute position."""
    passed: Pass
    """Its figures."""
    states: list[SwitchState | None]
    """The stage's clock state after each compute node (by compute position) started."""


@dataclass(frozen=True)
class SwitchingGraph:
    """The DAG as the pass walks it, built once per simulator (lists by node index or compute position)."""

    preds: list[list[int]]
    """Predecessor indices of every node."""
    succs: list[list[int]]
    """Successor indices of every node."""
    durations_s: list[float]
    """Fixed duration of every node that is not a compute node."""
    position: list[int]
    """Compute position of every node; -1 for the others."""
    node_of: list[int]
    """Node index of every compute position."""
    stage_of: list[int]
    """Stage of every compute position."""
    previous_in_stage: list[int]
    """Compute position of the same stage's previous compute node; -1 for a stage's first."""
    next_in_stage: list[int]
    """Node index of the same stage's next compute node; -1 for a stage's last."""
    last_positions: list[int]
    """Compute position of every stage's last compute node."""

    @classmethod
    def build(
        cls,
        num_nodes: int,
        edges: Sequence[Sequence[int]],
        durations_s: list[float],
        compute: list[int],
        stage_of: list[int],
        num_stages: int,
    ) -> SwitchingGraph:
        """The walk of a DAG of ``num_nodes`` nodes (indices topological) with compute nodes ``compute``.

        Args:
            num_nodes: Nodes in the DAG.
            edges: ``(predecessor, successor)`` index pairs.
            durations_s: Fixed duration of every node (0 for compute nodes).
            compute: Node index of every compute position, ascending.
            stage_of: Stage of every compute position.
            num_stages: Pipeline stages.
        """
        preds: list[list[int]] = [[] for _ in range(num_nodes)]
        succs: list[list[int]] = [[] for _ in range(num_nodes)]
        for u, v in edges:
            preds[v].append(u)
            succs[u].append(v)
        position = [-1] * num_nodes
        for pos, node in enumerate(compute):
            position[node] = pos
        previous_in_stage = [-1] * len(compute)
        next_in_stage = [-1] * len(compute)
        last: list[int] = [-1] * num_stages
        for pos, stage in enumerate(stage_of):
            if last[stage] >= 0:
                previous_in_stage[pos] = last[stage]
                next_in_stage[last[stage]] = compute[pos]
            last[stage] = pos
        return cls(
            preds, succs, durations_s, position, list(compute), list(stage_of), previous_in_stage,
            next_in_stage, last,
        )  # fmt: skip


def switching_pass(
    graph: SwitchingGraph,
    price: Callable[[Work, int], tuple[float, float]],
    keys: list[Work],
    chosen: list[Option],
    latency_s: float,
    base: PassCheckpoint | None = None,
) -> PassCheckpoint:
    """The ASAP pass in which each compute node's time depends on its stage's clock in effect.

    Args:
        graph: The DAG's walk.
        price: Time and energy of an instruction at a clock it may have no option at (interpolated).
        keys: Instruction of every compute position.
        chosen: Option of every compute position.
        latency_s: Switch latency, > 0.
        base: A kept pass (same graph and latency) to rerun only what changed from; ``None``: a whole pass.

    Returns:
        The pass, kept to be resumed from.
    """
    changed = [] if base is None else _changed_positions(chosen, base.chosen)
    steady = [chosen[pos].clock_mhz for pos in graph.last_positions]
    if base is None or any(pos in graph.last_positions for pos in changed):
        num_nodes, num_compute = len(graph.preds), len(chosen)
        start, end = [0.0] * num_nodes, [math.nan] * num_nodes  # nothing equals nan: every node spreads
        times_s, energies_j = [0.0] * num_compute, [0.0] * num_compute
        stale_clock: list[int | None] = [None] * num_compute
        stale_s, stale_j = [0.0] * num_compute, [0.0] * num_compute
        states: list[SwitchState | None] = [None] * num_compute
        to_run = bytearray(b"\x01") * num_nodes
    else:
        kept = base.passed
        start, end = list(kept.start_s), list(kept.end_s)
        times_s, energies_j = list(kept.times_s), list(kept.energies_j)
        stale_clock, stale_s, stale_j = (
            list(kept.stale_clock_mhz),
            list(kept.stale_s),
            list(kept.stale_energy_j),
        )
        states = list(base.states)
        to_run = bytearray(len(graph.preds))
        for pos in changed:
            to_run[graph.node_of[pos]] = 1
    preds, succs, position = graph.preds, graph.succs, graph.position
    v = to_run.find(1)
    while v >= 0:
        node_preds = preds[v]
        begin = max(map(end.__getitem__, node_preds)) if node_preds else 0.0
        start[v] = begin
        pos = position[v]
        if pos < 0:
            finish = begin + graph.durations_s[v]
        else:
            option, stage = chosen[pos], graph.stage_of[pos]
            before = graph.previous_in_stage[pos]
            previous = states[before] if before >= 0 else SwitchState(steady[stage], steady[stage], 0.0)
            state = previous.requested_at(option.clock_mhz, begin, latency_s)  # type: ignore[union-attr]
            effective = state.effective_mhz
            time_s, energy_j = option.time_s, option.energy_j
            if effective != option.clock_mhz:
                old_time_s, old_energy_j = price(keys[pos], effective)
                cut = straddle(state.due_s - begin, old_time_s, old_energy_j, time_s, energy_j)
                time_s, energy_j = cut.time_s, cut.energy_j
                stale_clock[pos], stale_s[pos], stale_j[pos] = effective, cut.stale_s, cut.stale_energy_j
            else:
                stale_clock[pos], stale_s[pos], stale_j[pos] = None, 0.0, 0.0
            times_s[pos], energies_j[pos] = time_s, energy_j
            if state != states[pos]:
                states[pos] = state
                after = graph.next_in_stage[pos]
                if after >= 0:
                    to_run[after] = 1
            finish = begin + time_s
        if finish != end[v]:
            end[v] = finish
            for after in succs[v]:
                to_run[after] = 1
        v = to_run.find(1, v + 1)
    passed = Pass(start, end, end[-1], times_s, energies_j, stale_clock, stale_s, stale_j)
    return PassCheckpoint(chosen, passed, states)


def _changed_positions(chosen: list[Option], before: list[Option]) -> list[int]:
    """Compute positions whose option is not the one in ``before``."""
    return [pos for pos, (mine, theirs) in enumerate(zip(chosen, before, strict=True)) if mine is not theirs]
