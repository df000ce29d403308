"""A kernel-mode plan of a 2-stage GPT-3 1.3B with a measured tail: instruction, phase and tail clocks."""

from __future__ import annotations

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.registry import resolve
from megatron_energy.pipeline.dag_nodes import IterationTail
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import Plan
from megatron_energy.target import EnergyTarget

GRID = [1980, 1530, 1080, 900, 630]


def gpt3_kernel_plan(switch_latency_s: float) -> tuple[Plan, PlanningJob]:
    """The plan and its job (4 microbatches, tail phases: gradient sync 30 ms, optimizer 40 ms)."""
    spec = load_gpu_spec("h100-sxm")
    profile = Profile.synthetic(
        TransformerShape.from_name("gpt3-1.3b", micro_batch_size=2), spec, 2, clocks_mhz=GRID
    )
    job = PlanningJob(
        pipeline_orders(2, 4),
        "0123456789abcdef",
        EnergyTarget("iso-time"),
        switch_latency_s=switch_latency_s,
        tail=IterationTail.measured(0.1, (20.0, 20.0)),
        layers_per_chunk=12,
        tail_phases=(("grad-sync", 0.030), ("optimizer", 0.040)),
    )
    return resolve("kernel").plan(profile, job), job
