"""Building the pipeline DAG's graph from the executed instruction orders.

:func:`build_graph` adds every rank's instructions in its order, a
:class:`~megatron_energy.pipeline.dag_nodes.Transfer` on every cross-stage dependency (:func:`receiving_pass`
names the pass that consumes what another produces), each stage's tail steps, and the source and sink, and
numbers the nodes in a topological order (:class:`~megatron_energy.pipeline.dag.PipelineDag` is built on it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import pairwise

import networkx as nx

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.dag_nodes import (
    SINK,
    SOURCE,
    CommSpec,
    IterationTail,
    NodeId,
    TailStep,
    Transfer,
)
from megatron_energy.pipeline.instruction import Instruction, Step, passes
from megatron_energy.pipeline.orders import PipelineOrders


def build_graph(
    orders: PipelineOrders, comm: CommSpec | None, tail: IterationTail | None
) -> tuple[nx.DiGraph, list[NodeId], list[tuple[int, int]]]:
    """The DAG of ``orders``: its graph, its nodes in topological order, and its edges by node index.

    Args:
        orders: Every rank's instruction order.
        comm: Point-to-point transfer cost; transfers take no time when ``None``.
        tail: The iteration tail; it takes no time when ``None``.

    Raises:
        EnergyValueError: If the orders deadlock, a fused step pairs a pass with one it waits for, or a
            measured tail does not give one energy per stage.
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
    return graph, nodes, index_edges


def receiving_pass(node: Instruction, num_stages: int, num_chunks: int) -> Instruction | None:
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
                receiver_pass = receiving_pass(sender, num_stages, num_chunks)
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
