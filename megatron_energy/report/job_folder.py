"""One cached job folder read back: its facts, GPU spec, plan, profile and executed orders.

The folder (``<energy dir>/<fingerprint>``, its files named in ``megatron_energy.energy_dir``) holds
``job.json`` (the job facts the fingerprint was made of, ``energy_dir.JobFacts``), ``profile.csv`` and
``plan.json``; the report and the demo's mode comparison read it through :func:`read_job_folder`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.energy_dir import JobFacts, JobFiles, JobRecord
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import Profile
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import Plan
from megatron_energy.plan_file import load_plan


class ReportError(EnergyValueError):
    """The energy folder holds no usable job; the message says what is missing."""


@dataclass(frozen=True)
class JobFolder:
    """What one cached job folder holds."""

    folder: Path
    """``<energy dir>/<fingerprint>``."""
    facts: JobFacts
    """The job facts (``job.json``)."""
    spec: GpuSpec
    """The GPU spec the job ran on."""
    plan: Plan
    """The plan that ran."""
    profile: Profile
    """The profile it was planned from."""
    orders: PipelineOrders
    """Every rank's executed instruction order."""


def read_job_folder(folder: Path) -> JobFolder:
    """Read a cached job folder.

    Raises:
        ReportError: The folder misses the job facts, the profile or the plan, or the plan is another job's.
    """
    files = JobFiles(folder)
    try:
        facts = JobRecord.read(files.record).facts
    except (OSError, ValueError):
        raise ReportError(
            f"{folder} has no readable {files.record.name}; is it a megatron_energy job folder?"
        ) from None
    if not files.profile.exists() or not files.plan.exists():
        raise ReportError(
            f"{folder} has no {files.profile.name}/{files.plan.name} yet: the job has not finished profiling"
        )
    spec = load_gpu_spec(facts.gpu)
    plan = load_plan(files.plan, expected_fingerprint=files.fingerprint)
    profile = Profile.from_csv(files.profile, gpu_name=spec.name, source=plan.provenance)
    orders = pipeline_orders(
        facts.pipeline_size,
        facts.num_microbatches,
        facts.num_chunks,
        microbatch_group_size=facts.microbatch_group_size,
        combined=facts.combined_1f1b,
    )
    return JobFolder(folder, facts, spec, plan, profile, orders)
