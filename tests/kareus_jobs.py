"""Example jobs and their collective workloads, shared by the Kareus tests."""

from __future__ import annotations

from pathlib import Path

from megatron_energy.job import JobConfig
from megatron_energy.pipeline.collectives import CollectiveWorkload

EXAMPLES = Path(__file__).resolve().parents[1] / "configs" / "examples"
EXAMPLE_7B = EXAMPLES / "llama-7b-pp4-tp2-h200.yaml"
EXAMPLE_70B = EXAMPLES / "llama-70b-pp8-tp8-a100.yaml"


def workload_of(job: JobConfig) -> CollectiveWorkload:
    """The job's collective workload (as ``simulate`` builds it)."""
    return job.collective_workload()
