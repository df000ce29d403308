import itertools
import math
from itertools import pairwise

import numpy as np
import pytest

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.perseus import relaxation
from megatron_energy.optimisers.perseus.frontier import FrontierSolver
from megatron_energy.optimisers.perseus.relaxation import lower_convex_hull
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import CommSpec, IterationTail
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.profile import ClockOption, Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.sim import Simulator

TOY_TIMES = {(0, "forward"): 1.0, (0, "backward"): 2.0, (1, "forward"): 2.0, (1, "backward"): 3.0}


def toy_profile() -> Profile:
    """Two clocks per instruction: fast (t s at 100 W) and slow (1.5 t s at 60 W); blocked 50 W, idle 30 W."""
    options = {
        Work(stage, 0, kind): [ClockOption(1500, t, 100 * t), ClockOption(1000, 1.5 * t, 90 * t)]
        for (stage, kind), t in TOY_TIMES.items()
    }
    return Profile(options, "toy-gpu", "modelled", blocked_power_w=50.0, idle_power_w=30.0)


@pytest.fixture(scope="module")
def toy():
    dag = PipelineDag.build(pipeline_orders(2, 2))
    return dag, toy_profile()


def brute_force(dag, profile, deadline_s):
    """Least simulated energy over every clock assignment that meets the deadline."""
    simulator = Simulator(dag, profile)
    nodes = dag.compute_nodes()
    best = math.inf
    for clocks in itertools.product((1500, 1000), repeat=len(nodes)):
        result = simulator.run(dict(zip(nodes, clocks, strict=True)))
        if result.iteration_time_s <= deadline_s + 1e-12:
            best = min(best, result.total_energy_j)
    return best


@pytest.fixture(scope="module")
def gpt_case():
    """GPT-3 1.3B (mbs 4) on A100, 4 stages x 8 microbatches, 1410-900 MHz every 30 MHz, with transfers."""
    spec = load_gpu_spec("a100-sxm-80gb")
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    clocks = [clock for clock in spec.sm_clocks_mhz if clock >= 900][::2]
    profile = Profile.synthetic(shape, spec, 4, clocks_mhz=clocks)
    comm = CommSpec(spec.p2p_latency_s, spec.p2p_bandwidth_gbps, shape.activation_bytes())
    dag = PipelineDag.build(pipeline_orders(4, 8), comm=comm, tail=IterationTail(0.002, 0.004))
    solver = FrontierSolver(dag, profile)
    return dag, profile, solver, solver.sweep(40)


def test_lower_convex_hull_drops_points_above_it_and_duplicates():
    options = [
        ClockOption(1000, 3.0, 5.0),
        ClockOption(1100, 2.0, 6.0),
        ClockOption(1200, 1.5, 9.0),  # above the chord from (1, 10) to (2, 6)
        ClockOption(1300, 1.0, 10.0),
        ClockOption(1400, 1.0, 11.0),  # same time, more energy
        ClockOption(900, 4.0, 5.5),  # energy rises again, still on the hull
    ]
    times, energies = lower_convex_hull(options)
    assert times.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert energies.tolist() == [10.0, 6.0, 5.0, 5.5]
    assert np.all(np.diff(np.diff(energies) / np.diff(times)) > 0)


def test_toy_iso_time_optimum_known_by_hand(toy):
    dag, profile = toy
    solver = FrontierSolver(dag, profile)
    # All fast: 13 s, 2060 J. Off the critical path, F(stage 0, mb 1) has 4 s of slack and B(stage 0, mb 0)
    # 3 s; slowing them saves 10 J + 0.5 s x 50 W and 20 J + 1 s x 50 W of blocked power: 1955 J at 13 s.
    assert solver.min_time_s == 13.0
    point = solver.solve(13.0)
    assert point.time_s == 13.0
    assert point.energy_j == pytest.approx(1955.0)
    slowed = {node for node, clock in point.clocks.items() if clock == 1000}
    assert slowed == {Instruction(0, 0, 1, "forward"), Instruction(0, 0, 0, "backward")}
    assert point.lower_bound_j == pytest.approx(1955.0)


def test_toy_matches_brute_force_and_the_bound_holds(toy):
    dag, profile = toy
    solver = FrontierSolver(dag, profile)
    for deadline_s in (13.0, 13.4, 14.0, 15.5, 17.0, 19.5):
        point = solver.solve(deadline_s)
        optimum = brute_force(dag, profile, deadline_s)
        assert point.time_s <= deadline_s
        assert point.lower_bound_j <= optimum + 1e-9
        assert point.energy_j == pytest.approx(optimum)


def test_a_plan_past_its_deadline_is_repaired_at_the_fastest_clocks(toy):
    # The rounding meets the deadline by construction; this guard covers relaxed solutions that miss it by the
    # solver's tolerance. All-slow clocks take 19.5 s; the repair must reach 13 s, the all-fast time.
    solver = FrontierSolver(*toy)
    all_slow = [-1 if table is None else 1 for table in solver._tables]
    repaired = solver._tighten(all_slow, 13.0)
    assert solver.dag.schedule_array(np.asarray(solver._durations(repaired))).makespan_s <= 13.0
    with pytest.raises(ValueError, match="cannot be met even at the fastest clocks"):
        solver._tighten(all_slow, 12.0)


def test_deadline_below_the_fastest_time_is_refused(toy):
    solver = FrontierSolver(*toy)
    with pytest.raises(ValueError, match="below the fastest possible iteration time"):
        solver.solve(12.0)


def test_no_plan_exceeds_its_deadline_in_the_simulator(gpt_case):
    dag, profile, _, frontier = gpt_case
    simulator = Simulator(dag, profile)
    for point in frontier.points:
        result = simulator.run(point.clocks)
        assert result.iteration_time_s <= point.deadline_s * (1 + 1e-12)
        assert result.iteration_time_s == pytest.approx(point.time_s)
        assert result.total_energy_j == pytest.approx(point.energy_j)


def test_frontier_is_monotone_and_above_its_lower_bound(gpt_case):
    _, _, solver, frontier = gpt_case
    points = frontier.points
    assert points[0].deadline_s == solver.min_time_s
    assert len(points) == 40
    for before, after in pairwise(points):
        assert after.deadline_s > before.deadline_s
        assert after.energy_j <= before.energy_j
        assert after.lower_bound_j <= before.lower_bound_j + 1e-9
    by_time = sorted(points, key=lambda point: point.time_s)
    assert all(b.energy_j <= a.energy_j for a, b in pairwise(by_time))
    for point in points:
        assert point.lower_bound_j <= point.energy_j + 1e-9
        assert point.gap < 2e-3
    assert frontier.min_energy_point().energy_j < frontier.baseline.total_energy_j


def test_iso_time_point_saves_energy_without_slowing(gpt_case):
    frontier = gpt_case[3]
    iso = frontier.points[0]
    assert iso.time_s <= frontier.baseline.iteration_time_s
    assert iso.energy_j < 0.95 * frontier.baseline.total_energy_j


def test_cold_solver_path_gives_the_same_bound(gpt_case, monkeypatch):
    dag, profile, solver, frontier = gpt_case
    deadline_s = frontier.points[5].deadline_s
    warm = solver.relaxed(deadline_s)
    monkeypatch.setattr(relaxation, "_highs", None)
    cold = FrontierSolver(dag, profile).relaxed(deadline_s)
    assert cold.lower_bound_j == pytest.approx(warm.lower_bound_j)
    assert cold.time_s == pytest.approx(warm.time_s)


@pytest.mark.parametrize("cold", [False, True])
def test_any_non_negative_multipliers_bound_the_relaxed_optimum(gpt_case, monkeypatch, cold):
    dag, profile, solver, frontier = gpt_case
    if cold:
        monkeypatch.setattr(relaxation, "_highs", None)
        solver = FrontierSolver(dag, profile)
    here, there = frontier.points[5].deadline_s, frontier.points[15].deadline_s
    other = solver.relaxed(there)
    solution = solver.relaxed(here)
    assert solution.multipliers is not None and other.multipliers is not None
    assert np.all(solution.multipliers >= 0)
    assert solver.dual_bound_j(solution.multipliers, here) == pytest.approx(solution.lower_bound_j, rel=1e-9)
    # Another deadline's multipliers bound the optimum here too: their bound is that solve's tangent.
    assert solver.dual_bound_j(other.multipliers, here) <= solution.lower_bound_j * (1 + 1e-9)
    assert solver.dual_bound_j(other.multipliers, here) == pytest.approx(other.tangent_j(here), rel=1e-9)
    rng = np.random.default_rng(0)
    for scale in (0.5, 1.0, 2.0):
        noisy = solution.multipliers * rng.uniform(0, 2 * scale, solution.multipliers.size)
        assert solver.dual_bound_j(noisy, here) <= solution.lower_bound_j * (1 + 1e-9)


def test_rounding_hands_the_search_the_earliest_starts_of_its_plan(gpt_case):
    solver, frontier = gpt_case[2], gpt_case[3]
    for point in frontier.points[::7]:
        choice, starts = solver._rounded(solver.relaxed(point.deadline_s))
        search = solver._search
        loaded_j = search.load(choice)
        assert search.start == starts  # exactly: the search judges plans by them
        assert search.load(choice, starts) == loaded_j


def test_frontier_csv(gpt_case, tmp_path):
    frontier = gpt_case[3]
    path = tmp_path / "frontier.csv"
    frontier.to_csv(path)
    lines = path.read_text().splitlines()
    assert lines[0] == "deadline_s,time_s,energy_j,lower_bound_j,gap_percent,bound"
    assert len(lines) == 1 + len(frontier.points)
    *figures, bound = lines[1].split(",")
    assert float(figures[2]) == pytest.approx(frontier.points[0].energy_j)
    assert bound == "relaxed"  # a small DAG: the relaxed problem is solved at every deadline
