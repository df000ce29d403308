"""One target -> deadline rule (``EnergyTarget.deadline_s``) for every optimiser; a power budget has none."""

from __future__ import annotations

import math

import pytest

from megatron_energy.errors import EnergyValueError
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.kareus.collective_optimiser import KareusOptimiser
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.target import parse_target
from tests.kareus_jobs import EXAMPLE_7B


def test_each_time_target_maps_to_its_deadline_and_a_power_budget_to_none() -> None:
    assert parse_target("iso-time").deadline_s(2.0) == 2.0
    assert parse_target("slowdown:0.05").deadline_s(2.0) == pytest.approx(2.1)
    assert parse_target("min-energy").deadline_s(2.0) == math.inf
    with pytest.raises(EnergyValueError, match=r"power:400: a power budget .* --energy-mode perseus or all"):
        parse_target("power:400").deadline_s(2.0)


def _kareus_job(target: str) -> tuple[JobConfig, PlanningJob]:
    job = JobConfig.load(EXAMPLE_7B)
    spec = job.spec()
    return job, PlanningJob(
        orders=job.orders(),
        fingerprint=job.fingerprint(),
        target=parse_target(target),
        comm=job.comm_spec(spec),
        tail=job.iteration_tail(spec),
        collectives=job.collective_workload(spec),
        gpu=spec,
    )


def test_kareus_alone_refuses_a_power_budget_rather_than_planning_it_as_iso_time() -> None:
    job, planning = _kareus_job("power:400")
    with pytest.raises(EnergyValueError, match="a power budget picks the fastest frontier point"):
        KareusOptimiser(budget=SearchBudget(trials=2)).plan(job.synthetic_profile(job.spec()), planning)


@pytest.mark.slow
def test_perseus_takes_the_same_deadline_as_the_rule() -> None:
    job = JobConfig.load(EXAMPLE_7B)
    spec = job.spec()
    planner = Planner(job.build_dag(spec=spec), job.synthetic_profile(spec), num_points=4)
    stock_s = planner.solver.baseline.iteration_time_s
    for text in ("iso-time", "slowdown:0.1"):
        point = planner.point(parse_target(text))
        assert point.time_s <= parse_target(text).deadline_s(stock_s) * (1 + 1e-9)
    assert planner.point(parse_target("min-energy")).energy_j == pytest.approx(
        planner.point_for_time(parse_target("min-energy").deadline_s(stock_s)).energy_j
    )
