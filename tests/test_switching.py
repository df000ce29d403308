import random

import pytest

from megatron_energy.dvfs.simulated import SimulatedGPUs
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.perseus.switch_latency import count_switches, make_switch_aware
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import CommSpec, IterationTail
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import ClockOption, Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import instruction_work
from megatron_energy.sim import Simulator
from megatron_energy.sim.simulator import StagePowers
from megatron_energy.target import EnergyTarget

ONE_STAGE = PipelineOrders(
    (
        tuple(
            Instruction(0, 0, microbatch, kind) for microbatch in (0, 1) for kind in ("forward", "backward")
        ),
    ),
    num_microbatches=2,
)


def _two_clock_profile(with_1200=()):
    """Forward 1 s / backward 2 s at 1500 MHz (100 W); 1.5x the time at 1000 MHz (60 W); 1.25x at 1200 MHz
    (76 W) for the kinds in ``with_1200``."""
    options = {}
    for kind, t in (("forward", 1.0), ("backward", 2.0)):
        clocks = [ClockOption(1500, t, 100 * t), ClockOption(1000, 1.5 * t, 90 * t)]
        if kind in with_1200:
            clocks.append(ClockOption(1200, 1.25 * t, 95 * t))
        options[Work(0, 0, kind)] = clocks
    return Profile(options, "test-gpu", "modelled", 50.0, 30.0)


def _compute(result):
    return [piece for piece in result.timeline if piece.kind in ("forward", "backward")]


def _plan(dag, clocks):
    return dict(zip(dag.stage_order(0), clocks, strict=True))


def test_one_switch_splits_the_instruction_by_hand():
    dag = PipelineDag.build(ONE_STAGE)
    clocks = _plan(dag, [1000, 1000, 1000, 1500])
    result = Simulator(dag, _two_clock_profile(), switch_latency_s=0.5).run(clocks)
    f0, b0, f1, b1 = _compute(result)
    # Steady state: the iteration starts at B1's 1500 MHz. F0 asks for 1000 at 0, in effect at 0.5: half of
    # F0 (1 s at 1500) is done by then, the other half takes 0.5 * 1.5 s at 1000.
    assert (f0.clock_mhz, f0.stale_clock_mhz, f0.stale_s) == (1000, 1500, 0.5)
    assert f0.end_s == pytest.approx(1.25)
    assert f0.energy_j == pytest.approx(0.5 * 100 + 0.5 * 90)
    assert b0.stale_clock_mhz is None
    assert (b0.end_s - b0.start_s, b0.energy_j) == (pytest.approx(3.0), pytest.approx(180.0))
    assert f1.end_s == pytest.approx(5.75)
    # B1 asks for 1500 at 5.75, in effect at 6.25: 0.5 s of its 3 s at 1000 is 1/6 of it, 5/6 * 2 s at 1500.
    assert (b1.stale_clock_mhz, b1.stale_s) == (1000, pytest.approx(0.5))
    assert b1.end_s - b1.start_s == pytest.approx(0.5 + 5 / 6 * 2.0)
    assert b1.energy_j == pytest.approx(180 / 6 + 5 / 6 * 200)
    assert result.iteration_time_s == pytest.approx(5.75 + 0.5 + 5 / 3)
    assert result.total_energy_j == pytest.approx(95 + 180 + 90 + 30 + 500 / 3)
    assert result.switch_latency_s == 0.5
    instant = Simulator(dag, _two_clock_profile()).run(clocks)
    assert instant.iteration_time_s == 8.0 and instant.switch_latency_s == 0.0


def test_a_newer_request_replaces_a_pending_one():
    dag = PipelineDag.build(ONE_STAGE)
    simulator = Simulator(dag, _two_clock_profile(with_1200=("forward", "backward")), switch_latency_s=2.5)
    # F asks for 1000 and B for 1500 before the 2.5 s latency is over: 1000 MHz never takes effect.
    result = simulator.run(_plan(dag, [1000, 1500, 1000, 1500]))
    assert [piece.end_s for piece in _compute(result)] == [1.0, 3.0, 4.0, 6.0]
    assert result.total_energy_j == pytest.approx(600.0)
    assert [piece.stale_clock_mhz for piece in _compute(result)] == [1500, None, 1500, None]
    # F0 asks for 1000 at 0 (due 2.5); B0 replaces it with 1200 at 1 (due 3.5), so B0 runs at 1500 throughout
    # and F1 (no request: same clock) half at 1500, half at 1200. B1 starts at 1200 and asks for 1500.
    result = simulator.run(_plan(dag, [1000, 1200, 1200, 1500]))
    f0, b0, f1, b1 = _compute(result)
    assert [(p.stale_clock_mhz, p.stale_s) for p in (f0, b0)] == [(1500, 1.0), (1500, 2.0)]
    assert (f1.stale_clock_mhz, f1.stale_s) == (1500, pytest.approx(0.5))
    assert f1.end_s - f1.start_s == pytest.approx(0.5 + 0.5 * 1.25)
    assert f1.energy_j == pytest.approx(0.5 * 100 + 0.5 * 95)
    assert (b1.stale_clock_mhz, b1.end_s - b1.start_s, b1.energy_j) == (1200, 2.5, pytest.approx(190.0))
    assert result.iteration_time_s == pytest.approx(6.625)


def test_a_stale_clock_without_a_profile_option_is_interpolated():
    dag = PipelineDag.build(ONE_STAGE)
    simulator = Simulator(dag, _two_clock_profile(with_1200=("backward",)), switch_latency_s=10.0)
    # B1 at 1200 is the steady-state clock; forward has no 1200 MHz option: 2/5 of the way from 1000 to 1500.
    result = simulator.run(_plan(dag, [1000, 1200, 1000, 1200]))
    f0 = _compute(result)[0]
    assert f0.stale_clock_mhz == 1200
    assert f0.end_s == pytest.approx(1.5 + 0.4 * (1.0 - 1.5))
    assert f0.energy_j == pytest.approx(90 + 0.4 * (100 - 90))
    with pytest.raises(ValueError, match="switch_latency_s"):
        Simulator(dag, _two_clock_profile(), switch_latency_s=-1e-3)


def _job_case():
    spec = load_gpu_spec("h100-sxm")
    shape = TransformerShape.from_name("gpt3-1.3b")
    profile = Profile.synthetic(shape, spec, num_stages=4)
    comm = CommSpec(spec.p2p_latency_s, spec.p2p_bandwidth_gbps, shape.activation_bytes())
    dag = PipelineDag.build(pipeline_orders(4, 8), comm=comm, tail=IterationTail(2e-3, 3e-3))
    rng = random.Random(7)
    clocks = {node: rng.choice(spec.sm_clocks_mhz[::9]) for node in dag.compute_nodes()}
    return spec, shape, profile, dag, clocks


def test_latency_zero_and_plans_without_switches_reproduce_the_instant_simulation():
    _, _, profile, dag, clocks = _job_case()
    instant = Simulator(dag, profile).run(clocks)
    assert Simulator(dag, profile, switch_latency_s=0.0).run(clocks) == instant
    assert Simulator(dag, profile, switch_latency_s=0.01).run(clocks, switch_latency_s=0.0) == instant
    durations = {piece.node: piece.end_s - piece.start_s for piece in instant.timeline}
    durations.update({node: profile.option_at(node.work, clocks[node]).time_s for node in clocks})
    assert instant.iteration_time_s == dag.schedule(durations).makespan_s
    assert Simulator(dag, profile).evaluate(clocks) == (instant.iteration_time_s, instant.total_energy_j)
    # One clock per stage: nothing is ever requested, so any latency gives the same floats.
    steady = {node: 1200 + 15 * node.stage for node in dag.compute_nodes()}
    assert (
        Simulator(dag, profile, switch_latency_s=0.02).run(steady).stages
        == Simulator(dag, profile).run(steady).stages
    )


def test_switching_simulation_matches_the_simulated_gpus(tmp_path):
    spec, shape, profile, dag, clocks = _job_case()
    latency_s = spec.switch_latency_s
    result = Simulator(dag, profile, switch_latency_s=latency_s).run(clocks)
    assert any(piece.stale_clock_mhz is not None for piece in result.timeline)
    work = instruction_work(shape, spec, 4, 1)
    gpus = SimulatedGPUs(spec, num_gpus=4, state_path=tmp_path / "gpus.json")
    pieces = {piece.node: piece for piece in result.timeline}
    for stage in range(4):
        order = dag.stage_order(stage)
        requested = clocks[order[-1]]  # steady state: the previous iteration's last clock, settled
        gpus.lock_clocks(stage, requested, requested)
        gpus.wait(stage, 2 * latency_s, blocked=False)
        origin_s = gpus.virtual_time_s(stage)
        for node in order:
            piece = pieces[node]
            gpus.wait(stage, max(0.0, piece.start_s - (gpus.virtual_time_s(stage) - origin_s)), blocked=True)
            if clocks[node] != requested:
                requested = clocks[node]
                gpus.lock_clocks(stage, requested, requested)
            time_s, energy_j = gpus.execute(stage, work[node.work])
            assert time_s == pytest.approx(piece.end_s - piece.start_s, rel=1e-9)
            assert energy_j == pytest.approx(piece.energy_j, rel=1e-9)


@pytest.fixture(scope="module")
def iso_time_case():
    spec = load_gpu_spec("h100-sxm")
    profile = Profile.synthetic(TransformerShape.from_name("gpt3-1.3b"), spec, num_stages=4)
    dag = PipelineDag.build(pipeline_orders(4, 8))
    point = Planner(dag, profile).point(EnergyTarget("iso-time"))
    return spec, profile, dag, point


def test_post_pass_meets_the_deadline_and_keeps_a_saving(iso_time_case):
    spec, profile, dag, point = iso_time_case
    deadline_s = point.time_s
    fastest = Simulator(dag, profile).run()
    plan = make_switch_aware(dag, profile, point.clocks, spec.switch_latency_s, deadline_s)
    # The instant-switch plan is too slow once clock changes take 10 ms.
    assert plan.unadjusted.iteration_time_s > deadline_s * 1.05
    check = Simulator(dag, profile, switch_latency_s=spec.switch_latency_s).run(plan.clocks)
    assert check == plan.result
    assert plan.meets_deadline and check.iteration_time_s <= deadline_s * (1 + 1e-9)
    saving_j = fastest.total_energy_j - check.total_energy_j
    assert saving_j > 0.5 * (fastest.total_energy_j - point.energy_j)
    assert plan.switches_per_iteration == count_switches(dag, plan.clocks) < count_switches(dag, point.clocks)
    assert set(plan.clocks) == set(dag.compute_nodes())


@pytest.mark.parametrize("latency_s", [1e-4, 0.02, 0.05])
def test_post_pass_never_exceeds_the_deadline(iso_time_case, latency_s):
    _, profile, dag, point = iso_time_case
    plan = make_switch_aware(dag, profile, point.clocks, latency_s, point.time_s)
    result = Simulator(dag, profile, switch_latency_s=latency_s).run(plan.clocks)
    assert result.iteration_time_s <= point.time_s * (1 + 1e-9)
    assert result.total_energy_j <= Simulator(dag, profile).run().total_energy_j


def test_zero_latency_returns_the_clocks_unchanged(iso_time_case):
    _, profile, dag, point = iso_time_case
    plan = make_switch_aware(dag, profile, point.clocks, 0.0, point.time_s)
    assert plan.clocks == dict(point.clocks)
    assert plan.result == Simulator(dag, profile).run(point.clocks)
    assert plan.result.total_energy_j == pytest.approx(point.energy_j)


def test_an_unreachable_deadline_falls_back_to_all_fastest(iso_time_case):
    spec, profile, dag, point = iso_time_case
    plan = make_switch_aware(dag, profile, point.clocks, spec.switch_latency_s, 0.5 * point.time_s)
    assert not plan.meets_deadline
    assert plan.switches_per_iteration == 0
    assert plan.result.iteration_time_s == Simulator(dag, profile).run().iteration_time_s


def test_count_switches_is_cyclic():
    dag = PipelineDag.build(ONE_STAGE)
    assert count_switches(dag, _plan(dag, [1000, 1000, 1000, 1000])) == 0
    assert count_switches(dag, _plan(dag, [1000, 1000, 1500, 1500])) == 2
    assert count_switches(dag, _plan(dag, [1500, 1000, 1000, 1500])) == 2


def _trace_compute(result):
    from megatron_energy.sim.trace import trace_events

    events = trace_events(result, StagePowers(50.0, 30.0))
    return [event for event in events if event["ph"] == "X" and event["cat"] in ("forward", "backward")]


def test_trace_slices_show_the_clock_in_effect_and_the_clock_requested():
    dag = PipelineDag.build(ONE_STAGE)
    result = Simulator(dag, _two_clock_profile(), switch_latency_s=0.5).run(
        _plan(dag, [1000, 1000, 1000, 1500])
    )
    events = _trace_compute(result)
    f0 = dag.stage_order(0)[0].label
    first, second = (event for event in events if event["args"]["instruction"] == f0)
    # F0 asked for 1000 MHz; 1500 stayed in effect for 0.5 s (half of F0's work), then 1000 for 0.75 s.
    assert (first["name"], first["args"]["clock_in_effect_mhz"], first["args"]["clock_requested_mhz"]) == (
        f"{f0} @1500 MHz",
        1500,
        1000,
    )
    assert "not yet in effect" in first["args"]["switch"]
    assert (first["ts"], first["dur"]) == (0.0, pytest.approx(0.5e6))
    assert first["args"]["energy_j"] == pytest.approx(50.0)  # 0.5 s of the 1500 MHz option's 100 W
    assert (second["name"], second["args"]["clock_in_effect_mhz"]) == (f"{f0} @1000 MHz", 1000)
    assert "switch" not in second["args"]
    assert (second["ts"], second["dur"]) == (pytest.approx(0.5e6), pytest.approx(0.75e6))
    assert second["args"]["energy_j"] == pytest.approx(45.0)
    # Every instruction's parts add up to its simulated time and energy.
    for piece in _compute(result):
        parts = [event for event in events if event["args"]["instruction"] == piece.node.label]
        assert sum(event["dur"] for event in parts) == pytest.approx((piece.end_s - piece.start_s) * 1e6)
        assert sum(event["args"]["energy_j"] for event in parts) == pytest.approx(piece.energy_j)


def test_a_switch_that_never_came_during_an_instruction_leaves_one_slice_at_the_old_clock():
    dag = PipelineDag.build(ONE_STAGE)
    simulator = Simulator(dag, _two_clock_profile(with_1200=("forward", "backward")), switch_latency_s=2.5)
    result = simulator.run(_plan(dag, [1000, 1200, 1200, 1500]))
    b0 = dag.stage_order(0)[1].label
    (only,) = (event for event in _trace_compute(result) if event["args"]["instruction"] == b0)
    assert (only["name"], only["args"]["clock_requested_mhz"]) == (f"{b0} @1500 MHz", 1200)
    assert only["dur"] == pytest.approx(2.0e6)  # B0's 2 s at 1500 MHz, not its 2.5 s at 1200
