"""The job an optimiser plans, from what profiling measured; and re-planning from a cached run's measurements.

:func:`job_from_facts` puts the job the session plans together: the job's facts (``energy_dir.JobFacts``:
model shape, layout, collectives), its orders, the planning inputs (target, the GPU spec and its switch
latency) and the measurements (:class:`~megatron_energy.runtime.profiling.measured_inputs.MeasuredInputs`),
through the one builder of a job (``optimisers.interface.planning_job``). The session plans with it after
profiling (:func:`planning_job`); :class:`Replanner` plans with it from a cached run of the same job whose
planning inputs differ (``JobCache.load`` finds that run and asks), so a changed target, mode, switch
latency, phase switching or GPU spec costs a plan, not a profile; and the demo's mode comparison plans the
job of a cached folder with it (``commands.optimiser_comparison.compare_job_folder``).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.energy_dir import MEASURED, PROFILE, JobArtefacts, JobFacts
from megatron_energy.errors import EnergyValueError
from megatron_energy.optimisers.interface import Optimiser, PlanningJob, ProfileRequest
from megatron_energy.optimisers.interface import planning_job as build_planning_job
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import Profile
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.planning_round.planning import plan_on_root, release_artefacts
from megatron_energy.runtime.profiling.measured_inputs import MeasuredInputs
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.target import EnergyTarget


def job_from_facts(
    facts: JobFacts,
    orders: PipelineOrders,
    spec: GpuSpec,
    target: EnergyTarget,
    fingerprint: str,
    measured: MeasuredInputs,
    *,
    switch_latency_s: float | None = None,
    collectives: bool = True,
    memory_clock: bool = True,
) -> PlanningJob:
    """The job the session plans, from the job's facts and what profiling measured.

    Args:
        facts: The job's facts (model shape, layer layout, collective setup).
        orders: Every rank's executed instruction order.
        spec: The GPU spec (switch latency, links, powers).
        target: The planning target.
        fingerprint: The job fingerprint the plan carries.
        measured: What profiling measured (tail, outside phases, phase timelines, DDP buckets).
        switch_latency_s: The clock-switch latency; the spec's when ``None``.
        collectives: Whether the job's collectives are described (when the optimiser plans them and the
            facts know them, with the measured buckets).
        memory_clock: Whether the plan may lower a rank's memory clock where that pays.
    """
    setup, shape = facts.collectives, facts.model
    workload = None
    if collectives and setup is not None and shape is not None:
        workload = dataclasses.replace(setup, buckets=measured.buckets).workload(shape, orders, spec)
    return build_planning_job(
        orders,
        fingerprint,
        target,
        spec,
        shape=shape,
        layers=facts.layers,
        switch_latency_s=switch_latency_s,
        tail=measured.tail,
        collectives=workload,
        tail_phases=measured.tail_phases,
        phase_timelines=measured.phase_timelines or None,
        memory_clock=memory_clock,
    )


def planning_job(
    config: EnergyConfig,
    context: JobContext,
    spec: GpuSpec,
    fingerprint: str,
    request: ProfileRequest,
    measured: MeasuredInputs,
) -> PlanningJob:
    """The job the optimiser plans in this session (:func:`job_from_facts` of this rank's context).

    Args:
        config: The ``--energy-*`` configuration (the target, the memory clock).
        context: This rank's job context (orders, collectives setup, model shape).
        spec: The GPU spec (switch latency, links, powers).
        fingerprint: The job fingerprint the plan carries.
        request: What the optimiser asks for (its collectives are described only when it plans them).
        measured: What profiling measured.
    """
    return job_from_facts(
        context.job_facts(spec.name),
        context.orders,
        spec,
        config.target,
        fingerprint,
        measured,
        collectives=request.collectives,
        memory_clock=config.memory_clock == "auto",
    )


@dataclasses.dataclass(frozen=True)
class Replanner:
    """Plans this job from a cached run's verified artefacts (``JobCache.replan``), in this process.

    Rank 0 calls it before training starts, so the plan is computed while no step waits on the GPU.
    """

    config: EnergyConfig
    context: JobContext
    spec: GpuSpec
    optimiser: Optimiser

    def __call__(self, artefacts: Mapping[str, bytes], fingerprint: str) -> dict[str, str]:
        """The artefacts of this job's cache folder, planned from ``artefacts`` (another run's).

        Args:
            artefacts: The cached run's verified artefacts (profile, baseline, plan, measured inputs).
            fingerprint: This job's fingerprint, which the new plan carries.

        Raises:
            EnergyValueError: The cached run holds no measured inputs, or was profiled for less than this
                mode needs.
            ValueError: An artefact does not parse.
        """
        cached = JobArtefacts.of_files(artefacts)
        if cached.measured_json is None:
            raise EnergyValueError(f"it holds no {MEASURED} (cached by an older version)")
        measured = MeasuredInputs.from_json(cached.measured_json)
        request = self.optimiser.request
        missing = measured.request.lacking(request)
        if missing:
            raise EnergyValueError(
                f"it was profiled for less than --energy-mode {self.config.mode} asks for "
                f"(its profile has no {', '.join(missing)})"
            )
        profile = _profile(cached.profile_csv, self.spec)
        baseline = StockBaseline.from_json(cached.baseline_json)
        job = planning_job(self.config, self.context, self.spec, fingerprint, request, measured)
        release = plan_on_root(self.optimiser, profile, job, baseline)
        return dataclasses.replace(release_artefacts(release), measured_json=cached.measured_json).files()


def _profile(csv_text: str, spec: GpuSpec) -> Profile:
    """The profile in a verified CSV text, its source from its column (read through a private file)."""
    with tempfile.TemporaryDirectory(prefix="megatron_energy-replan-") as folder:
        path = Path(folder) / PROFILE
        path.write_text(csv_text, encoding="utf-8")
        return Profile.from_csv(
            path,
            gpu_name=spec.name,
            blocked_power_w=spec.blocked_power_w,
            idle_power_w=spec.idle_power_w,
        )
