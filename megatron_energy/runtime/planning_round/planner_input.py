"""What rank 0's planner process plans from: the replica's profile, the job, and the baseline.

:func:`planner_input` turns the planning replica's stage profiles (gathered at the end of profiling,
``profiling.replica_profile``) into a
:class:`~megatron_energy.runtime.planning_round.planner_process.PlannerInput`: their rows merged into one
profile (the unprofiled clocks extrapolated by the model where clocks could not be set), the job as the
planner sees it with what was measured of it, and the baseline at stock clocks.
"""

from __future__ import annotations

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.optimisers import registry
from megatron_energy.optimisers.interface import ProfileRequest
from megatron_energy.pipeline.collectives import MeasuredBucket
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.planning_round.planner_process import PlannerInput
from megatron_energy.runtime.planning_round.planning import (
    baseline_from_profiling,
    profile_from_rows,
    tail_from_profiling,
    tail_phases_from_profiling,
)
from megatron_energy.runtime.planning_round.replanning import planning_job
from megatron_energy.runtime.profiling.collector import merge_rows
from megatron_energy.runtime.profiling.extrapolation import extrapolate_rows
from megatron_energy.runtime.profiling.job_stock import JobStock
from megatron_energy.runtime.profiling.kernel_timeline import Timelines
from megatron_energy.runtime.profiling.measured_inputs import MeasuredInputs
from megatron_energy.runtime.profiling.replica_profile import StageProfile


def planner_input(
    config: EnergyConfig,
    context: JobContext,
    spec: GpuSpec,
    fingerprint: str,
    request: ProfileRequest,
    profiles: list[StageProfile],
    stock: JobStock,
    timelines: Timelines,
    buckets: tuple[MeasuredBucket, ...] | None,
    *,
    can_set_clocks: bool,
    grid_mhz: list[int],
    profile_source: str,
    timer_source: str,
) -> PlannerInput:
    """What the planner process plans from; its optimiser is built from ``--energy-mode`` again.

    Args:
        config: The ``--energy-*`` configuration.
        context: This rank's place in the job.
        spec: The GPU's spec.
        fingerprint: The job's cache fingerprint.
        request: What the optimiser asked to be profiled.
        profiles: The planning replica's profile of each stage.
        stock: The job's stock-clock figures.
        timelines: The replica's kernel timelines (empty where the optimiser plans no phases).
        buckets: Every pipeline rank's measured DDP bucket layout, or ``None``.
        can_set_clocks: Whether clocks were really set (otherwise the other clocks are extrapolated).
        grid_mhz: The planning grid, highest (stock) first.
        profile_source: Where the profile's figures come from.
        timer_source: ``measured`` (CUDA events) or ``modelled`` (simulated GPUs).
    """
    gathered = [(profile.rows, profile.steps) for profile in profiles]
    rows = [rank_rows for rank_rows, _ in gathered]
    if not can_set_clocks:
        mixes = context.compute_mixes(spec)
        rows = [extrapolate_rows(rank_rows, spec, grid_mhz, mixes) for rank_rows in rows]
    profile = profile_from_rows(
        merge_rows(rows),
        gpu_name=spec.name,
        source=profile_source,
        blocked_power_w=spec.blocked_power_w,
        idle_power_w=spec.idle_power_w,
    )
    measured = MeasuredInputs(
        request,
        tail_from_profiling(gathered),
        tail_phases_from_profiling(gathered),
        timelines or None,
        buckets,
    )
    job = planning_job(config, context, spec, fingerprint, request, measured)
    ranks = [profile.global_rank for profile in profiles]
    baseline = baseline_from_profiling(gathered, ranks, stock, source=timer_source)
    return PlannerInput(config.mode, registry.registered(), profile, job, baseline)
