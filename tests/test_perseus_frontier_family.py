import itertools
import math
import statistics

import numpy as np
import pytest
from profile_family import (
    A100_CLOCKS_MHZ,
    ProfileFamily,
    balanced_family,
    family_profile,
)

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.perseus.frontier import FrontierSolver, PlanClocks
from megatron_energy.optimisers.perseus.local_search import LocalSearch
from megatron_energy.optimisers.perseus.relaxation import lower_convex_hull
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.pipeline.dag import CommSpec, PipelineDag
from megatron_energy.pipeline.instruction import KINDS, Instruction, Work
from megatron_energy.pipeline.profile import ClockOption, Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.stock_clocks import all_max_clocks
from megatron_energy.sim import Simulator

# ----- the family generator ---------------------------------------------------------------------------------


def test_family_draws_are_reproducible_and_differ_by_seed():
    family = ProfileFamily(4, 2)
    first, again, other = family_profile(family, 7), family_profile(family, 7), family_profile(family, 8)
    assert first.to_csv_text() == again.to_csv_text()
    assert first.to_csv_text() != other.to_csv_text()
    assert (first.num_stages, first.num_chunks, first.source) == (4, 2, "modelled")
    assert first.blocked_power_w == first.idle_power_w == 85.0
    for key in first:
        clocks = sorted((option.clock_mhz for option in first.options(key)), reverse=True)
        assert clocks == list(A100_CLOCKS_MHZ)


def test_family_draw_is_pinned():
    # The benchmark caches lowtime's results per profile: a silent change of the generator must show here.
    option = family_profile(ProfileFamily(2), 0).options(Work(0, 0, "forward"))[0]
    assert (option.clock_mhz, option.time_s, option.energy_j) == pytest.approx(
        (1410, 0.03205442530982181, 7.147334662708293), rel=1e-12
    )


def test_the_a100_grid():
    assert A100_CLOCKS_MHZ[0] == 1410 and A100_CLOCKS_MHZ[-1] == 900 and len(A100_CLOCKS_MHZ) == 18
    assert set(np.diff(A100_CLOCKS_MHZ)) == {-30}


def test_family_varies_stages_sensitivity_and_power_within_its_ranges():
    family = ProfileFamily(8)
    profile = family_profile(family, 3)
    forward_s = [profile.option_at(Work(stage, 0, "forward"), 1410).time_s for stage in range(8)]
    assert max(forward_s) / min(forward_s) > 1.2  # stages are imbalanced
    assert all(0.75 * family.forward_s <= t <= 1.25 * family.forward_s for t in forward_s)
    slowdowns = []
    for key in profile:
        top, bottom = profile.option_at(key, 1410), profile.option_at(key, 900)
        slowdowns.append(bottom.time_s / top.time_s)
        assert 220.0 <= top.energy_j / top.time_s <= 400.0  # power at the maximum clock
        times = [option.time_s for option in sorted(profile.options(key), key=lambda o: -o.clock_mhz)]
        assert all(np.diff(times) > 0)  # noise-free rows: a lower clock is always slower
    assert all(1.0 < ratio <= 1410 / 900 + 1e-12 for ratio in slowdowns)
    assert max(slowdowns) - min(slowdowns) > 0.2  # clock sensitivity varies per instruction
    assert profile.row_warnings() == []


def test_balanced_family_stages_lie_within_5_percent_but_a_heavier_first_and_last():
    family = balanced_family(8)
    first, middle, last = [], [], []
    for seed in range(10):
        profile = family_profile(family, seed)
        forward_s = [
            profile.option_at(Work(stage, 0, "forward"), 1410).time_s / family.forward_s for stage in range(8)
        ]
        assert (max(forward_s[1:-1]) - min(forward_s[1:-1])) / statistics.mean(forward_s[1:-1]) <= 0.05
        assert all(0.975 <= factor <= 1.025 for factor in forward_s[1:-1])
        assert 0.975 * 1.02 <= forward_s[0] <= 1.025 * 1.08  # the embedding
        assert 0.975 * 1.05 <= forward_s[-1] <= 1.025 * 1.15  # the LM head and loss
        first.append(forward_s[0])
        middle.extend(forward_s[1:-1])
        last.append(forward_s[-1])
    assert statistics.mean(middle) < statistics.mean(first) < statistics.mean(last)
    assert family_profile(family, 3).row_warnings() == []


def test_family_rejects_nonsense():
    with pytest.raises(ValueError, match="stage_imbalance"):
        ProfileFamily(2, stage_imbalance=1.5)
    with pytest.raises(ValueError, match="sensitivity"):
        ProfileFamily(2, sensitivity=(0.5, 1.5))
    with pytest.raises(ValueError, match="distinct"):
        ProfileFamily(2, clocks_mhz=(1410, 1410))
    with pytest.raises(ValueError, match="last_stage_extra"):
        ProfileFamily(2, last_stage_extra=(0.2, 0.1))


# ----- row warnings -----------------------------------------------------------------------------------------


def _profile(rows: dict[tuple[int, str], list[tuple[int, float, float]]]) -> Profile:
    options = {Work(s, 0, kind): [ClockOption(*row) for row in opts] for (s, kind), opts in rows.items()}
    return Profile(options, "toy-gpu", "measured", blocked_power_w=50.0, idle_power_w=30.0)


def test_row_warnings_name_rows_faster_at_a_lower_clock():
    profile = _profile(
        {
            (0, "forward"): [(1410, 1.0, 10.0), (1200, 0.9, 9.0), (1000, 1.2, 8.0)],
            (0, "backward"): [(1410, 2.0, 20.0), (1200, 2.2, 21.0), (1000, 1.9, 25.0)],
        }
    )
    warnings = profile.row_warnings()
    found = [(w.work.kind, w.clock_mhz, w.higher_clock_mhz, w.cheaper) for w in warnings]
    assert found == [("backward", 1000, 1410, False), ("forward", 1200, 1410, True)]
    assert "1200 MHz takes 900.000 ms, less than 1000.000 ms at 1410 MHz, and uses less energy" in str(
        warnings[1]
    )
    assert "but uses more energy" in str(warnings[0])


def test_rounding_noise_is_no_row_warning():
    """Times equal but for the 16th digit (a clock-insensitive time after arithmetic) warn of nothing."""
    time_s = 0.1 + 0.2  # 0.30000000000000004
    profile = _profile(
        {(0, "forward"): [(1410, time_s, 10.0), (1200, 0.3, 9.0)], (0, "backward"): [(1410, 2.0, 20.0)]}
    )
    assert profile.row_warnings() == []
    real = _profile(
        {
            (0, "forward"): [(1410, 0.3 * (1 + 1e-6), 10.0), (1200, 0.3, 9.0)],
            (0, "backward"): [(1410, 2.0, 20.0)],
        }
    )
    assert [w.clock_mhz for w in real.row_warnings()] == [1200]


def test_noisy_family_profiles_get_row_warnings():
    noisy = family_profile(ProfileFamily(4, noise=0.01), 1)
    assert len(noisy.row_warnings()) > 0
    assert all(w.time_s < w.higher_time_s and w.clock_mhz < w.higher_clock_mhz for w in noisy.row_warnings())


# ----- the baseline -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def inverted():
    """Two stages whose forward passes are faster (and cheaper) at 1200 MHz than at 1410 MHz."""
    rows = {}
    for stage in range(2):
        rows[stage, "forward"] = [(1410, 1.0, 10.0), (1200, 0.8, 8.0), (1000, 1.3, 7.0)]
        rows[stage, "backward"] = [(1410, 2.0, 20.0), (1200, 2.4, 18.0), (1000, 3.0, 17.0)]
    return PipelineDag.build(pipeline_orders(2, 3)), _profile(rows)


def test_all_max_clocks_is_every_instruction_at_its_highest_clock(inverted):
    dag, profile = inverted
    clocks = all_max_clocks(dag, profile)
    assert set(clocks) == set(dag.compute_nodes())
    assert set(clocks.values()) == {1410}


def test_baseline_is_all_max_even_when_a_lower_clock_is_faster(inverted):
    dag, profile = inverted
    solver = FrontierSolver(dag, profile)
    all_max = Simulator(dag, profile).run(all_max_clocks(dag, profile))
    assert solver.baseline.iteration_time_s == all_max.iteration_time_s
    assert solver.baseline.total_energy_j == all_max.total_energy_j
    assert solver.min_time_s < all_max.iteration_time_s  # the 1200 MHz forwards are quicker
    frontier = solver.sweep(6)
    assert frontier.baseline.total_energy_j == all_max.total_energy_j
    assert frontier.min_time_s == solver.min_time_s == frontier.points[0].deadline_s


def test_iso_time_keeps_the_all_max_time_not_the_fastest_time(inverted):
    dag, profile = inverted
    planner = Planner(dag, profile, num_points=6)
    iso = planner.point("iso-time")
    all_max_s = planner.solver.baseline.iteration_time_s
    assert iso.time_s <= all_max_s
    # Held to the quicker all-fastest time it would have to spend more energy.
    fastest = planner.solver.solve(planner.solver.min_time_s)
    assert iso.energy_j < fastest.energy_j
    assert iso.energy_j < planner.solver.baseline.total_energy_j


# ----- sweep quality ----------------------------------------------------------------------------------------


def test_plan_clocks_is_a_read_only_mapping(inverted):
    dag, profile = inverted
    point = FrontierSolver(dag, profile).solve(math_inf := float("inf"))
    assert point.deadline_s == math_inf
    assert isinstance(point.clocks, PlanClocks)
    as_dict = dict(point.clocks)
    assert set(as_dict) == set(dag.compute_nodes()) and len(point.clocks) == len(as_dict)
    assert point.clocks == as_dict
    assert point.clocks[Instruction(0, 0, 0, "forward")] == as_dict[Instruction(0, 0, 0, "forward")]


BRUTE_FORCE_SEEDS = range(12)


def _brute_force(dag: PipelineDag, profile: Profile, clocks_mhz: tuple[int, ...]) -> np.ndarray:
    """(iteration time, energy) of every clock assignment."""
    simulator = Simulator(dag, profile)
    nodes = dag.compute_nodes()
    return np.array(
        [
            simulator.evaluate(dict(zip(nodes, clocks, strict=True)))
            for clocks in itertools.product(clocks_mhz, repeat=len(nodes))
        ]
    )


@pytest.mark.slow
def test_sweep_against_brute_force_on_small_family_profiles():
    """8 instructions, 3 clocks each: every plan is enumerated (6561 per profile)."""
    clocks = (1410, 1140, 900)
    dag = PipelineDag.build(pipeline_orders(2, 2))
    excesses = []
    for seed in BRUTE_FORCE_SEEDS:
        profile = family_profile(ProfileFamily(2, clocks_mhz=clocks), seed)
        every = _brute_force(dag, profile, clocks)
        frontier = FrontierSolver(dag, profile).sweep(8)
        for point in frontier.points:
            optimum = every[every[:, 0] <= point.deadline_s * (1 + 1e-12), 1].min()
            assert point.lower_bound_j <= optimum + 1e-9  # the bound is a bound
            assert point.energy_j >= optimum - 1e-9 and point.time_s <= point.deadline_s * (1 + 1e-12)
            excesses.append(point.energy_j / optimum - 1)
    # A local search on a coarse grid: most deadlines reach the optimum, none strays far from it.
    exact = sum(excess <= 1e-9 for excess in excesses) / len(excesses)
    assert exact >= 0.85
    assert max(excesses) <= 0.015


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "stages", "microbatches", "chunks"),
    [
        (ProfileFamily, 4, 8, 1),
        (ProfileFamily, 4, 8, 2),
        (ProfileFamily, 2, 6, 1),
        (balanced_family, 4, 8, 1),
    ],
)
def test_sweep_is_close_to_the_lp_bound_on_family_profiles(family, stages, microbatches, chunks):
    dag = PipelineDag.build(pipeline_orders(stages, microbatches, chunks))
    gaps = []
    for seed in range(3):
        profile = family_profile(family(stages, chunks), seed)
        frontier = FrontierSolver(dag, profile).sweep(20)
        simulator = Simulator(dag, profile)
        for point in frontier.points:
            result = simulator.run(point.clocks)
            assert result.iteration_time_s <= point.deadline_s * (1 + 1e-12)
            assert result.iteration_time_s == pytest.approx(point.time_s, rel=1e-12)
            assert result.total_energy_j == pytest.approx(point.energy_j, rel=1e-12)
            assert [stage.total_energy_j for stage in result.stages] == pytest.approx(point.stage_energy_j)
            assert [stage.busy_s for stage in result.stages] == pytest.approx(point.stage_busy_s)
            assert point.gap >= -1e-9  # honest: never below the bound
            gaps.append(point.gap)
        energies = [point.energy_j for point in frontier.points]
        assert all(b <= a for a, b in itertools.pairwise(energies))
    assert max(gaps) <= 0.005
    assert statistics.median(gaps) <= 0.0015


def test_every_kind_and_chunk_of_a_family_profile_is_planned():
    dag = PipelineDag.build(pipeline_orders(2, 4, 2))
    profile = family_profile(ProfileFamily(2, 2), 5)
    point = FrontierSolver(dag, profile).solve(float("inf"))
    planned = {node.work for node in point.clocks}
    assert planned == {Work(s, c, k) for s in range(2) for c in range(2) for k in KINDS}


def test_deadlines_between_lp_solves_keep_a_valid_bound():
    dag = PipelineDag.build(pipeline_orders(4, 8))
    profile = family_profile(ProfileFamily(4), 0)
    solver = FrontierSolver(dag, profile)
    frontier = solver.sweep(20, lp_points=5)
    exact = [k for k, point in enumerate(frontier.points) if point.exact_bound]
    assert exact == [0, 1, 5, 11, 19]  # spaced quadratically from the fastest deadline
    reference = FrontierSolver(dag, profile)
    solved = [reference.relaxed(frontier.points[k].deadline_s) for k in exact]
    simulator = Simulator(dag, profile)
    beats_tangents = 0
    for point in frontier.points:
        optimum_j = reference.relaxed(point.deadline_s).lower_bound_j
        if point.exact_bound:
            assert point.lower_bound_j == pytest.approx(optimum_j, rel=1e-9)
        else:
            tangent_j = max(solution.tangent_j(point.deadline_s) for solution in solved)
            assert point.lower_bound_j <= optimum_j * (1 + 1e-9)  # a dual bound lies below the optimum
            assert point.lower_bound_j >= tangent_j * (1 - 1e-9)  # and never below the tangents
            assert point.lower_bound_j >= optimum_j * (1 - 0.002)  # nor far below the optimum
            beats_tangents += point.lower_bound_j > tangent_j * (1 + 1e-6)
        result = simulator.run(point.clocks)
        assert result.iteration_time_s <= point.deadline_s * (1 + 1e-12)
        assert result.total_energy_j == pytest.approx(point.energy_j, rel=1e-12)
        assert point.gap >= -1e-9
        # No plan of the sweep that meets the deadline uses less than its bound.
        for other in frontier.points:
            if other.time_s <= point.deadline_s:
                assert other.energy_j >= point.lower_bound_j * (1 - 1e-9)
    assert beats_tangents > 0  # the interpolated multipliers tighten the bound somewhere


def test_a_point_handed_out_as_a_plan_carries_the_relaxed_optimum_as_its_bound(tmp_path):
    dag = PipelineDag.build(pipeline_orders(4, 8))
    profile = family_profile(ProfileFamily(4), 1)
    planner = Planner(dag, profile)
    frontier = planner.solver.sweep(20, lp_points=5)
    tangent = [point for point in frontier.points if not point.exact_bound]
    assert tangent
    frontier.to_csv(tmp_path / "frontier.csv")
    rows = (tmp_path / "frontier.csv").read_text().splitlines()[1:]
    assert [row.rsplit(",", 1)[1] for row in rows] == [
        "relaxed" if point.exact_bound else "dual" for point in frontier.points
    ]
    reference = FrontierSolver(dag, profile)
    for point in tangent:
        optimum_j = reference.relaxed(point.deadline_s).lower_bound_j
        handed = planner.executable(point)
        assert handed.exact_bound
        assert handed.lower_bound_j == pytest.approx(optimum_j, rel=1e-9)
        assert handed.lower_bound_j >= point.lower_bound_j * (1 - 1e-9)  # the dual bound was the looser one
        assert handed.gap <= point.gap + 1e-12
        assert handed.energy_j == point.energy_j


@pytest.mark.parametrize("sweeps", [0, 1, 2])
def test_the_search_makes_at_most_its_sweeps_of_trades(sweeps, monkeypatch):
    dag = PipelineDag.build(pipeline_orders(4, 8))
    profile = family_profile(ProfileFamily(4), 2)
    solver = FrontierSolver(dag, profile)
    relaxed = solver.relaxed(solver.min_time_s * 1.05)
    calls: list[bool] = []
    trade = LocalSearch.trade

    def counted(self: LocalSearch, deadline_s: float, compound: bool = False) -> bool:
        calls.append(compound)
        return trade(self, deadline_s, compound)

    monkeypatch.setattr(LocalSearch, "trade", counted)
    search = solver._search
    energy_j = search.load(*solver._rounded(relaxed))
    search.improve(relaxed.deadline_s, 0.0, 0.0, sweeps)
    assert len(calls) == sweeps  # no gain threshold, no target: every allowed sweep runs
    assert search.makespan_s <= relaxed.deadline_s * (1 + 1e-12)
    assert search.energy_j <= energy_j
    assert Simulator(dag, profile).evaluate(
        {dag.nodes[i]: search.tables[i].options[k].clock_mhz for i, k in enumerate(search.choice) if k >= 0}
    )[1] == pytest.approx(search.energy_j + solver.simulator.tail_offset_j, rel=1e-12)


def test_bypassing_transfers_keeps_the_relaxed_optimum():
    spec = load_gpu_spec("a100-sxm-80gb")
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    comm = CommSpec(spec.p2p_latency_s, spec.p2p_bandwidth_gbps, shape.activation_bytes())
    dag = PipelineDag.build(pipeline_orders(4, 8, 2), comm=comm)
    profile = family_profile(ProfileFamily(4, 2), 3)
    bypassed = FrontierSolver(dag, profile)
    full = FrontierSolver(dag, profile)
    edges = dag.edges_array()
    hulls = {i: lower_convex_hull(profile.options(dag.nodes[i].work)) for i in dag.compute_indices().tolist()}
    marginal_w = np.full(len(dag.nodes), profile.blocked_power_w)
    marginal_w[full._last] = profile.idle_power_w
    full._build_program(hulls, marginal_w, (edges, np.zeros(len(edges))), full._last)
    assert len(bypassed._bypassed()[0]) < len(edges)  # transfers were bypassed
    for deadline_s in (math.inf, bypassed.min_time_s * 1.02, bypassed.min_time_s):
        assert bypassed.relaxed(deadline_s).lower_bound_j == pytest.approx(
            full.relaxed(deadline_s).lower_bound_j, rel=1e-9
        )
