"""The combined 1F1B schedule's DAG (fused steps as nodes) and a Perseus plan that clocks every fused step."""

from __future__ import annotations

import pytest

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.errors import EnergyValueError
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_graph import receiving_pass
from megatron_energy.pipeline.dag_nodes import Transfer
from megatron_energy.pipeline.fused_profile import fused_works, with_fused_steps
from megatron_energy.pipeline.instruction import FusedInstruction, Instruction, passes
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import ClockAction, fingerprint
from megatron_energy.plan_file import load_plan, save_plan
from megatron_energy.sim import Simulator
from megatron_energy.target import parse_target

SHAPES = [(1, 1, 6), (2, 2, 4), (2, 2, 6), (4, 2, 8)]
"""``(stages, chunks, microbatches)`` megatron-core runs combined."""


def _profile(num_stages: int, num_chunks: int) -> Profile:
    spec = load_gpu_spec("a100-sxm-80gb")
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    clocks = [clock for clock in spec.sm_clocks_mhz if clock >= 900][::4]
    return Profile.synthetic(shape, spec, num_stages, num_chunks, clocks_mhz=clocks)


@pytest.mark.parametrize(("stages", "chunks", "microbatches"), SHAPES)
def test_a_fused_step_waits_for_what_both_its_passes_receive(stages, chunks, microbatches) -> None:
    orders = pipeline_orders(stages, microbatches, chunks, combined=True)
    dag = PipelineDag.build(orders)
    steps = orders.all_steps()
    assert dag.compute_steps() == sorted(steps, key=dag.index.__getitem__)
    assert len(dag.compute_steps()) == len(steps) < len(orders.instructions())
    step_of = {p: step for step in steps for p in passes(step)}
    # unit durations: every pass's consumer starts no earlier than the step producing its input ends
    schedule = dag.schedule(dict.fromkeys(steps, 1.0))
    for step in steps:
        for sent in passes(step):
            receiver = receiving_pass(sent, stages, chunks)
            if receiver is not None:
                assert schedule.end(step) <= schedule.start(step_of[receiver])
                if receiver.stage != sent.stage:
                    assert dag.graph.has_edge(step, Transfer(sent))
                    assert dag.graph.has_edge(Transfer(sent), step_of[receiver])


def test_fusing_a_pass_with_the_one_it_waits_for_is_refused() -> None:
    forward, backward = Instruction(0, 0, 0, "forward"), Instruction(0, 0, 0, "backward")
    orders = PipelineOrders.combined(((FusedInstruction(forward, backward),),), num_microbatches=1)
    with pytest.raises(EnergyValueError, match="fuses B0c0 with F0c0, which it waits for"):
        PipelineDag.build(orders)


def test_planners_that_know_no_fused_steps_are_told_so() -> None:
    dag = PipelineDag.build(pipeline_orders(1, 4, combined=True))
    with pytest.raises(EnergyValueError, match=r"fused steps.*--energy-mode perseus"):
        dag.stage_order(0)


def test_modelled_fused_options_add_both_passes_and_a_measured_profile_must_have_its_own() -> None:
    orders = pipeline_orders(2, 4, 2, combined=True)
    profile = _profile(2, 2)
    extended = with_fused_steps(profile, orders)
    assert set(fused_works(orders)) == set(extended) - set(profile) != set()
    for work, step in fused_works(orders).items():
        for option in extended.options(work):
            forward = profile.option_at(step.forward.work, option.clock_mhz)
            backward = profile.option_at(step.backward.work, option.clock_mhz)
            assert option.time_s == forward.time_s + backward.time_s
            assert option.energy_j == forward.energy_j + backward.energy_j
    assert with_fused_steps(extended, orders) is extended
    measured = Profile(
        {work: profile.options(work) for work in profile}, profile.gpu_name, "measured", 60.0, 50.0
    )
    with pytest.raises(EnergyValueError, match="no timing of the combined 1F1B steps"):
        with_fused_steps(measured, orders)


@pytest.mark.parametrize(
    ("stages", "chunks", "microbatches", "slowdown"),
    # without pipelining every step is critical: only a slowdown budget saves energy
    [(1, 1, 6, 0.1), (2, 2, 4, 0.0)],
)
def test_perseus_clocks_every_fused_step_and_saves_energy_within_the_time_budget(
    stages, chunks, microbatches, slowdown, tmp_path
) -> None:
    orders = pipeline_orders(stages, microbatches, chunks, combined=True)
    target = parse_target(f"slowdown:{slowdown}" if slowdown else "iso-time")
    job = PlanningJob(orders, fingerprint(job="combined"), target, frontier_points=12)
    plan = PerseusOptimiser().plan(_profile(stages, chunks), job)
    dag = job.dag()
    for stage in range(stages):
        actions = [a for a in plan.target_point.ranks[stage].actions if isinstance(a, ClockAction)]
        assert [action.at.step for action in actions] == dag.stage_steps(stage)
    fused_clocks = [
        clock
        for point in plan.points
        for stage in range(stages)
        for step, clock in point.step_clocks(stage).items()
        if isinstance(step, FusedInstruction)
    ]
    assert fused_clocks and len(set(fused_clocks)) > 1  # fused steps are planned, not left at one clock
    # the plan file keeps fused steps: it reads back to the same clocks, and the simulator runs them
    loaded = load_plan(save_plan(plan, tmp_path / "plan.json"))
    clocks = {s: c for stage in range(stages) for s, c in loaded.target_point.step_clocks(stage).items()}
    assert clocks == {
        s: c for stage in range(stages) for s, c in plan.target_point.step_clocks(stage).items()
    }
    result = Simulator(dag, with_fused_steps(_profile(stages, chunks), orders)).run(clocks)
    assert result.iteration_time_s <= plan.baseline.iteration_time_s * (1 + slowdown) * (1 + 1e-9)
    assert result.total_energy_j == pytest.approx(plan.target_point.energy_j)
    assert result.total_energy_j < plan.baseline.energy_j
    fused = next(s for s in dag.stage_steps(stages - 1) if isinstance(s, FusedInstruction))
    assert loaded.clock_for(stages - 1, fused.forward) == clocks[fused]


def test_a_profile_with_fused_steps_survives_its_csv(tmp_path) -> None:
    orders = pipeline_orders(2, 4, 2, combined=True)
    profile = with_fused_steps(_profile(2, 2), orders)
    path = tmp_path / "profile.csv"
    path.write_text(profile.to_csv_text())
    loaded = Profile.from_csv(path, gpu_name=profile.gpu_name)
    assert set(loaded) == set(profile) and set(fused_works(orders)) <= set(loaded)
    for work in fused_works(orders):
        assert loaded.options(work) == profile.options(work)
