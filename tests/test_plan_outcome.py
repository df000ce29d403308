"""A mode that finds nothing says why, in the plan line and the report, and draws no empty frontier plot."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from megatron_energy.energy_dir import JobFacts, JobRecord
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.kareus.collective_optimiser import KareusOptimiser
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.optimisers.kernel.phase_optimiser import PhaseOptimiser
from megatron_energy.plan import Plan
from megatron_energy.plan_file import plan_text, save_plan
from megatron_energy.plan_outcome import why_nothing_found
from megatron_energy.report.job_report import write_job_report
from megatron_energy.runtime.planning_round.planning import plan_summary
from megatron_energy.target import parse_target
from tests.kareus_jobs import EXAMPLE_7B

FINGERPRINT = "0123456789abcdef"

pytestmark = pytest.mark.slow  # plans the 7B example


def _job(switch_latency_s: float) -> tuple[JobConfig, PlanningJob]:
    job = JobConfig.load(EXAMPLE_7B)
    spec = job.spec()
    return job, PlanningJob(
        orders=job.orders(),
        fingerprint=FINGERPRINT,
        target=parse_target("iso-time"),
        switch_latency_s=switch_latency_s,
        comm=job.comm_spec(spec),
        tail=job.iteration_tail(spec),
        collectives=job.collective_workload(spec),
        gpu=spec,
    )


def _job_folder(tmp_path: Path, job: JobConfig, plan: Plan) -> Path:
    folder = tmp_path / FINGERPRINT
    folder.mkdir()
    orders = job.orders()
    facts = JobFacts(
        model=job.shape,
        pipeline_size=orders.num_stages,
        num_chunks=orders.num_chunks,
        tensor_parallel_size=job.tensor_parallel,
        data_parallel_size=job.data_parallel,
        num_microbatches=orders.num_microbatches,
        microbatch_group_size=orders.microbatch_group_size,
        gpu=job.spec().name,
        collectives=None,
    )
    (folder / "job.json").write_text(JobRecord(FINGERPRINT, facts).to_json())
    (folder / "profile.csv").write_text(job.synthetic_profile(job.spec()).to_csv_text())
    save_plan(plan, folder / "plan.json")
    return folder


def test_phases_shorter_than_the_switch_latency_say_so_and_draw_no_plot(tmp_path: Path) -> None:
    job, planning = _job(switch_latency_s=5.0)
    plan = PhaseOptimiser().plan(job.synthetic_profile(job.spec()), planning)
    why = why_nothing_found(plan)
    assert why is not None and "kernel: no phase gains from a clock of its own once a 5000 ms" in why
    assert f"(no saving: {why})" in plan_summary(plan, plan_text(plan))
    report = write_job_report(_job_folder(tmp_path, job, plan))
    assert report.frontier_png is None and not (tmp_path / FINGERPRINT / "frontier.png").exists()
    assert "none drawn" in report.frontier_line and why in report.frontier_line


def test_kareus_that_keeps_the_defaults_names_the_collectives_it_looked_at() -> None:
    job, planning = _job(switch_latency_s=0.0)
    plan = KareusOptimiser(budget=SearchBudget(trials=1)).plan(job.synthetic_profile(job.spec()), planning)
    assert why_nothing_found(plan) is None, "the example job's collectives save energy"
    saved_nothing = dataclasses.replace(
        plan, baseline=dataclasses.replace(plan.baseline, energy_j=plan.target_point.energy_j)
    )
    why = why_nothing_found(saved_nothing)
    assert why is not None and "kareus: no schedule of the job's collectives (dp." in why
    assert "pp.send_recv" in why and "below megatron-core's defaults" in why
