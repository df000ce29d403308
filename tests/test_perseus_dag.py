import itertools
import random
import re

import networkx as nx
import numpy as np
import pytest

from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import SINK, SOURCE, CommSpec, IterationTail, TailStep, Transfer
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.schedule_orders import pipeline_orders


def fwd(stage: int, microbatch: int, chunk: int = 0) -> Instruction:
    """The forward pass of ``microbatch`` through ``chunk`` on ``stage``."""
    return Instruction(stage, chunk, microbatch, "forward")


def bwd(stage: int, microbatch: int, chunk: int = 0) -> Instruction:
    """The backward pass of ``microbatch`` through ``chunk`` on ``stage``."""
    return Instruction(stage, chunk, microbatch, "backward")


# Two stages, two microbatches, Megatron 1F1B: rank 0 F0 F1 B0 B1, rank 1 F0 B0 F1 B1.
ORDERS_2X2 = PipelineOrders(
    ranks=(
        (fwd(0, 0), fwd(0, 1), bwd(0, 0), bwd(0, 1)),
        (fwd(1, 0), bwd(1, 0), fwd(1, 1), bwd(1, 1)),
    ),
    num_microbatches=2,
)
# Stage 0: forward 1 s, backward 2 s; stage 1 (heavier): forward 2 s, backward 3 s.
TIMES_2X2 = {
    Work(0, 0, "forward"): 1.0,
    Work(0, 0, "backward"): 2.0,
    Work(1, 0, "forward"): 2.0,
    Work(1, 0, "backward"): 3.0,
}


def _durations(dag: PipelineDag, times: dict[Work, float]) -> dict[Instruction, float]:
    """Every compute node's duration, looked up by its work (stage, chunk, kind)."""
    return {node: times[node.work] for node in dag.compute_nodes()}


def test_orders_from_megatron_match_the_hand_written_ones():
    assert pipeline_orders(2, 2) == ORDERS_2X2


def test_small_pipeline_schedule_critical_path_and_slack_by_hand():
    dag = PipelineDag.build(ORDERS_2X2)
    durations = _durations(dag, TIMES_2X2)
    schedule = dag.schedule(durations)
    # Stage 0: F0 0-1, F1 1-2, B0 6-8, B1 11-13. Stage 1: F0 1-3, B0 3-6, F1 6-8, B1 8-11.
    expected = {
        fwd(0, 0): 0,
        fwd(0, 1): 1,
        fwd(1, 0): 1,
        bwd(1, 0): 3,
        fwd(1, 1): 6,
        bwd(1, 1): 8,
        bwd(0, 0): 6,
        bwd(0, 1): 11,
    }
    assert {node: schedule.start(node) for node in expected} == expected
    assert schedule.makespan_s == 13.0
    path = [node for node in dag.critical_path(durations) if dag.graph.nodes[node]["type"] == "compute"]
    assert path == [fwd(0, 0), fwd(1, 0), bwd(1, 0), fwd(1, 1), bwd(1, 1), bwd(0, 1)]
    slack = dag.slack(durations)
    for node in path:
        assert slack[node] == 0.0
    # bwd(0,0) may end as late as bwd(0,1)'s latest start (11): slack 11 - 2 - 6 = 3.
    assert slack[bwd(0, 0)] == pytest.approx(3.0)
    # fwd(0,1) feeds fwd(1,1) (latest start 6) and bwd(0,0) (latest start 9): latest start 5, earliest 1.
    assert slack[fwd(0, 1)] == pytest.approx(4.0)
    # Stage 1's tail may wait until the sink at 13; it is ready at 11.
    assert slack[TailStep("dp_sync", 1)] == pytest.approx(2.0)


def test_communication_and_tail_nodes_by_hand():
    comm = CommSpec(latency_s=0.5, bandwidth_gbps=1.0, activation_bytes=500_000_000)
    assert comm.duration_s == pytest.approx(1.0)
    dag = PipelineDag.build(ORDERS_2X2, comm=comm, tail=IterationTail(dp_sync_s=0.25, optimizer_s=0.5))
    schedule = dag.schedule(_durations(dag, TIMES_2X2))
    # F00 0-1, send 1-2, F10 2-4, B10 4-7, send 7-8, F11 7-9, B11 9-12, send 12-13, B00 8-10, B01 13-15.
    assert schedule.start(fwd(1, 0)) == 2.0
    assert schedule.start(bwd(0, 0)) == 8.0
    assert schedule.start(bwd(0, 1)) == 13.0
    assert schedule.start(Transfer(bwd(1, 1))) == 12.0
    assert schedule.end(TailStep("optimizer", 1)) == pytest.approx(12.75)
    assert schedule.makespan_s == pytest.approx(15.75)
    assert [node for node in dag.critical_path(_durations(dag, TIMES_2X2)) if isinstance(node, TailStep)] == [
        TailStep("dp_sync", 0),
        TailStep("optimizer", 0),
    ]


@pytest.mark.parametrize(
    ("stages", "microbatches"), [(2, 4), (4, 8), (4, 4), pytest.param(8, 16, marks=pytest.mark.slow), (3, 2)]
)
def test_balanced_1f1b_takes_microbatches_plus_stages_minus_one_slots(stages, microbatches):
    dag = PipelineDag.build(pipeline_orders(stages, microbatches))
    t_f, t_b = 1.25, 2.5
    durations = {node: t_f if node.kind == "forward" else t_b for node in dag.compute_nodes()}
    assert dag.schedule(durations).makespan_s == (microbatches + stages - 1) * (t_f + t_b)


def test_structure_of_an_interleaved_dag():
    stages, microbatches, chunks = 4, 8, 2
    orders = pipeline_orders(stages, microbatches, chunks)
    dag = PipelineDag.build(orders)
    assert dag.num_chunks == chunks
    types = [dag.graph.nodes[node]["type"] for node in dag.nodes]
    assert types.count("compute") == 2 * stages * microbatches * chunks
    # Every hop of a microbatch's forward (and backward) chain crosses stages: S*C - 1 hops per direction.
    assert types.count("comm") == 2 * microbatches * (stages * chunks - 1)
    assert types.count("tail") == 2 * stages
    assert dag.nodes[0] == SOURCE and dag.nodes[-1] == SINK
    edges = dag.edges_array()
    assert edges.shape == (dag.graph.number_of_edges(), 2)
    assert np.all(edges[:, 0] < edges[:, 1])  # indices are a topological order
    assert np.array_equal(dag.topo_indices(), np.arange(len(dag.nodes)))
    assert {(dag.nodes[u], dag.nodes[v]) for u, v in edges} == set(dag.graph.edges)
    assert nx.is_directed_acyclic_graph(dag.graph)
    # The last chunk of the last stage turns a microbatch around; chunk wrap goes last stage -> first stage.
    assert dag.graph.has_edge(fwd(stages - 1, 3, chunks - 1), bwd(stages - 1, 3, chunks - 1))
    assert dag.graph.has_edge(Transfer(fwd(stages - 1, 3, 0)), fwd(0, 3, 1))
    assert dag.graph.has_edge(Transfer(bwd(0, 3, 1)), bwd(stages - 1, 3, 0))
    # A rank's order is the executed order it was built from, and the DAG chains its instructions in it.
    order = dag.stage_order(2)
    assert order == list(orders.ranks[2])
    assert {node.stage for node in order} == {2}
    assert all(dag.graph.has_edge(a, b) for a, b in itertools.pairwise(order))


def test_makespan_and_slack_agree_with_networkx_longest_paths():
    rng = random.Random(7)
    dag = PipelineDag.build(
        pipeline_orders(4, 8, 2),
        comm=CommSpec(1e-3, 10.0, 10_000_000),
        tail=IterationTail(dp_sync_s=0.01, optimizer_s=0.02),
    )
    durations = {node: rng.uniform(0.01, 0.05) for node in dag.compute_nodes()}
    array = dag.durations_array(durations)
    weighted = nx.DiGraph()
    weighted.add_weighted_edges_from((dag.nodes[u], dag.nodes[v], array[u]) for u, v in dag.edges_array())
    makespan = dag.schedule(durations).makespan_s
    assert makespan == pytest.approx(nx.dag_longest_path_length(weighted))
    slack = dag.slack(durations)
    assert min(slack.values()) == 0.0
    for node in rng.sample(dag.compute_nodes(), 20):
        longer = dict(durations)
        longer[node] += slack[node]
        assert dag.schedule(longer).makespan_s == pytest.approx(makespan, abs=1e-12)
        longer[node] += 1e-3
        assert dag.schedule(longer).makespan_s > makespan + 1e-4


def test_missing_durations_and_bad_orders_are_refused():
    dag = PipelineDag.build(ORDERS_2X2)
    with pytest.raises(ValueError, match="no duration"):
        dag.schedule({fwd(0, 0): 1.0})
    # The orders are checked where they are made (PipelineOrders), before any DAG is built from them.
    missing = rf"stage 1 does not run .* missing e\.g\. \[{re.escape(repr(bwd(1, 1)))}\]"
    with pytest.raises(ValueError, match=missing):
        PipelineOrders((ORDERS_2X2.ranks[0], ORDERS_2X2.ranks[1][:-1]), num_microbatches=2)
    interleaved = pipeline_orders(2, 4, 2)
    with pytest.raises(ValueError, match=r"unexpected e\.g\. \[Instruction\(stage=0, chunk=1, "):
        PipelineOrders(interleaved.ranks, num_microbatches=4, num_chunks=1)
    # Rank 0 wants B0 (needs rank 1's B0) before F1; rank 1 wants F1 (needs rank 0's F1) before F0.
    deadlock = PipelineOrders(
        ranks=(
            (fwd(0, 0), bwd(0, 0), fwd(0, 1), bwd(0, 1)),
            (fwd(1, 1), fwd(1, 0), bwd(1, 0), bwd(1, 1)),
        ),
        num_microbatches=2,
    )
    with pytest.raises(ValueError, match="deadlock"):
        PipelineDag.build(deadlock)
