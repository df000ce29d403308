"""The clocks of a replayed full-iteration graph step, as offsets from its start (``graph_requests``)."""

from __future__ import annotations

import pytest
from kernel_plans import gpt3_kernel_plan

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.runtime.running.graph_requests import GRAD_SYNC, graph_requests
from megatron_energy.runtime.running.plan_runner import InsideRequest, PlanRunner
from megatron_energy.runtime.timing import InstructionSample

SPEC = load_gpu_spec("h100-sxm")
GRID = [1980, 1530, 1080, 900, 630]


@pytest.fixture(scope="module")
def kernel_plan():
    """Instruction clocks, phases inside them (a 1 ms switch latency), tail clocks."""
    return gpt3_kernel_plan(1e-3)


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
