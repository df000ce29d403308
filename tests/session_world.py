"""Energy sessions in a gloo world over megatron-core's real pipeline schedule, for the end-to-end tests.

``run_world`` spawns one world (``megatron_harness.spawn_world``): every rank builds a pipeline stage of the
tiny GPT and its energy session the way the launcher does (the job context from megatron-core's parallel
state with the executed pipeline orders, ``session_factory.parallel_job_context``; the session from
``runtime.assembly.build_session``; the launcher-path hooks, ``megatron.hooks.install_hooks``), runs the
schedule step after step and reports what it saw. The simulated GPUs time every instruction with the work of
a real model's stage (GPT-3 1.3B by default), so every figure here is modelled.

Unlike the launcher, the worker drives the steps itself: it can throttle a replica's simulated GPUs between
two steps (a straggler) and read each step's figures from the session. With ``ddp`` the chunks are wrapped
in megatron-core's DDP, so its ``finalize_model_grads`` fires the ``all-grads-sync`` timer (``grad-sync``);
with ``optimizer_step`` each step is followed by an optimizer step inside Megatron's ``optimizer`` timer, as
``train_step`` runs it. The clock each outside phase's emulated work ran at is recorded
(``RankReport.outside_clocks``).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
from log_lines import capture_lines
from megatron_harness import PipelineWorld, spawn_world

from megatron_energy.config import EnergyConfig, PhaseSwitchingChoice, Planning
from megatron_energy.dvfs.emulation import Emulation
from megatron_energy.dvfs.simulated_nvml import SimulatedNvml
from megatron_energy.events import ListenerFanout
from megatron_energy.runtime.session_phase import SessionPhase
from megatron_energy.target import EnergyTarget

ASSUMED_H100 = str(Path(__file__).parent / "data" / "gpus" / "h100-sxm-assumed.yaml")
"""The h100-sxm spec as shipped before its calibration: for tests of mechanisms that need its behaviour."""


@dataclass(frozen=True)
class SessionSettings:
    """What one world runs."""

    pipeline_size: int = 4
    """Pipeline stages (one gloo process each, times the data-parallel size)."""

    data_parallel_size: int = 1
    """Data-parallel replicas of the pipeline."""

    num_microbatches: int = 8
    """Microbatches per iteration."""

    model: str = "gpt3-1.3b"
    """The real model whose stage work the simulated GPUs time (``TransformerShape.from_name``)."""

    gpu_spec: str = "h100-sxm"
    """The simulated GPU."""

    target: EnergyTarget = field(default_factory=lambda: EnergyTarget("iso-time"))
    """The planning target."""

    profile_iters: int = 2
    """Measured steps per profiled clock."""

    freq_grid: tuple[int, ...] | None = None
    """Profiled clocks; ``None`` for the automatic grid."""

    run_steps: int = 10
    """Steps run after profiling and planning (with the plan, or at stock clocks when planning failed)."""

    log_interval: int = 5
    """Steps between energy log lines."""

    energy_dir: Path = Path("energy")
    """Where the cache, plan, plot and trace go."""

    throttle: tuple[int, int, int, int] | None = None
    """Straggler injection ``(replica, first step, last step, clock ceiling MHz)``: that replica's simulated
    GPUs are thermally throttled during those steps."""

    safety_tolerance: float = 0.05
    """``--energy-safety-tolerance``."""

    dry_run: bool = False
    """``--energy-dry-run``: the controller records the clocks and sets none."""

    emulation: Emulation | None = None
    """How the simulated GPUs depart from exact (counter noise, hidden energies, work between schedules);
    each rank's GPUs draw their own noise (the seed plus the rank)."""

    mode: str = "perseus"
    """``--energy-mode``."""

    megatron_args: tuple[tuple[str, Any], ...] = ()
    """Megatron arguments the job's collectives are read from (``megatron.collective_setup``), besides the
    parallel sizes; e.g. ``(("use_distributed_optimizer", True), ("overlap_grad_reduce", True))``."""

    ddp: bool = False
    """Wrap the chunks in megatron-core's DDP (``finalize_model_grads``: the ``grad-sync`` hook)."""

    optimizer_step: bool = False
    """Run an optimizer step inside Megatron's ``optimizer`` timer after each schedule."""

    phase_switching: PhaseSwitchingChoice = "auto"
    """``--energy-phase-switching``."""

    planning: Planning = "auto"
    """``--energy-planning`` (``auto`` waits for the planner on simulated GPUs)."""

    virtual_size: int | None = None
    """Model chunks per rank (interleaved schedule); ``None`` for plain 1F1B."""

    combined: bool = False
    """``--overlap-moe-expert-parallel-comm``: megatron-core's combined 1F1B schedule, its layer-wise step
    replaced by ``combined_1f1b_world``'s CPU stand-in (the launcher's hooks wrap that stand-in)."""

    sys_path: tuple[Path, ...] = ()
    """Folders put first on every rank's ``sys.path`` (a plugin optimiser's, ``plugin_site``)."""

    log_file: Path | None = None
    """``--energy-log-file``."""

    nvml_refusing_ranks: tuple[int, ...] = ()
    """Ranks whose simulated GPUs' NVML refuses the clock-event reasons call as a driver without it does
    (``NVMLError_FunctionNotFound``): a mock at the NVML boundary, ``DriverWithoutReasons``."""

    def energy_config(self) -> EnergyConfig:
        """The ``--energy-*`` configuration every rank's session gets."""
        return EnergyConfig(
            optimise=True,
            mode=self.mode,
            target=self.target,
            backend="simulated",
            gpu_spec=self.gpu_spec,
            dir=self.energy_dir,
            profile_iters=self.profile_iters,
            freq_grid=self.freq_grid,
            safety_tolerance=self.safety_tolerance,
            dry_run=self.dry_run,
            phase_switching=self.phase_switching,
            planning=self.planning,
            log_file=self.log_file,
        )


@dataclass(frozen=True)
class StepReport:
    """One step on one rank (modelled)."""

    step: int
    phase: str
    iteration_s: float
    energy_j: float
    exact_energy_j: float
    """The simulated GPU's exact modelled energy over the step (from the previous step's end), whatever its
    energy counter showed."""
    wall_s: float = 0.0
    """The step's host wall time on this rank (measured, ``perf_counter``), the session's hooks included."""


@dataclass(frozen=True)
class RankReport:
    """Everything one rank saw."""

    rank: int
    stage: int
    replica: int
    steps: tuple[StepReport, ...]
    lines: tuple[str, ...]
    losses: tuple[float, ...]
    stock_time_s: float | None
    """Iteration time at stock clocks measured while profiling (the slowest rank's; modelled)."""
    stock_energy_j: float | None
    """This rank's energy per iteration at stock clocks measured while profiling."""
    stock_steps: int = 0
    """Stock-clock steps the baseline measured (``runtime.profiling.baseline_length``)."""
    scalars: tuple[tuple[str, float, int], ...] = ()
    """What this rank's metric writer got: ``(name, value, iteration)`` (Megatron's TensorBoard and W&B
    writers live on the last rank only; here every rank has one)."""
    outside_clocks: tuple[tuple[int, str, str, int], ...] = ()
    """``(step, session phase, outside phase, SM clock in effect when its emulated work finished)``."""
    instructions: tuple[tuple[int, str, str, int, float, float | None], ...] = ()
    """``(step, session phase, kind, microbatch, duration_s, energy_j)`` of every instruction this rank ran
    (the simulated timer's samples; the energy ``None`` when the emulation hides it)."""


def session_worker(rank: int, world_size: int, settings: SessionSettings) -> RankReport:
    """One rank: a pipeline stage of the tiny GPT with its energy session, run for the whole job."""
    from megatron.training import global_vars

    from megatron_energy.megatron.collective_setup import collective_setup
    from megatron_energy.megatron.hooks import install_hooks
    from megatron_energy.megatron.session_factory import parallel_job_context
    from megatron_energy.pipeline.workload import TransformerShape
    from megatron_energy.runtime.assembly import build_session

    sys.path[:0] = [str(folder) for folder in settings.sys_path]
    if settings.ddp:
        from ddp_world import DdpWorld

        ddp_world = DdpWorld(settings.pipeline_size, bucket_size=None)
        world, run_schedule = ddp_world.world, ddp_world.run
    else:
        world = PipelineWorld(settings.pipeline_size, settings.virtual_size)
        run_schedule = world.run
    if settings.combined:
        from combined_1f1b_world import use_cpu_combined_step

        use_cpu_combined_step(world)
    scalars: list[tuple[str, float, int]] = []
    args = SimpleNamespace(tensor_model_parallel_size=1, pipeline_model_parallel_size=settings.pipeline_size)
    args.__dict__.update(settings.megatron_args)
    context, comms = parallel_job_context(
        shape=TransformerShape.from_name(settings.model),
        num_microbatches=settings.num_microbatches,
        combined=settings.combined,
        log_interval=settings.log_interval,
        log_sinks=(lambda name, value, iteration: scalars.append((name, value, iteration)),),
        collectives=collective_setup(args, settings.data_parallel_size, ranks_per_node=world_size),
    )
    lines = capture_lines()

    config = settings.energy_config()
    handle = None
    if settings.emulation is not None or rank in settings.nvml_refusing_ranks:
        from dataclasses import replace

        from megatron_energy.dvfs.backends import open_gpus

        emulation = settings.emulation
        handle = open_gpus(
            "simulated",
            settings.gpu_spec,
            settings.dry_run,
            local_index=context.local_device_index,
            state_path=Path(config.dir) / "simulated" / f"rank{rank}.json",
            emulation=None if emulation is None else replace(emulation, seed=emulation.seed + rank),
        )
        if rank in settings.nvml_refusing_ranks:
            handle.gpus.nvml = DriverWithoutReasons(handle.gpus)  # type: ignore[attr-defined]
    session = build_session(config, context, comms, handle=handle)
    probe = OutsideClockProbe(session, context.local_device_index)
    installation = install_hooks(
        ListenerFanout([session, probe]),
        num_microbatches_fn=lambda: settings.num_microbatches,
        combined=settings.combined,
    )
    world.config.timers = global_vars.Timers(0, "minmax")
    gpu = session.meter.gpus.state(context.local_device_index)
    steps: list[StepReport] = []
    instructions: list[tuple[int, str, str, int, float, float | None]] = []
    losses: list[float] = []
    step = 0
    try:
        stock = (SessionPhase.PROFILING, SessionPhase.PLANNING)
        while sum(report.phase not in stock for report in steps) < settings.run_steps:
            _apply_throttle(session, settings, context.data_parallel_rank, context.local_device_index, step)
            phase, exact_before_mj = session.phase, gpu.energy_mj
            began_s = time.perf_counter()
            losses += run_schedule(settings.num_microbatches, seed=step)
            if settings.optimizer_step:
                _optimizer_step(world)
            world.zero_grads()
            wall_s = time.perf_counter() - began_s
            figures = session.history[-1]
            exact_j = (gpu.energy_mj - exact_before_mj) / 1000
            steps.append(StepReport(step, phase, figures.iteration_s, figures.energy_j, exact_j, wall_s))
            instructions += [
                (step, phase, s.instruction.kind, s.instruction.microbatch, s.duration_s, s.energy_j)
                for s in figures.timing.samples
            ]
            step += 1
    finally:
        installation.uninstall()
        session.close()
    return RankReport(
        rank=rank,
        stage=context.pipeline_rank,
        replica=context.data_parallel_rank,
        steps=tuple(steps),
        lines=tuple(lines),
        losses=tuple(losses),
        stock_time_s=session.baseline.iteration_s,
        stock_energy_j=session.baseline.energy_by_rank.get(rank),
        stock_steps=session.baseline.steps,
        scalars=tuple(scalars),
        outside_clocks=tuple(probe.clocks),
        instructions=tuple(instructions),
    )


class DriverWithoutReasons(SimulatedNvml):
    """The simulated GPUs' NVML reads, but for a driver that lacks the clock-event reasons call."""

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:  # noqa: N802 - NVML's name
        """Refuse as ``pynvml`` does when the driver has no such function."""
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


class OutsideClockProbe:
    """Notes the SM clock each outside phase's emulated work ran at (after the session, in a fanout).

    The simulated timer runs the optimizer step when its hook ends, and the gradient sync after the step's
    pipeline span (at the step's end), so the clock is read at those events.
    """

    def __init__(self, session: Any, device: int) -> None:
        self.session = session
        self.device = device
        self.step = 0
        self.synced = False
        self.clocks: list[tuple[int, str, str, int]] = []

    def _note(self, name: str) -> None:
        clock = self.session.meter.gpus.current_clock_mhz(self.device)
        self.clocks.append((self.step, self.session.phase, name, clock))

    def on_step_begin(self, step: int) -> None:
        self.step = step

    def on_step_end(self, step: int) -> None:
        if self.synced:
            self.synced = False
            self._note("grad-sync")

    def on_outside_begin(self, name: str) -> None:
        pass

    def on_outside_end(self, name: str) -> None:
        if name == "grad-sync":
            self.synced = True
        else:
            self._note(name)

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        pass

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        pass

    def on_p2p_begin(self, op: str) -> None:
        pass

    def on_p2p_end(self, op: str) -> None:
        pass


def _optimizer_step(world: Any) -> None:
    """An SGD step of this rank's parameters inside Megatron's ``optimizer`` timer, as ``train_step`` does."""
    import torch

    timers = world.config.timers
    timers("optimizer", log_level=1).start(barrier=False)
    parameters = [p for chunk in world.chunks for p in chunk.parameters()]
    with torch.no_grad():
        for parameter in parameters:
            grad = getattr(parameter, "main_grad", None)
            if grad is None:
                grad = parameter.grad
            if grad is not None:
                parameter.add_(grad, alpha=-1e-4)
    timers("optimizer").stop(barrier=False)


def _apply_throttle(session: Any, settings: SessionSettings, replica: int, device: int, step: int) -> None:
    if settings.throttle is None:
        return
    throttled, first, last, ceiling = settings.throttle
    if replica == throttled:
        session.meter.gpus.throttle(device, ceiling if first <= step <= last else None)


@dataclass(frozen=True)
class JobSummary:
    """Stock-clock profiling steps against planned steps, whole job (modelled)."""

    stock_iteration_s: float
    planned_iteration_s: float
    stock_energy_j: float
    planned_energy_j: float

    @property
    def saving(self) -> float:
        """Relative energy saved per iteration."""
        return 1.0 - self.planned_energy_j / self.stock_energy_j


def summarise(reports: list[RankReport]) -> JobSummary:
    """Whole-job energy per iteration and iteration time: stock clocks (profiling) against the plan.

    Planned figures are medians over the steps every rank ran with the target plan.
    """
    planned = sorted({s.step for s in reports[0].steps if s.phase == "planned"})
    stock_times = [r.stock_time_s for r in reports if r.stock_time_s is not None]
    stock_energies = [r.stock_energy_j for r in reports if r.stock_energy_j is not None]
    if not planned or len(stock_times) < len(reports) or len(stock_energies) < len(reports):
        raise ValueError("the world ran no planned step or has no stock baseline; raise run_steps")
    times = [max(s.iteration_s for r in reports for s in r.steps if s.step == step) for step in planned]
    energies = [sum(s.energy_j for r in reports for s in r.steps if s.step == step) for step in planned]
    return JobSummary(
        stock_iteration_s=max(stock_times),
        planned_iteration_s=statistics.median(times),
        stock_energy_j=sum(stock_energies),
        planned_energy_j=statistics.median(energies),
    )


def run_world(settings: SessionSettings, result_dir: Path) -> list[RankReport]:
    """Spawn the gloo world and run ``session_worker`` on every rank.

    Args:
        settings: What to run.
        result_dir: An empty folder for the ranks' results.

    Returns:
        Every rank's report, by rank.
    """
    world_size = settings.pipeline_size * settings.data_parallel_size
    return spawn_world(session_worker, world_size, result_dir, payload=settings)
