"""The job an optimiser plans, from what profiling measured; and re-planning from a cached run's measurements.

:func:`planning_job` is the one place the session's ``PlanningJob`` is put together: the job's orders, the
planning inputs (target, the GPU spec and its switch latency) and the measurements
(:class:`~megatron_energy.runtime.profiling.measured_inputs.MeasuredInputs`). The session plans with it after
profiling; :class:`Replanner` plans with it from a cached run of the same job whose planning inputs differ
(``JobCache.load`` finds that run and asks), so a changed target, mode, switch latency, phase switching or GPU
spec costs a plan, not a profile.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.errors import EnergyValueError
from megatron_energy.optimisers.interface import Optimiser, PlanningJob, ProfileRequest
from megatron_energy.pipeline.collectives import CollectiveWorkload
from megatron_energy.pipeline.profile import Profile
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.planning_round.planning import plan_on_root, release_artefacts
from megatron_energy.runtime.profiling.measured_inputs import MEASURED_NAME, MeasuredInputs
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline


def planning_job(
    config: EnergyConfig,
    context: JobContext,
    spec: GpuSpec,
    fingerprint: str,
    request: ProfileRequest,
    measured: MeasuredInputs,
) -> PlanningJob:
    """The job the optimiser plans.

    Args:
        config: The ``--energy-*`` configuration (the target).
        context: This rank's job context (orders, collectives setup, model shape).
        spec: The GPU spec (switch latency, links, powers).
        fingerprint: The job fingerprint the plan carries.
        request: What the optimiser asks for (its collectives are described only when it plans them).
        measured: What profiling measured.
    """
    return PlanningJob(
        orders=context.orders,
        fingerprint=fingerprint,
        target=config.target,
        switch_latency_s=spec.switch_latency_s,
        tail=measured.tail,
        collectives=_collective_workload(context, spec, request, measured),
        gpu=spec,
        tail_phases=measured.tail_phases,
        phase_timelines=measured.phase_timelines or None,
        compute_mixes=context.compute_mixes(spec),
        memory_clock=config.memory_clock == "auto",
    )


def _collective_workload(
    context: JobContext, spec: GpuSpec, request: ProfileRequest, measured: MeasuredInputs
) -> CollectiveWorkload | None:
    """The job's collectives on this GPU, when the optimiser asks for them and the context knows them."""
    setup, shape = context.collectives, context.shape
    if not request.collectives or setup is None or shape is None:
        return None
    setup = dataclasses.replace(setup, buckets=measured.buckets)
    return setup.workload(shape, context.orders, spec)


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
        text = {name: content.decode("utf-8") for name, content in artefacts.items()}
        if MEASURED_NAME not in text:
            raise EnergyValueError(f"it holds no {MEASURED_NAME} (cached by an older version)")
        measured = MeasuredInputs.from_json(text[MEASURED_NAME])
        request = self.optimiser.request
        missing = measured.request.lacking(request)
        if missing:
            raise EnergyValueError(
                f"it was profiled for less than --energy-mode {self.config.mode} asks for "
                f"(its profile has no {', '.join(missing)})"
            )
        profile = _profile(text["profile.csv"], self.spec)
        baseline = StockBaseline.from_json(text["baseline.json"])
        job = planning_job(self.config, self.context, self.spec, fingerprint, request, measured)
        release = plan_on_root(self.optimiser, profile, job, baseline)
        return release_artefacts(release) | {MEASURED_NAME: text[MEASURED_NAME]}


def _profile(csv_text: str, spec: GpuSpec) -> Profile:
    """The profile in a verified CSV text, its source from its column (read through a private file)."""
    with tempfile.TemporaryDirectory(prefix="megatron_energy-replan-") as folder:
        path = Path(folder) / "profile.csv"
        path.write_text(csv_text, encoding="utf-8")
        return Profile.from_csv(
            path,
            gpu_name=spec.name,
            blocked_power_w=spec.blocked_power_w,
            idle_power_w=spec.idle_power_w,
        )
