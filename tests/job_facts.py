"""Job facts of a small job, for the tests of the energy-directory cache (``energy_dir.JobFacts``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from megatron_energy.energy_dir import JobFacts, PlanningInputs
from megatron_energy.pipeline.job_collectives import CollectiveSetup
from megatron_energy.pipeline.workload import TransformerShape

FACTS = JobFacts(
    model=TransformerShape.from_name("gpt3-1.3b"),
    pipeline_size=4,
    num_chunks=1,
    tensor_parallel_size=1,
    data_parallel_size=1,
    num_microbatches=8,
    microbatch_group_size=None,
    gpu="h100-sxm",
    collectives=CollectiveSetup(data_parallel=1),
)
"""A GPT-3 XL job on four H100s, the facts of the job alone."""


def job_facts(**changes: Any) -> JobFacts:
    """:data:`FACTS` with ``changes``."""
    return dataclasses.replace(FACTS, **changes)


def planned(target: str, gpu_spec: dict[str, Any] | None = None, **changes: Any) -> JobFacts:
    """The facts of a job planned by ``perseus`` for ``target``, with ``changes``."""
    planning = PlanningInputs("perseus", target, 0.01, "auto", gpu_spec or {})
    return job_facts(planning=planning, **changes)


def read_back(facts: JobFacts) -> dict[str, Any]:
    """The facts' parts as a job record holds them once read back from JSON."""
    parts: dict[str, Any] = json.loads(json.dumps(facts.to_parts()))
    return parts
