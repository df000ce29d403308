"""Assemble one rank's ``EnergySession`` from the config: GPUs, guard, controller, meter, timer, cache."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.backends import GpuHandle, open_gpus, supported_sm_clocks_mhz
from megatron_energy.dvfs.clock_events import ClockEventsUnavailableError, open_clock_events
from megatron_energy.dvfs.controller import BoundaryEvent, FrequencyController
from megatron_energy.dvfs.kernel_classes import KernelClass
from megatron_energy.dvfs.meter import EnergyMeter
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.energy_dir import JobFacts, JobFiles, simulated_state_path
from megatron_energy.errors import EnergyRuntimeError, EnergyValueError
from megatron_energy.log import log_single_rank
from megatron_energy.optimisers.interface import Optimiser
from megatron_energy.optimisers.registry import resolve
from megatron_energy.pipeline.chunk_layers import ChunkLayers
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.modelled_phases import layer_pattern, modelled_phases
from megatron_energy.pipeline.workload import instruction_work
from megatron_energy.runtime.context import JobContext, planning_inputs
from megatron_energy.runtime.control_plane.comms import RankComms
from megatron_energy.runtime.control_plane.group_chain import in_planning_replica, reduce_everywhere
from megatron_energy.runtime.cuda_timer import CudaEventTimer
from megatron_energy.runtime.energy_log.power_log import open_power_log
from megatron_energy.runtime.parts import Guard, PhaseSwitching
from megatron_energy.runtime.planning_round.cache import JobCache
from megatron_energy.runtime.planning_round.replanning import Replanner
from megatron_energy.runtime.profiling.kernel_timeline import KernelTimeline
from megatron_energy.runtime.profiling.power_cap_watch import PowerCapWatch
from megatron_energy.runtime.profiling.torch_recorder import TorchKernelTimeline, recorded_instances
from megatron_energy.runtime.running.phase_switcher import PhaseSwitcher
from megatron_energy.runtime.running.simulated_phases import SimulatedPhaseSwitcher
from megatron_energy.runtime.session import EnergySession
from megatron_energy.runtime.timing import InstructionTimer, SimulatedTimer

logger = logging.getLogger(__name__)

AUTO_GRID_POINTS = 6
"""Clocks in an automatic profiling grid."""

AUTO_GRID_LOWEST_FRACTION = 0.5
"""The automatic grid spans the top half of the clock range: lower clocks rarely pay off in training."""


class GridError(EnergyValueError):
    """The profiling grid does not fit the GPU."""


def profiling_grid(requested: Sequence[int] | None, supported: Sequence[int]) -> list[int]:
    """The clocks to profile, highest (stock) first.

    Args:
        requested: ``--energy-freq-grid`` (``None`` for auto).
        supported: The GPU's supported SM clocks.

    Returns:
        For auto, ``AUTO_GRID_POINTS`` clocks evenly spread over the top half of the range, always including
        the maximum; otherwise the requested clocks.

    Raises:
        GridError: A requested clock is not supported; the message lists the nearest supported ones.
    """
    ordered = sorted(set(supported), reverse=True)
    if requested is None:
        lowest = ordered[0] * AUTO_GRID_LOWEST_FRACTION
        usable = [clock for clock in ordered if clock >= lowest]
        step = max(1, (len(usable) - 1) // (AUTO_GRID_POINTS - 1))
        return usable[::step][:AUTO_GRID_POINTS]
    unsupported = [clock for clock in requested if clock not in ordered]
    if unsupported:
        nearest = {clock: min(ordered, key=lambda s: abs(s - clock)) for clock in unsupported}
        hint = ", ".join(f"{clock} -> {near}" for clock, near in nearest.items())
        raise GridError(
            f"--energy-freq-grid has clocks this GPU does not support (nearest supported: {hint}); "
            f"supported range {ordered[-1]}-{ordered[0]} MHz, or use --energy-freq-grid auto"
        )
    return sorted(requested, reverse=True)


def build_timer(
    handle: GpuHandle, context: JobContext, comms: RankComms, index: int, spec: GpuSpec
) -> InstructionTimer:
    """CUDA events on real GPUs; the virtual clock of the modelled transformer on simulated ones.

    A simulated GPU runs an instruction with clocks inside it as the modelled per-class split the session's
    phase planner uses (``pipeline.modelled_phases``, one layer: the session plans without a layer count), so
    the plan's phase offsets fall on the phases they were planned for.
    """
    if handle.backend != "simulated":
        return CudaEventTimer()
    if context.shape is None:
        raise ValueError(
            "simulated GPUs time instructions from a transformer shape; the job context has none"
        )
    work = instruction_work(context.shape, spec, context.pipeline_size, context.num_chunks, context.layers)
    pattern = layer_pattern(context.shape, spec)
    phases = {
        key: [phase.work for phase in modelled_phases(piece, 1, pattern)] for key, piece in work.items()
    }
    return SimulatedTimer(handle.gpus, index, work, comms, PipelineDag.build(context.orders), phases)


def require_even_layers(mode: str, plans_collectives: bool, layers: ChunkLayers | None) -> None:
    """Refuse to plan collectives on model chunks of unequal layer counts (an uneven pipeline split).

    The collective scheduler places each bucket's launch point at a layer of its chunk, with every chunk
    holding ``num_layers / (stages x chunks)`` layers; it does not know uneven chunks, so it would plan wrong
    launch points. The clock planners (``perseus``, ``kernel``) time every (stage, chunk) on its own and plan
    such jobs.

    Raises:
        EnergyValueError: When ``plans_collectives`` and ``layers`` are uneven, naming the mode, the counts
            and the way out.
    """
    if plans_collectives and layers is not None and not layers.is_even:
        raise EnergyValueError(
            f"--energy-mode {mode} plans collective launch points for model chunks of equal layer counts, "
            f"but this job's pipeline split (--pipeline-model-parallel-layout or an uneven-split flag) gives "
            f"uneven chunks (decoder layers {layers.describe()}); use --energy-mode perseus or kernel with "
            "it, or the same number of decoder layers in every chunk"
        )


def build_phase_switcher(
    config: EnergyConfig, controller: FrequencyController, timer: InstructionTimer, replayed: bool = False
) -> PhaseSwitching | None:
    """The phase switcher ``--energy-phase-switching`` asks for: virtual time when simulated, else a thread.

    A job whose steps replay a full-iteration CUDA graph (``replayed``) gets one in any case: every clock of
    its steps is requested by time (with the switching off, only the instruction clocks). Nothing starts
    here: the thread starts at the first request.
    """
    if config.phase_switching == "off" and not replayed:
        return None
    if isinstance(timer, SimulatedTimer):
        return SimulatedPhaseSwitcher(controller, timer)
    return PhaseSwitcher(controller, anchor_event=_blocking_anchor)


def _blocking_anchor() -> BoundaryEvent:
    """A blocking-sync CUDA event recorded on the current stream: a thread waiting on it sleeps in the driver.

    About 10 µs on the training thread, for instructions with phase clocks only.
    """
    import torch

    event = torch.cuda.Event(blocking=True)
    event.record()
    return event


FULL_ITERATION_LINE = (
    "[energy] full-iteration CUDA graph: steps replay without hooks, so every clock of a step is requested "
    "by a host thread at its offset from the replay's start (offsets measured on the previous replay by "
    "markers captured in the graph); collective launch points and NCCL SM budgets are fixed at capture and "
    "are not planned; no kernel timeline is recorded (replayed kernels carry no instruction ranges), so "
    "phases inside instructions are planned from the modelled per-class split"
)
"""What rank 0 says once when the job captures its training step as one CUDA graph."""


class SessionStartError(EnergyRuntimeError):
    """Another rank could not start its energy session, so no rank starts one."""


@dataclass
class _RankParts:
    """What one rank opened for its session before the ranks agree to start."""

    handle: GpuHandle
    spec: GpuSpec
    guard: Guard | None
    controller: FrequencyController
    grid: list[int]
    timer: InstructionTimer
    meter: EnergyMeter
    optimiser: Optimiser
    facts: JobFacts

    @property
    def can_set_clocks(self) -> bool:
        return self.handle.mode == "control"

    def close(self) -> None:
        """Release the controller and the clock guard (nothing was locked yet)."""
        self.controller.close()
        if self.guard is not None:
            self.guard.close()


def handle_lines(handle: GpuHandle, rank: int) -> list[str]:
    """What ``rank`` says of its GPUs at start.

    Its mode and why (every rank not in control, and rank 0), then, on rank 0, the handle's warning
    (``auto`` chose simulated GPUs: every figure modelled).
    """
    lines = []
    if handle.mode != "control" or rank == 0:
        lines.append(f"[energy] rank {rank}: {handle.mode} ({handle.reason})")
    if handle.warning is not None and rank == 0:
        lines.append(f"[energy] WARNING: {handle.warning}")
    return lines


def _open_parts(
    config: EnergyConfig,
    context: JobContext,
    comms: RankComms,
    handle: GpuHandle | None,
) -> _RankParts:
    """Open this rank's GPU, guard, controller, grid and timer; no collective."""
    index = context.local_device_index
    if handle is None:
        state = simulated_state_path(config.dir, context.global_rank)
        handle = open_gpus(
            config.backend, config.gpu_spec, config.dry_run, local_index=index, state_path=state
        )
    if handle.spec is None:
        raise ValueError(
            f"no GPU spec for {handle.gpus.get_name(index)}; pass --energy-gpu-spec with one of configs/gpus"
        )
    for line in handle_lines(handle, context.global_rank):
        logger.info(line)
    guard = None
    if handle.mode == "control":
        from megatron_energy.dvfs.guard import ClockGuard

        guard = ClockGuard(handle.gpus)
    controller = FrequencyController.from_handle(handle, index, guard=guard)
    try:
        grid = profiling_grid(config.freq_grid, supported_sm_clocks_mhz(handle.gpus, index))
        timer = build_timer(handle, context, comms, index, handle.spec)
        meter = EnergyMeter.from_handle(handle, [index])
        optimiser = resolve(config.mode)
        require_even_layers(config.mode, optimiser.request.collectives, context.layers)
    except BaseException:
        controller.close()
        if guard is not None:
            guard.close()
        raise
    facts = replace(
        context.job_facts(handle.spec.name),
        grid_mhz=tuple(grid),
        planning=planning_inputs(config, handle.spec),
    )
    return _RankParts(handle, handle.spec, guard, controller, grid, timer, meter, optimiser, facts)


def build_session(
    config: EnergyConfig,
    context: JobContext,
    comms: RankComms,
    *,
    handle: GpuHandle | None = None,
) -> EnergySession:
    """Open this rank's GPU and put its session together, or agree with every rank not to.

    Every rank first opens its own parts (GPU, clock guard, controller, grid, timer), which may fail on one
    rank only (a full disk, a GPU without spec, an unsupported clock). Before the session's first
    collective the ranks then agree in one small reduction over the job's groups
    (``runtime.control_plane.group_chain.reduce_everywhere``): if any rank failed, no rank starts a session
    (each raises; the failing rank its own error, the others :class:`SessionStartError`), so no rank waits
    in a collective the others never join. If any rank cannot set clocks (monitor-only: no permission, its
    GPU held by another job), every rank profiles like it, at stock clocks only, so all profile for the
    same number of steps and compute one job fingerprint.

    Args:
        config: The ``--energy-*`` configuration.
        context: This rank's job context.
        comms: Collectives over the job's process groups.
        handle: Already opened GPUs (tests, the demo); opened from the config when ``None``.

    Returns:
        The session, ready for schedule events.

    Raises:
        SessionStartError: Another rank could not start (its log says why).
        Exception: Whatever stopped this rank from opening its parts (``GridError`` for a requested
            profiling grid that does not fit the GPU, ``OSError``, ...), after the other ranks were told.
    """
    parts: _RankParts | None = None
    problem: Exception | None = None
    try:
        parts = _open_parts(config, context, comms, handle)
    except Exception as error:  # agreed on below, then raised
        problem = error
    controlled = parts is not None and parts.can_set_clocks
    failed_anywhere, uncontrolled_anywhere = reduce_everywhere(
        comms, [0.0 if parts is not None else 1.0, 0.0 if controlled else 1.0]
    )
    if parts is None:
        assert problem is not None
        raise problem
    if failed_anywhere:
        parts.close()
        raise SessionStartError("another rank could not start its energy session (its log says why)")
    can_set_clocks = controlled and not uncontrolled_anywhere
    if context.full_iteration_graph:
        log_single_rank(logger, context.global_rank, FULL_ITERATION_LINE)
    if controlled and not can_set_clocks:
        logger.info(
            f"[energy] rank {context.global_rank}: another rank cannot set its GPU clocks (its log says "
            "why); profiling at stock clocks only like it, the other clocks are modelled"
        )
    cache = JobCache(
        config.dir,
        replace(parts.facts, clock_control=can_set_clocks),
        replan=Replanner(config, context, parts.spec, parts.optimiser),
    )
    return EnergySession(
        config,
        context,
        optimiser=parts.optimiser,
        controller=parts.controller,
        meter=parts.meter,
        timer=parts.timer,
        comms=comms,
        clocks_mhz=parts.grid,
        can_set_clocks=can_set_clocks,
        cache=cache,
        spec=parts.spec,
        guard=parts.guard,
        kernel_timeline=build_kernel_timeline(parts.handle, parts.spec, parts.optimiser, context),
        phase_switcher=build_phase_switcher(
            config, parts.controller, parts.timer, replayed=context.full_iteration_graph
        ),
        power_cap=build_power_cap_watch(parts.handle, context.local_device_index, parts.grid[0], comms),
        power_log=open_power_log(config, parts.handle, context, JobFiles(cache.folder)),
    )


def build_power_cap_watch(
    handle: GpuHandle, index: int, stock_clock_mhz: int, comms: RankComms
) -> PowerCapWatch | None:
    """The power-cap check's reads of GPU ``index`` on a rank of the planning replica; ``None`` elsewhere.

    Where the clock-event reasons cannot be read, a watch that says why (once, on rank 0, after profiling).
    """
    if not in_planning_replica(comms):
        return None
    try:
        return PowerCapWatch(open_clock_events(handle.gpus, index), stock_clock_mhz)
    except ClockEventsUnavailableError as problem:
        return PowerCapWatch(None, stock_clock_mhz, str(problem))


def build_kernel_timeline(
    handle: GpuHandle, spec: GpuSpec, optimiser: Optimiser, context: JobContext
) -> KernelTimeline | None:
    """``torch.profiler`` kernel timelines on real GPUs when the optimiser asks for phases; else none.

    Replayed full-iteration CUDA graphs run no instruction ranges, so none is recorded there. Simulated GPUs
    run no kernels: the phase planner keeps the modelled per-class split there. It records one instance of
    each instruction class of this rank's stage (``torch_recorder.recorded_instances``). Kernels whose names
    do not say their compute class are priced as the job's layer GEMM class (bf16 without a shape).
    """
    if handle.backend == "simulated" or not optimiser.request.phases or context.full_iteration_graph:
        return None
    shape = context.shape
    instances = recorded_instances(context.orders.steps(context.pipeline_rank))
    return TorchKernelTimeline(
        spec, instances, KernelClass.GEMM_BF16 if shape is None else shape.layer_gemm_class
    )
