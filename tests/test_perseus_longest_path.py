import numpy as np
import pytest

from megatron_energy.optimisers.perseus.longest_path import earliest_starts, latest_starts, neighbour_pairs
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.schedule_orders import pipeline_orders


def test_neighbour_pairs_cover_degrees_one_and_two_only():
    assert neighbour_pairs([[], [4], [4, 7], [1, 2, 3]]) == [None, (4, 4), (4, 7), None]


@pytest.mark.parametrize(("stages", "microbatches", "chunks"), [(4, 8, 1), (3, 6, 2)])
def test_passes_equal_the_dag_schedule(stages, microbatches, chunks):
    dag = PipelineDag.build(pipeline_orders(stages, microbatches, chunks))
    durations = dag.fixed_durations_s()
    compute = dag.compute_indices()
    durations[compute] = np.random.default_rng(0).uniform(0.01, 0.05, compute.size)
    preds: list[list[int]] = [[] for _ in dag.nodes]
    succs: list[list[int]] = [[] for _ in dag.nodes]
    for u, v in dag.edges_array().tolist():
        preds[v].append(u)
        succs[u].append(v)
    assert any(len(near) > 2 for near in preds)  # the general path is exercised too
    start = earliest_starts(preds, neighbour_pairs(preds), durations.tolist())
    schedule = dag.schedule_array(durations)
    assert start == schedule.start_s.tolist()
    deadline_s = schedule.makespan_s * 1.1
    latest = latest_starts(succs, neighbour_pairs(succs), durations.tolist(), deadline_s)
    assert latest == dag.latest_start_s(durations, deadline_s).tolist()
