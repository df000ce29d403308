"""The memory clock as a lever: a plan lowers a rank's memory clock where it pays, never where it slows."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.memory_clock import (
    MemoryClockLever,
    candidate_memory_clocks,
    choose_memory_clocks,
)
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.pipeline.instruction import KINDS, Work
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import Plan, fingerprint
from megatron_energy.sim.memory_clocks import MemoryClockPricing
from megatron_energy.sim.simulator import Simulator
from megatron_energy.target import parse_target

SPEC = load_gpu_spec("h100-sxm")
CLOCKS = [clock for clock in SPEC.sm_clocks_mhz if clock >= 900][::6]
TOP, LOW = SPEC.memory_clocks_mhz


def _profile(works: dict[int, WorkProfile]) -> Profile:
    """A modelled profile: every pass of stage ``s`` does ``works[s]`` (backward twice the forward)."""
    model = GpuPowerModel(SPEC)
    options = {}
    for stage, work in works.items():
        for kind in KINDS:
            scaled = work.scaled(2.0 if kind == "backward" else 1.0)
            options[Work(stage, 0, kind)] = [
                ClockOption(clock, model.time_s(scaled, clock), model.energy_j(scaled, clock))
                for clock in CLOCKS
            ]
    return Profile(options, SPEC.name, "modelled", SPEC.blocked_power_w, SPEC.idle_power_w)


def _job(stages: int, memory_clock: bool = True) -> PlanningJob:
    return PlanningJob(
        pipeline_orders(stages, 4),
        fingerprint(job="memory-lever"),
        parse_target("iso-time"),
        frontier_points=8,
        kept_points=2,
        gpu=SPEC,
        memory_clock=memory_clock,
    )


HEAVY_MEMORY = WorkProfile(compute_s=0.004, memory_s=0.012)
"""Memory-bound work: a lower memory clock stretches it."""
LIGHT_COMPUTE = WorkProfile(compute_s=0.003, memory_s=0.0)
"""Compute-bound work of a third of the time: its stage waits for the other."""


@pytest.fixture(scope="module")
def slack_plans() -> tuple[Plan, Plan]:
    """Perseus's plan of a job whose stage 1 is light compute off the critical path, and the lever's."""
    profile, job = _profile({0: HEAVY_MEMORY, 1: LIGHT_COMPUTE}), _job(2)
    plan = PerseusOptimiser().plan(profile, job)
    return plan, choose_memory_clocks(plan, profile, job)


def test_h100_offers_its_lower_memory_clock_and_one_clock_gpus_none() -> None:
    assert candidate_memory_clocks(SPEC) == (LOW,)
    assert candidate_memory_clocks(load_gpu_spec("a100-sxm-80gb")) == ()
    # the RTX 3080 Ti's 810 and 405 MHz pair with SM clocks <= 420 MHz only: never tried
    assert candidate_memory_clocks(load_gpu_spec("rtx-3080-ti")) == (9251, 5001)


@pytest.mark.slow
def test_stage_off_the_critical_path_gets_the_lower_memory_clock_and_energy_falls_at_the_same_time(
    slack_plans: tuple[Plan, Plan],
) -> None:
    plan, lever = slack_plans
    assert plan.memory_clocks_mhz == ()
    assert lever.memory_clocks_mhz == (TOP, LOW)
    before, after = plan.target_point, lever.target_point
    assert after.iteration_time_s <= before.iteration_time_s * (1 + 1e-9)
    assert after.energy_j < before.energy_j * (1 - 1e-3)  # at least 0.1 % (0.35 % on the calibrated H100)
    assert after.ranks[0].energy_j == pytest.approx(before.ranks[0].energy_j, rel=1e-9)
    assert after.ranks[1].energy_j < before.ranks[1].energy_j
    for old, new in zip(plan.points, lever.points, strict=True):
        assert new.iteration_time_s <= old.iteration_time_s * (1 + 1e-9)
    assert any(note.startswith(f"memory clocks: rank 1 {LOW} MHz") for note in lever.notes)


def test_lever_figures_are_the_memory_pricing_of_its_clocks(slack_plans: tuple[Plan, Plan]) -> None:
    """The plan's prediction is what the pricing gives its clocks at its memory clocks (no free saving)."""
    _, lever = slack_plans
    profile, job = _profile({0: HEAVY_MEMORY, 1: LIGHT_COMPUTE}), _job(2)
    pricing = MemoryClockPricing(job.dag(), profile, SPEC, lever.switch_latency_s)
    point = lever.target_point
    clocks = {step: clock for stage in range(2) for step, clock in point.step_clocks(stage).items()}
    priced = pricing.price(clocks, (None, LOW))
    assert priced.total_energy_j == pytest.approx(point.energy_j, rel=1e-9)
    assert priced.iteration_time_s == pytest.approx(point.iteration_time_s, rel=1e-9)


def test_memory_pricing_at_the_top_clock_is_the_simulator() -> None:
    profile, job = _profile({0: HEAVY_MEMORY, 1: LIGHT_COMPUTE}), _job(2)
    dag = job.dag()
    result = Simulator(dag, profile, switch_latency_s=SPEC.switch_latency_s).run()
    priced = MemoryClockPricing(dag, profile, SPEC, SPEC.switch_latency_s).price({}, (None, None))
    assert priced.iteration_time_s == result.iteration_time_s
    assert [stage.total_energy_j for stage in priced.stages] == [s.total_energy_j for s in result.stages]


def test_memory_bound_critical_stages_never_get_the_lower_memory_clock() -> None:
    profile, job = _profile({0: HEAVY_MEMORY, 1: HEAVY_MEMORY}), _job(2)
    plan = PerseusOptimiser().plan(profile, job)
    assert choose_memory_clocks(plan, profile, job) is plan


def test_the_lever_off_or_a_one_clock_gpu_keeps_the_plan() -> None:
    profile = _profile({0: HEAVY_MEMORY, 1: LIGHT_COMPUTE})
    plan = PerseusOptimiser().plan(profile, _job(2))
    assert choose_memory_clocks(plan, profile, _job(2, memory_clock=False)) is plan
    one_clock = dataclasses.replace(_job(2), gpu=dataclasses.replace(SPEC, memory_clocks_mhz=(TOP,)))
    assert choose_memory_clocks(plan, profile, one_clock) is plan


@pytest.mark.slow
def test_the_lever_wraps_any_optimiser_by_name_and_request() -> None:
    lever = MemoryClockLever(PerseusOptimiser())
    assert lever.name == "perseus"
    assert lever.request == PerseusOptimiser().request
    profile, job = _profile({0: HEAVY_MEMORY, 1: LIGHT_COMPUTE}), _job(2)
    assert lever.plan(profile, job).memory_clocks_mhz == (TOP, LOW)
