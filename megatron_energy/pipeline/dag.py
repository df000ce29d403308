"""The pipeline-parallel training iteration as a DAG of instructions, communication and the iteration tail.

A node is one piece of work with a duration: a forward or backward pass of one microbatch on one pipeline
stage and model chunk (an :class:`~megatron_energy.pipeline.instruction.Instruction`), or, in the combined
1F1B schedule, a forward and another microbatch's backward run as one step (a
:class:`~megatron_energy.pipeline.instruction.FusedInstruction`, whose dependencies are both passes'), one
point-to-point transfer between stages (a :class:`~megatron_energy.pipeline.dag_nodes.Transfer`, named after
the pass that sends), a per-stage tail step (:class:`~megatron_energy.pipeline.dag_nodes.TailStep`
``dp_sync``, ``optimizer``, or ``outside`` for a measured tail) or the dummy ``"source"`` / ``"sink"``. Edges
are dependencies: each rank runs its instructions in the order it is given, and a stage cannot start a pass
before its neighbour's activation (forward) or gradient (backward) has arrived.

The graph is kept as a ``networkx.DiGraph`` for inspection and for solvers that want one. The longest-path
passes (ASAP schedule, latest start, slack) run on integer arrays built once: every node has an index, and
indices are a topological order, so one sweep over ``range(n)`` is a valid schedule pass.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.dag_graph import build_graph
from megatron_energy.pipeline.dag_nodes import CommSpec, IterationTail, NodeId
from megatron_energy.pipeline.instruction import Instruction, Step
from megatron_energy.pipeline.orders import PipelineOrders


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
        graph, nodes, index_edges = build_graph(orders, comm, tail)
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
