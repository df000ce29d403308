"""One cached job folder read back: its facts, GPU spec, plan, profile and executed orders.

The folder (``<energy dir>/<fingerprint>``) holds ``job.json`` (the job facts the fingerprint was made of,
``runtime.context.JobContext.fingerprint_parts``), ``profile.csv`` and ``plan.json``; the report and the
demo's mode comparison read it through :func:`read_job_folder`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
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
    parts: dict[str, Any]
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
    try:
        parts = json.loads((folder / "job.json").read_text(encoding="utf-8"))["parts"]
    except (OSError, ValueError, KeyError):
        raise ReportError(f"{folder} has no readable job.json; is it a megatron_energy job folder?") from None
    if not (folder / "profile.csv").exists() or not (folder / "plan.json").exists():
        raise ReportError(f"{folder} has no profile.csv/plan.json yet: the job has not finished profiling")
    spec = load_gpu_spec(parts["gpu"])
    plan = load_plan(folder / "plan.json", expected_fingerprint=folder.name)
    profile = Profile.from_csv(folder / "profile.csv", gpu_name=spec.name, source=plan.provenance)
    orders = pipeline_orders(
        parts["pipeline_size"],
        parts["num_microbatches"],
        parts.get("num_chunks", 1),
        microbatch_group_size=parts.get("microbatch_group_size"),
        combined=parts.get("combined_1f1b", False),
    )
    return JobFolder(folder, parts, spec, plan, profile, orders)
