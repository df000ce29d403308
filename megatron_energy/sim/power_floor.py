"""The least a job can draw per GPU: every instruction at its lowest clock, as the model prices it.

A power budget below it is out of reach whatever the plan (:func:`modelled_floor_problem` says so before
profiling, where the GPU spec's model is the GPU: simulated GPUs). Every figure is *modelled*.
"""

from __future__ import annotations

from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.sim.simulator import Simulator
from megatron_energy.target import EnergyTarget


def slowest_power_w(dag: PipelineDag, profile: Profile) -> float:
    """The average power per GPU of the job with every instruction at its lowest clock (*modelled*).

    No plan of ``dag`` draws less on average: a slower clock draws less power, and the GPU draws blocked or
    idle power between instructions at any clock. With a synthetic profile (the GPU spec's model) it is known
    before profiling (``EnergySession`` refuses a budget below it on simulated GPUs).
    """
    clocks = {
        instruction: min(option.clock_mhz for option in profile.options(instruction.work))
        for stage in range(dag.num_stages)
        for instruction in dag.stage_steps(stage)
    }
    result = Simulator(dag, profile).run(clocks)
    return result.total_energy_j / (dag.num_stages * result.iteration_time_s)


def modelled_floor_problem(
    target: EnergyTarget, shape: TransformerShape, spec: GpuSpec, orders: PipelineOrders
) -> str | None:
    """Why a power budget is out of the job's reach as the GPU spec's model prices it, or ``None``.

    Known before profiling where the spec's model is the GPU's (simulated GPUs): :func:`slowest_power_w` of
    the job's synthetic profile (the FLOP/byte model of ``shape`` on ``spec``).
    """
    if target.kind != "power":
        return None
    profile = Profile.synthetic(shape, spec, orders.num_stages, orders.num_chunks)
    floor_w = slowest_power_w(PipelineDag.build(orders), profile)
    if target.power_w >= floor_w:
        return None
    return (
        f"--energy-target {target}: no plan can meet it: the job draws at least {floor_w:.1f} W per GPU "
        f"with every instruction at {spec.name}'s lowest clock (modelled from the GPU spec, before "
        "profiling); give a budget of at least that, or use min-energy for the least energy"
    )
