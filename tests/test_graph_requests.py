"""The clocks of a replayed full-iteration graph step, as offsets from its start (``graph_requests``)."""

from __future__ import annotations

import pytest

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.registry import resolve
from megatron_energy.pipeline.dag import IterationTail
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.runtime.running.graph_requests import GRAD_SYNC, graph_requests
from megatron_energy.runtime.running.plan_runner import InsideRequest, PlanRunner
from megatron_energy.runtime.timing import InstructionSample
from megatron_energy.target import EnergyTarget

SPEC = load_gpu_spec("h100-sxm")
GRID = [1980, 1530, 1080, 900, 630]


@pytest.fixture(scope="module")
def kernel_plan():
    """A kernel-mode plan of a 2-stage GPT-3 1.3B: instruction clocks, phases inside them, tail clocks."""
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=2)
    profile = Profile.synthetic(shape, SPEC, 2, clocks_mhz=GRID)
    job = PlanningJob(
        pipeline_orders(2, 4),
        "0123456789abcdef",
        EnergyTarget("iso-time"),
        switch_latency_s=1e-3,
        tail=IterationTail.measured(0.1, (20.0, 20.0)),
        layers_per_chunk=12,
        tail_phases=((GRAD_SYNC, 0.030), ("optimizer", 0.040)),
    )
    return resolve("kernel").plan(profile, job), job


def _replay(order, gap_s: float = 0.002, length_s: float = 0.05) -> tuple[InstructionSample, ...]:
    """A measured replay: each instruction ``length_s`` long, ``gap_s`` after the one before."""
    return tuple(
        InstructionSample(step, i * (length_s + gap_s), i * (length_s + gap_s) + length_s)
        for i, step in enumerate(order)
    )


@pytest.mark.parametrize("stage", [0, 1])
def test_every_clock_of_the_step_goes_out_at_its_measured_offset(kernel_plan, stage: int) -> None:
    plan, job = kernel_plan
    order = job.orders.stage(stage)
    runner = PlanRunner(plan, stage, order)
    offsets = _replay(order)
    requests = graph_requests(runner, offsets, inside=True)
    expected: list[InsideRequest] = []
    for sample in offsets:
        clock = runner.clock_at(sample.instruction)
        if clock is not None:
            expected.append(InsideRequest(sample.start_s, clock))
        expected += [
            InsideRequest(sample.start_s + r.offset_s, r.clock_mhz)
            for r in runner.inside_requests(sample.instruction)
        ]
    expected += [InsideRequest(offsets[-1].end_s, clock) for clock in runner.outside_clocks(GRAD_SYNC)]
    assert sorted(requests) == sorted(expected)
    assert [r.offset_s for r in requests] == sorted(r.offset_s for r in requests)
    assert any(r.offset_s == offsets[-1].end_s for r in requests), "the gradient sync's clocks are kept"
    without_inside = graph_requests(runner, offsets, inside=False)
    assert len(without_inside) == len(requests) - sum(len(runner.inside_requests(s)) for s in order)


def test_the_offsets_follow_the_measured_replay(kernel_plan) -> None:
    plan, job = kernel_plan
    order = job.orders.stage(0)
    runner = PlanRunner(plan, 0, order)
    slow = graph_requests(runner, _replay(order, length_s=0.08), inside=False)
    fast = graph_requests(runner, _replay(order, length_s=0.04), inside=False)
    assert [r.clock_mhz for r in slow] == [r.clock_mhz for r in fast]
    assert slow[-1].offset_s > fast[-1].offset_s


def test_no_replay_measured_yet_means_no_request(kernel_plan) -> None:
    plan, job = kernel_plan
    assert graph_requests(PlanRunner(plan, 0, job.orders.stage(0)), (), inside=True) == ()
