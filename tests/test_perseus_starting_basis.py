import math

import numpy as np
import pytest
import scipy.sparse as sp

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.perseus import relaxation
from megatron_energy.optimisers.perseus.frontier import FrontierSolver
from megatron_energy.optimisers.perseus.relaxation import HotStartProgram
from megatron_energy.optimisers.perseus.starting_basis import BASIC, LOWER, UPPER, tree_basis
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import CommSpec, IterationTail
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders


@pytest.fixture(scope="module")
def program():
    """The relaxed program of GPT-3 1.3B (mbs 4) on A100, 4 stages x 8 microbatches, VPP 2; its tree basis."""
    spec = load_gpu_spec("a100-sxm-80gb")
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    clocks = [clock for clock in spec.sm_clocks_mhz if clock >= 900][::2]
    profile = Profile.synthetic(shape, spec, 4, clocks_mhz=clocks, num_chunks=2)
    comm = CommSpec(spec.p2p_latency_s, spec.p2p_bandwidth_gbps, shape.activation_bytes())
    dag = PipelineDag.build(pipeline_orders(4, 8, 2), comm=comm, tail=IterationTail(0.002, 0.004))
    solver = FrontierSolver(dag, profile)
    cost, matrix, rhs = solver._program._problem
    num_nodes = len(dag.nodes)
    edges = solver._bypassed()[0]
    upper = solver._program.upper.copy()
    basis = tree_basis(
        edges, -rhs, cost[:num_nodes], solver._segment_node, cost[num_nodes:], upper[num_nodes:]
    )
    return solver, (cost, matrix, rhs, np.zeros(len(cost)), upper), basis


def test_the_tree_basis_is_a_non_singular_dual_feasible_basis(program):
    _, (cost, matrix, _, lower, upper), (columns, rows) = program
    assert np.count_nonzero(columns == BASIC) + np.count_nonzero(rows == BASIC) == matrix.shape[0]
    # A x + s = b with s >= 0: the basis matrix takes A's basic columns and the identity's basic slacks.
    full = sp.hstack([matrix, sp.identity(matrix.shape[0])]).tocsc()
    status = np.concatenate([columns, np.where(rows == UPPER, LOWER, rows)])  # a tight row: its slack at 0
    basic = np.flatnonzero(status == BASIC)
    duals = sp.linalg.spsolve(full[:, basic].T.tocsc(), np.concatenate([cost, np.zeros(len(rows))])[basic])
    assert np.all(np.isfinite(duals))
    reduced = np.concatenate([cost, np.zeros(len(rows))]) - full.T @ duals
    scale = np.abs(cost).max()
    assert np.abs(reduced[basic]).max() <= 1e-9 * scale
    fixed = np.concatenate([lower == upper, np.zeros(len(rows), dtype=bool)])
    assert np.all(reduced[(status == LOWER) & ~fixed] >= -1e-9 * scale)
    assert np.all(reduced[(status == UPPER) & ~fixed] <= 1e-9 * scale)
    assert np.count_nonzero(columns[len(cost) - len(upper) :] == UPPER) > 0  # segments off the tree are full


def test_starting_from_the_tree_gives_the_slack_basis_optimum(program):
    solver, problem, basis = program
    if relaxation._highs is None:
        pytest.skip("needs HiGHS' restartable solver (SciPy >= 1.15)")
    from_tree, from_slack = HotStartProgram(*problem), HotStartProgram(*problem)
    from_tree.set_basis(*basis)
    sink = solver._sink
    top = solver.relaxed(math.inf).time_s
    for deadline_s in (math.inf, top, 0.5 * (top + solver.min_time_s), solver.min_time_s):
        for program_ in (from_tree, from_slack):
            program_.set_upper(sink, deadline_s)
        tree_j, slack_j = from_tree.solve()[1], from_slack.solve()[1]
        assert tree_j == pytest.approx(slack_j, rel=1e-9)


def test_a_refused_basis_is_an_error(program):
    _, problem, (columns, rows) = program
    if relaxation._highs is None:
        pytest.skip("needs HiGHS' restartable solver (SciPy >= 1.15)")
    with pytest.raises(RuntimeError, match="starting basis"):
        HotStartProgram(*problem).set_basis(columns[:-1], rows)
