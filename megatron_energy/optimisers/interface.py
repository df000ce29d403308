"""The ``Optimiser`` interface: what every planning layer (Perseus, Kareus, phases) implements.

An optimiser says what it needs profiled (:class:`ProfileRequest`) and turns a profile of the job into a
:class:`~megatron_energy.plan.Plan` (:meth:`Optimiser.plan`). It is pure: it gets everything about the job
as data (:class:`PlanningJob`: the executed orders, the fingerprint, the target, the GPU's switch latency
and powers) and returns the plan; the session does the profiling, gathering, caching, broadcasting and
running. ``megatron_energy.optimisers.registry`` maps ``--energy-mode`` to optimisers;
``megatron_energy.optimisers.composition`` composes them for ``--energy-mode all`` (each refines the plan of
the one before, which it receives as ``base``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol

from megatron_energy.dvfs.kernel_classes import ClassMix
from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import CommSpec, IterationTail
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.modelled_phases import LAYER_PATTERN, LayerPattern, layer_pattern
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import Profile
from megatron_energy.pipeline.workload import instruction_mixes
from megatron_energy.plan import Baseline, FrontierSample, MeasuredTail, Plan, PlanPoint
from megatron_energy.target import EnergyTarget

if TYPE_CHECKING:
    from megatron_energy.dvfs.spec import GpuSpec
    from megatron_energy.pipeline.chunk_layers import ChunkLayers
    from megatron_energy.pipeline.collectives import CollectiveWorkload
    from megatron_energy.pipeline.workload import TransformerShape


@dataclass(frozen=True)
class ProfileRequest:
    """What an optimiser needs measured while the job profiles."""

    clock_grid: bool = True
    """Every instruction's time and energy at each clock of the profiling grid."""

    phases: bool = False
    """Kernel timelines of instructions and of the iteration tail at stock clocks, grouped into phases
    (``pipeline.phase_timeline``), handed to optimisers as ``PlanningJob.phase_timelines``."""

    collectives: bool = False
    """Launch and completion times of collectives."""

    def lacking(self, other: ProfileRequest) -> list[str]:
        """The fields ``other`` asks for that this request did not (what a profile made for it lacks)."""
        return [
            spec.name for spec in fields(self) if getattr(other, spec.name) and not getattr(self, spec.name)
        ]

    def union(self, other: ProfileRequest) -> ProfileRequest:
        """Everything either request asks for."""
        return ProfileRequest(
            clock_grid=self.clock_grid or other.clock_grid,
            phases=self.phases or other.phases,
            collectives=self.collectives or other.collectives,
        )


SWITCH_EVALUATIONS = 2000
"""Latency-aware simulations the switch-latency post-pass's improvement search may run for a point by default
(``megatron-energy plan``'s and the session's budget)."""


@dataclass(frozen=True)
class PlanningJob:
    """The job an optimiser plans for, as plain data; built by :func:`planning_job` only."""

    orders: PipelineOrders
    """Every rank's executed instruction order (from megatron-core's schedule, group size included)."""

    fingerprint: str
    """The job fingerprint every plan carries."""

    target: EnergyTarget
    """``--energy-target``."""

    switch_latency_s: float = 0.0
    """The GPU's SM-clock switch latency; plans must stay executable under it."""

    comm: CommSpec | None = None
    """Cost of one pipeline transfer; transfers take no time when ``None`` (measured instruction times
    already include what the stage waited for)."""

    tail: IterationTail | None = None
    """Data-parallel sync and optimizer step after the last backward; none when ``None``."""

    frontier_points: int = 40
    """Deadlines in a frontier sweep."""

    kept_points: int = 8
    """Executable frontier points a plan keeps besides the target (for a straggler's pace)."""

    switch_evaluations: int = SWITCH_EVALUATIONS
    """Latency-aware simulations the switch-latency post-pass's improvement search may run for each point it
    makes executable (``perseus.switch_latency.make_switch_aware``'s ``max_evaluations``)."""

    collectives: CollectiveWorkload | None = None
    """What the job's collectives are built from (shape, parallelism, links); the collective scheduler
    (``kareus``) needs it, the clock planner does not."""

    gpu: GpuSpec | None = None
    """The GPU spec (SM count, interconnect, powers) for models that need more than the profile; looked up by
    the profile's GPU name when ``None``."""

    layers_per_chunk: int | None = None
    """Transformer layers one instruction runs (for the modelled phase split); ``None``: unknown."""

    layer_pattern: LayerPattern = LAYER_PATTERN
    """One layer's runs in order, for the modelled phase split (``pipeline.modelled_phases.layer_pattern``: an
    MoE layer's router, experts and all-to-alls); a dense layer's by default."""

    tail_phases: Sequence[tuple[str, float]] = ()
    """Measured duration at the stock clock of each outside phase (``events.OUTSIDE_PHASES`` names: gradient
    sync, optimizer step, parameter all-gather) in the order they run, from the session's profiling steps;
    empty when the runtime did not see them (then only a modelled ``tail`` gets phase clocks)."""

    phase_timelines: Mapping[Work, Sequence[tuple[str, WorkProfile]]] | None = None
    """Measured phases of each instruction class, in order: (class, work at the maximum clock), from kernel
    timelines (``ProfileRequest.phases``); ``None`` until the runtime measures them (phases are then
    modelled from each instruction's per-class split)."""

    compute_mixes: Mapping[Work, ClassMix] | None = None
    """The kernel classes of each instruction class's compute-bound time from the workload model
    (``pipeline.workload.instruction_mixes``: GEMM dtype, attention); ``None``: not known (bf16 GEMMs). A
    measured kernel timeline's classes take precedence where one was recorded."""
    memory_clock: bool = True
    """Whether the plan may lower a rank's memory clock for the run phase where that pays
    (``--energy-memory-clock auto``; ``optimisers.memory_clock``); ``False`` keeps the stock one."""

    def dag(self) -> PipelineDag:
        """The iteration DAG of this job."""
        return PipelineDag.build(self.orders, comm=self.comm, tail=self.tail)

    @property
    def measured_tail(self) -> MeasuredTail | None:
        """The iteration tail as profiling measured it, for a plan file; ``None`` if it was not measured."""
        tail = self.tail
        if tail is None or not tail.is_measured:
            return None
        return MeasuredTail(tail.outside_s, tail.stage_energy_j)

    def new_plan(
        self,
        profile: Profile,
        *,
        optimisers: tuple[str, ...],
        baseline: Baseline,
        points: Sequence[PlanPoint],
        target_index: int = 0,
        frontier: Sequence[FrontierSample] = (),
        measured_tail: MeasuredTail | None,
    ) -> Plan:
        """A plan of this job, the one way an optimiser builds one.

        What every plan shares (job, GPU, provenance, target, switch latency) comes from the job and the
        profile; the rest is the optimiser's.

        Args:
            profile: The profile planned from (its GPU and provenance go into the plan).
            optimisers: The optimisers that made the plan, in order.
            baseline: The stock iteration the plan's points are set against.
            points: The plan's executable points.
            target_index: Which of ``points`` meets the target.
            frontier: The instant-switch frontier the points were picked from (empty if none was swept).
            measured_tail: The measured iteration tail (:attr:`measured_tail`, or a base plan's).

        Returns:
            The plan.
        """
        return Plan(
            fingerprint=self.fingerprint,
            gpu_name=profile.gpu_name,
            provenance=profile.source,
            target=str(self.target),
            optimisers=optimisers,
            switch_latency_s=self.switch_latency_s,
            baseline=baseline,
            points=tuple(points),
            target_index=target_index,
            frontier=tuple(frontier),
            measured_tail=measured_tail,
        )


def planning_job(
    orders: PipelineOrders,
    fingerprint: str,
    target: EnergyTarget,
    spec: GpuSpec | None,
    *,
    shape: TransformerShape | None = None,
    layers: ChunkLayers | None = None,
    switch_latency_s: float | None = None,
    comm: CommSpec | None = None,
    tail: IterationTail | None = None,
    collectives: CollectiveWorkload | None = None,
    tail_phases: Sequence[tuple[str, float]] = (),
    phase_timelines: Mapping[Work, Sequence[tuple[str, WorkProfile]]] | None = None,
    layers_per_chunk: int | None = None,
    frontier_points: int = 40,
    kept_points: int = 8,
    memory_clock: bool = True,
) -> PlanningJob:
    """The one builder of a :class:`PlanningJob`: offline (a job file, a profile CSV), live, in comparisons.

    What the model shape decides is derived here from it, for every caller alike: one layer's runs for the
    modelled phase split (``pipeline.modelled_phases.layer_pattern``: an MoE layer's router, experts and
    all-to-alls) and the kernel classes of each instruction class's compute time
    (``pipeline.workload.instruction_mixes``, over ``layers`` when a layout places them).

    Args:
        orders: Every rank's executed instruction order.
        fingerprint: The job fingerprint every plan carries.
        target: The planning target.
        spec: The GPU spec (switch latency, powers, links); ``None``: none given (a bare profile CSV).
        shape: The model's transformer shape; ``None``: not known (a dense layer's runs, bf16 GEMMs).
        layers: Decoder layers of every model chunk when a layout places them; ``None``: the even split.
        switch_latency_s: The clock-switch latency; the spec's (0 without one) when ``None``.
        comm: Cost of one pipeline transfer; ``None``: in the measured instruction times.
        tail: The iteration tail (modelled or measured); ``None``: none.
        collectives: The job's collectives, for the optimisers that plan them; ``None``: not planned.
        tail_phases: Measured durations of the outside phases at the stock clock.
        phase_timelines: Measured phases of each instruction class; ``None``: modelled.
        layers_per_chunk: Layers one instruction runs in the modelled phase split; ``None``: one.
        frontier_points: Deadlines in a frontier sweep.
        kept_points: Executable frontier points a plan keeps besides the target.
        memory_clock: Whether the plan may lower a rank's memory clock where that pays.
    """
    if switch_latency_s is None:
        switch_latency_s = 0.0 if spec is None else spec.switch_latency_s
    pattern: LayerPattern = LAYER_PATTERN
    mixes: Mapping[Work, ClassMix] | None = None
    if shape is not None and spec is not None:
        pattern = layer_pattern(shape, spec)
        mixes = instruction_mixes(shape, spec, orders.num_stages, orders.num_chunks, layers)
    return PlanningJob(
        orders=orders,
        fingerprint=fingerprint,
        target=target,
        switch_latency_s=switch_latency_s,
        comm=comm,
        tail=tail,
        frontier_points=frontier_points,
        kept_points=kept_points,
        collectives=collectives,
        gpu=spec,
        layers_per_chunk=layers_per_chunk,
        layer_pattern=pattern,
        tail_phases=tail_phases,
        phase_timelines=phase_timelines,
        compute_mixes=mixes,
        memory_clock=memory_clock,
    )


class Optimiser(Protocol):
    """One planning layer (see the module docstring)."""

    @property
    def name(self) -> str:
        """The ``--energy-mode`` name."""
        ...

    @property
    def request(self) -> ProfileRequest:
        """What it needs profiled."""
        ...

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        """Plan the job.

        Args:
            profile: The job's profile (merged over ranks).
            job: The job.
            base: The plan of the optimiser before this one in a composition; ``None`` for the first.

        Returns:
            An executable plan for ``job.target``.
        """
        ...
