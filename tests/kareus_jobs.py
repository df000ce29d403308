"""Example jobs and their collective workloads, shared by the Kareus tests."""

from __future__ import annotations

from pathlib import Path

from megatron_energy.job import JobConfig
from megatron_energy.kareus.collectives import CollectiveWorkload

EXAMPLES = Path(__file__).resolve().parents[1] / "configs" / "examples"
EXAMPLE_7B = EXAMPLES / "llama-7b-pp4-tp2-h200.yaml"
EXAMPLE_70B = EXAMPLES / "llama-70b-pp8-tp8-a100.yaml"


def workload_of(job: JobConfig) -> CollectiveWorkload:
    """The job's collective workload, with NVLink inside and the job's links across nodes."""
    spec = job.spec()
    return CollectiveWorkload(
        shape=job.shape,
        orders=job.orders(),
        data_parallel=job.data_parallel,
        sequence_parallel=job.sequence_parallel,
        distributed_optimizer=True,
        dp_link="nvlink",
        dp_bandwidth_gbps=job.data_parallel_bandwidth_gbps or spec.p2p_bandwidth_gbps,
        pp_link="nic",
        pp_bandwidth_gbps=job.pipeline_bandwidth_gbps or spec.p2p_bandwidth_gbps,
        tp_bandwidth_gbps=spec.p2p_bandwidth_gbps,
    )
