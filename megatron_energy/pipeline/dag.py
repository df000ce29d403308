"""The pipeline-parallel training iteration as a DAG of instructions, communication and the iteration tail.

A node is one piece of work with a duration: a forward or backward pass of one microbatch on one pipeline
stage and model chunk (an :class:`~megatron_energy.pipeline.instruction.Instruction`), or, in the combined
1F1B schedule, a forward and another microbatch's backward run as one step (a
:class:`~megatron_energy.pipeline.instruction.FusedInstruction`, whose dependencies are both passes'), one
point-to-point
transfer between stages (a :class:`Transfer`, named after the pass that sends), a per-stage tail step
(:class:`TailStep` ``dp_sync``, ``optimizer``, or ``outside`` for a measured tail) or the dummy
``"source"`` / ``"sink"``. Edges are dependencies: each rank runs its instructions in the order it is given,
and a stage cannot start a pass before its neighbour's activation (forward) or gradient (backward) has
arrived.

The graph is kept as a ``networkx.DiGraph`` for inspection and for solvers that want one. The longest-path
passes (ASAP schedule, latest start, slack) run on integer arrays built once: every node has an index, and
indices are a topological order, so one sweep over ``range(n)`` is a valid schedule pass.
"""

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

import networkx as nx
import numpy as np

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.instruction import FusedInstruction, Instruction, Step, passes
from megatron_energy.pipeline.orders import PipelineOrders


class Transfer(NamedTuple):
    """The point-to-point transfer of what ``sender`` produced to the stage that consumes it."""

    sender: Instruction
    """The instruction whose output (activation or gradient) is sent."""


class TailStep(NamedTuple):
    """Work of one stage after its last backward pass."""

    name: str
    """``"dp_sync"`` (data-parallel gradient sync), ``"optimizer"`` (optimizer step) or ``"outside"`` (the
    measured time of an iteration outside the pipeline span)."""
    stage: int
    """Pipeline stage."""


NodeId = Instruction | FusedInstruction | Transfer | TailStep | str
"""A node of the DAG: an instruction or fused pair, a transfer, a tail step, or ``"source"`` / ``"sink"``."""

SOURCE = "source"
SINK = "sink"


@dataclass(frozen=True)
class CommSpec:
    """Point-to-point transfer between adjacent pipeline stages.

    Attributes:
        latency_s: Fixed cost of one transfer.
        bandwidth_gbps: Link bandwidth in GB/s (1e9 bytes per second).
        activation_bytes: Bytes of one transfer (activation forward, its gradient backward).
    """

    latency_s: float
    bandwidth_gbps: float
    activation_bytes: int

    @property
    def duration_s(self) -> float:
        """Time of one transfer: latency plus bytes over bandwidth."""
        return self.latency_s + self.activation_bytes / (self.bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class IterationTail:
    """What each stage does between its last backward pass and the next iteration's first instruction.

    Two kinds, whose energy the simulator counts differently (``sim.simulator``):

    * **modelled** (a job description, ``megatron-energy plan --config``): the data-parallel gradient sync
      and the optimizer step, timed by the job model; their energy is modelled at idle power;
    * **measured** (the session's profiling at stock clocks): ``outside_s``, the part of an iteration that
      lies outside the replica's pipeline span (gradient sync, optimizer step, data loading, logging, host
      gaps), measured as one span, and ``stage_energy_j``, each stage's GPU's energy over it as measured;
      the simulator carries that energy as is and charges no idle power over the span.

    The tail is the same length on every stage.

    Attributes:
        dp_sync_s: Data-parallel gradient synchronisation (modelled).
        optimizer_s: Optimizer step (modelled).
        outside_s: Measured time of an iteration outside the pipeline span (0 for a modelled tail).
        stage_energy_j: Measured energy of each stage's GPU over ``outside_s``; empty for a modelled tail.
    """

    dp_sync_s: float = 0.0
    optimizer_s: float = 0.0
    outside_s: float = 0.0
    stage_energy_j: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        values = (self.dp_sync_s, self.optimizer_s, self.outside_s, *self.stage_energy_j)
        if not all(math.isfinite(value) and value >= 0 for value in values):
            raise EnergyValueError(f"an iteration tail's times and energies must be finite and >= 0: {self}")

    @classmethod
    def measured(cls, outside_s: float, stage_energy_j: Sequence[float]) -> "IterationTail":
        """A measured tail: ``outside_s`` on every stage, each stage's GPU using ``stage_energy_j[stage]``."""
        return cls(outside_s=outside_s, stage_energy_j=tuple(stage_energy_j))

    @property
    def is_measured(self) -> bool:
        """Whether the tail's energy was measured (else it is modelled at idle power)."""
        return bool(self.stage_energy_j)

    @property
    def time_s(self) -> float:
        """The whole tail of one stage."""
        return self.dp_sync_s + self.optimizer_s + self.outside_s

    def energy_j(self, stage: int, idle_power_w: float) -> float:
        """Energy of one stage's GPU over its tail: as measured, or (modelled) its time at idle power."""
        if self.is_measured:
            return self.stage_energy_j[stage]
        return self.time_s * idle_power_w


@dataclass(frozen=True)
class Schedule:
    """An ASAP schedule: start and end of every node, indexed like ``PipelineDag.nodes``.

    Attributes:
        nodes: The DAG's nodes, position = node index.
        index: Node -> index.
        start_s: Earliest start of each node.
        end_s: Earliest end of each node.
        makespan_s: End of the sink: the iteration time.
    """

    nodes: Sequence[NodeId]
    index: Mapping[NodeId, int]
    start_s: np.ndarray
    end_s: np.ndarray
    makespan_s: float

    def start(self, node: NodeId) -> float:
        """Earliest start of ``node``."""
        return float(self.start_s[self.index[node]])

    def end(self, node: NodeId) -> float:
        """Earliest end of ``node``."""
        return float(self.end_s[self.index[node]])


def _receiver(node: Instruction, num_stages: int, num_chunks: int) -> Instruction | None:
    """The instruction that consumes what ``node`` produces, if any."""
    stage, chunk, microbatch, kind = node
    if kind == "forward":
        if stage < num_stages - 1:
            return Instruction(stage + 1, chunk, microbatch, "forward")
        if chunk < num_chunks - 1:
            return Instruction(0, chunk + 1, microbatch, "forward")
        return Instruction(stage, chunk, microbatch, "backward")
    if stage > 0:
        return Instruction(stage - 1, chunk, microbatch, "backward")
    if chunk > 0:
        return Instruction(num_stages - 1, chunk - 1, microbatch, "backward")
    return None


class PipelineDag:
    """The DAG of one training iteration of a pipeline-parallel job.

    Build it with :meth:`build`. Node indices (``index``, ``nodes``) are a topological order.

    Attributes:
        graph: The DAG; node attributes ``type`` ("compute", "comm", "tail", "source", "sink"), ``stage``,
            ``kind``, ``chunk``, ``microbatch`` (where they apply) and ``duration_s`` for non-compute nodes.
        num_stages: Pipeline stages.
        num_chunks: Model chunks per stage (virtual pipeline size).
        tail: The iteration tail its tail nodes take (measured or modelled; zero when built without one).
        nodes: Node at each index (topological order).
        index: Node -> index.
    """

    def __init__(
        self,
        graph: nx.DiGraph,
        nodes: list[NodeId],
        edges: list[tuple[int, int]],
        orders: PipelineOrders,
        tail: IterationTail | None = None,
    ):
        """Store a graph whose ``nodes`` are already in topological order; use :meth:`build` instead."""
        self.graph = graph
        self.orders = orders
        self.tail = tail or IterationTail()
        self.num_stages = orders.num_stages
        self.num_chunks = orders.num_chunks
        self.nodes = nodes
        self.index = {node: i for i, node in enumerate(nodes)}
        self._edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        self._preds: list[list[int]] = [[] for _ in nodes]
        self._succs: list[list[int]] = [[] for _ in nodes]
        for u, v in edges:
            self._preds[v].append(u)
            self._succs[u].append(v)
        attrs = graph.nodes
        self._fixed_s = np.array([attrs[node].get("duration_s", 0.0) for node in nodes], dtype=float)
        self._compute = np.array(
            [i for i, node in enumerate(nodes) if attrs[node]["type"] == "compute"], dtype=np.int64
        )

    @classmethod
    def build(
        cls,
        orders: PipelineOrders,
        comm: CommSpec | None = None,
        tail: IterationTail | None = None,
    ) -> "PipelineDag":
        """Build the DAG from the executed instruction orders: the one way every part of the job builds it.

        Args:
            orders: Every rank's instruction order (the job context's, from megatron-core's schedule).
            comm: Point-to-point transfer cost; transfers take no time when ``None``.
            tail: Data-parallel sync and optimizer step per stage (modelled), or the measured time outside the
                pipeline span; they take no time when ``None``.

        Returns:
            The DAG.

        Raises:
            EnergyValueError: If the orders deadlock (a rank waits for work scheduled after it), a fused step
                pairs a pass with one it waits for, or a measured tail does not give one energy per stage.
        """
        stage_orders = [list(orders.steps(stage)) for stage in range(orders.num_stages)]
        if tail is not None and tail.is_measured and len(tail.stage_energy_j) != len(stage_orders):
            raise EnergyValueError(
                f"the measured iteration tail gives {len(tail.stage_energy_j)} stage energies for "
                f"{len(stage_orders)} stages"
            )
        num_chunks = orders.num_chunks
        graph = nx.DiGraph()
        graph.add_node(SOURCE, type="source", duration_s=0.0)
        edges = _add_compute(graph, stage_orders)
        edges += _add_transfers(graph, stage_orders, num_chunks, comm.duration_s if comm is not None else 0.0)
        edges += _add_tail(graph, stage_orders, tail or IterationTail())
        graph.add_node(SINK, type="sink", duration_s=0.0)
        edges = list(dict.fromkeys(edges))  # a stage's order edge may coincide with its F -> B turn-around
        graph.add_edges_from(edges)

        nodes = _topological_order(list(graph.nodes), edges)
        position = {node: i for i, node in enumerate(nodes)}
        index_edges = [(position[u], position[v]) for u, v in edges]
        return cls(graph, nodes, index_edges, orders, tail)

    # ----- structure -------------------------------------------------------------------------------------

    def compute_steps(self) -> list[Step]:
        """Compute nodes (passes, and combined 1F1B's fused pairs) in topological order."""
        return [step for step in map(self.nodes.__getitem__, self._compute) if isinstance(step, Step)]

    def stage_steps(self, stage: int) -> list[Step]:
        """Compute nodes of ``stage`` (passes, and combined 1F1B's fused pairs) in execution order."""
        return list(self.orders.steps(stage))

    def compute_nodes(self) -> list[Instruction]:
        """Forward and backward nodes in topological order, for planners that know no fused steps.

        Raises:
            EnergyValueError: On a combined 1F1B DAG (use :meth:`compute_steps`).
        """
        self._require_passes()
        return [node for node in self.compute_steps() if isinstance(node, Instruction)]

    def stage_order(self, stage: int) -> list[Instruction]:
        """Instructions of ``stage`` in that rank's execution order, for planners that know no fused steps.

        Raises:
            EnergyValueError: On a combined 1F1B DAG (use :meth:`stage_steps`).
        """
        self._require_passes()
        return list(self.orders.stage(stage))

    def _require_passes(self) -> None:
        if self.orders.is_combined:
            raise EnergyValueError(
                "this planner does not know the combined 1F1B schedule's fused steps "
                "(--overlap-moe-expert-parallel-comm); use --energy-mode perseus, or drop the flag"
            )

    def topological_order(self) -> list[NodeId]:
        """All nodes in topological order (the index order)."""
        return list(self.nodes)

    def topo_indices(self) -> np.ndarray:
        """Node indices in topological order; indices are assigned topologically, so this is ``arange(n)``."""
        return np.arange(len(self.nodes), dtype=np.int64)

    def edges_array(self) -> np.ndarray:
        """Edges as an ``(E, 2)`` int64 array of ``(predecessor index, successor index)``."""
        return self._edges.copy()

    def compute_indices(self) -> np.ndarray:
        """Indices of the forward and backward nodes, ascending (topological)."""
        return self._compute.copy()

    def fixed_durations_s(self) -> np.ndarray:
        """Duration of every node that is not a compute node (comm, tail); 0 for compute, source and sink."""
        return self._fixed_s.copy()

    # ----- timing ----------------------------------------------------------------------------------------

    def durations_array(self, durations: Mapping[NodeId, float]) -> np.ndarray:
        """Turn per-node durations into an array by index.

        Args:
            durations: Duration of every compute node; entries for comm or tail nodes override theirs.

        Returns:
            Durations indexed like ``nodes``.

        Raises:
            ValueError: If a compute node has no duration.
            KeyError: If a key is not a node of this DAG.
        """
        array = self._fixed_s.copy()
        array[self._compute] = np.nan
        for node, value in durations.items():
            array[self.index[node]] = value
        missing = self._compute[np.isnan(array[self._compute])]
        if missing.size:
            examples = [self.nodes[i] for i in missing[:3]]
            raise ValueError(f"{missing.size} compute nodes have no duration, e.g. {examples}")
        return array

    def schedule(self, durations: Mapping[NodeId, float]) -> Schedule:
        """ASAP schedule: every node starts as soon as all its predecessors have ended.

        Args:
            durations: Duration of every compute node (see :meth:`durations_array`).

        Returns:
            Start and end of every node and the makespan (iteration time).
        """
        return self.schedule_array(self.durations_array(durations))

    def schedule_array(self, durations_s: np.ndarray) -> Schedule:
        """ASAP schedule from durations indexed like ``nodes`` (the fast path for solvers and simulator)."""
        start, end, _ = self._forward_pass(durations_s)
        return Schedule(self.nodes, self.index, np.array(start), np.array(end), end[-1])

    def critical_path(self, durations: Mapping[NodeId, float]) -> list[NodeId]:
        """A longest path from source to sink, without the source and sink themselves.

        Where two predecessors end at the same time, the one listed first in the graph's edges is followed.

        Args:
            durations: Duration of every compute node (see :meth:`durations_array`).

        Returns:
            The nodes of the path in execution order.
        """
        _, _, binding = self._forward_pass(self.durations_array(durations))
        path = []
        node = binding[len(self.nodes) - 1]
        while node > 0:
            path.append(self.nodes[node])
            node = binding[node]
        return path[::-1]

    def latest_start_s(self, durations_s: np.ndarray, makespan_s: float) -> np.ndarray:
        """Latest start of every node that still lets the sink end by ``makespan_s``.

        Args:
            durations_s: Durations indexed like ``nodes``.
            makespan_s: Deadline for the sink.

        Returns:
            Latest start by index.
        """
        durations = durations_s.tolist()
        latest = [0.0] * len(durations)
        succs = self._succs
        for v in range(len(durations) - 1, -1, -1):
            successors = succs[v]
            latest_end = min(map(latest.__getitem__, successors)) if successors else makespan_s
            latest[v] = latest_end - durations[v]
        return np.array(latest)

    def slack(self, durations: Mapping[NodeId, float]) -> dict[NodeId, float]:
        """Latest start minus earliest start of every node, at the ASAP makespan.

        Args:
            durations: Duration of every compute node (see :meth:`durations_array`).

        Returns:
            Slack per node (0 on a critical path, up to floating-point rounding, never negative).
        """
        durations_s = self.durations_array(durations)
        schedule = self.schedule_array(durations_s)
        slack = self.latest_start_s(durations_s, schedule.makespan_s) - schedule.start_s
        return dict(zip(self.nodes, np.maximum(slack, 0.0).tolist(), strict=True))

    def _forward_pass(self, durations_s: np.ndarray) -> tuple[list[float], list[float], list[int]]:
        """Earliest start and end by index, and each node's predecessor that binds its start (-1: none)."""
        durations = durations_s.tolist()
        n = len(durations)
        start = [0.0] * n
        end = [0.0] * n
        binding = [-1] * n
        for v, preds in enumerate(self._preds):
            if preds:
                ends = [end[u] for u in preds]
                latest = max(ends)
                start[v] = latest
                binding[v] = preds[ends.index(latest)]
            end[v] = start[v] + durations[v]
        return start, end, binding


def _add_compute(graph: nx.DiGraph, stage_orders: list[list[Step]]) -> list[tuple[NodeId, NodeId]]:
    """Add the compute nodes; return the source edges and each rank's order edges."""
    edges: list[tuple[NodeId, NodeId]] = []
    for order in stage_orders:
        graph.add_nodes_from(
            (
                node,
                {
                    "type": "compute",
                    "kind": node.kind,
                    "stage": node.stage,
                    "chunk": node.chunk,
                    "microbatch": node.microbatch,
                    "work": node.work,
                },
            )
            for node in order
        )
        edges.append((SOURCE, order[0]))
        edges.extend(pairwise(order))
    return edges


def _add_transfers(
    graph: nx.DiGraph, stage_orders: list[list[Step]], num_chunks: int, comm_s: float
) -> list[tuple[NodeId, NodeId]]:
    """Add a transfer node on every cross-stage dependency; return the dependency edges.

    A fused step depends on what both its passes receive, and both its passes' outputs leave when it ends.
    """
    num_stages = len(stage_orders)
    step_of = {instruction: step for order in stage_orders for step in order for instruction in passes(step)}
    edges: list[tuple[NodeId, NodeId]] = []
    for order in stage_orders:
        for node in order:
            for sender in passes(node):
                receiver_pass = _receiver(sender, num_stages, num_chunks)
                if receiver_pass is None:
                    continue
                receiver = step_of[receiver_pass]
                if receiver == node:
                    raise EnergyValueError(
                        f"the step {node.label} fuses {receiver_pass.label} with {sender.label}, which it "
                        "waits for: megatron-core never fuses dependent passes"
                    )
                if receiver.stage == node.stage:
                    edges.append((node, receiver))
                    continue
                send = Transfer(sender)
                graph.add_node(
                    send,
                    type="comm",
                    kind=sender.kind,
                    stage=sender.stage,
                    dst_stage=receiver.stage,
                    chunk=sender.chunk,
                    microbatch=sender.microbatch,
                    duration_s=comm_s,
                )
                edges += [(node, send), (send, receiver)]
    return edges


def _add_tail(
    graph: nx.DiGraph, stage_orders: list[list[Step]], tail: IterationTail
) -> list[tuple[NodeId, NodeId]]:
    """Add each stage's tail steps after its last compute node; return their edges.

    Every stage gets a gradient sync and an optimizer step (modelled; zero-length for a measured tail), and a
    tail with a measured time one more step, ``outside``, of that time.
    """
    steps = [("dp_sync", tail.dp_sync_s), ("optimizer", tail.optimizer_s)]
    if tail.outside_s > 0:
        steps.append(("outside", tail.outside_s))
    edges: list[tuple[NodeId, NodeId]] = []
    for stage, order in enumerate(stage_orders):
        previous: NodeId = order[-1]
        for name, duration_s in steps:
            step = TailStep(name, stage)
            graph.add_node(step, type="tail", kind=name, stage=stage, duration_s=duration_s)
            edges.append((previous, step))
            previous = step
        edges.append((previous, SINK))
    return edges


def _topological_order(nodes: list[NodeId], edges: Iterable[tuple[NodeId, NodeId]]) -> list[NodeId]:
    """Kahn's algorithm, first-in first-out, so the order is deterministic for a given insertion order."""
    position = {node: i for i, node in enumerate(nodes)}
    succs: list[list[int]] = [[] for _ in nodes]
    indegree = [0] * len(nodes)
    for u, v in edges:
        succs[position[u]].append(position[v])
        indegree[position[v]] += 1
    ready = deque(i for i, d in enumerate(indegree) if d == 0)
    order = []
    while ready:
        done = ready.popleft()
        order.append(done)
        for after in succs[done]:
            indegree[after] -= 1
            if indegree[after] == 0:
                ready.append(after)
    if len(order) != len(nodes):
        raise EnergyValueError(
            "the instruction orders deadlock: some stage waits for work that another stage schedules after it"
        )
    return [nodes[i] for i in order]
