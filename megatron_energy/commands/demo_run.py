"""``megatron-energy demo``: the whole profile → plan → run loop on real megatron-core schedules, no GPU.

A tiny GPT runs megatron-core's real pipeline schedule over gloo (PP=4 by default, one process per stage);
the launcher path's hooks (timers proxy + traced P2P communicator) feed one ``EnergySession`` per rank, whose
simulated GPUs time every instruction on a virtual clock with the work of a real model's stage (GPT-3 XL by
default) from the time/power model. Everything the demo reports is therefore *modelled*.

The CPU workarounds megatron-core needs (CUDA-only allocations in the schedule) live in the test harness,
``tests/megatron_harness.py``, never in the package; the demo runs from a source checkout and uses it.
"""

from __future__ import annotations

import importlib
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_energy.config import EnergyConfig, EnergyTarget

HARNESS = Path(__file__).resolve().parents[2] / "tests" / "megatron_harness.py"


@dataclass(frozen=True)
class DemoSettings:
    """What the demo runs."""

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
    """Steps run with the plan after profiling."""

    log_interval: int = 5
    """Steps between energy log lines."""

    energy_dir: Path = Path("energy")
    """Where the cache, plan, plot and trace go."""

    throttle: tuple[int, int, int, int] | None = None
    """Straggler injection ``(replica, first step, last step, clock ceiling MHz)``: that replica's simulated
    GPUs are thermally throttled during those steps."""

    safety_tolerance: float = 0.05
    """``--energy-safety-tolerance``."""

    progress: bool = True
    """Show a progress bar while profiling."""

    def energy_config(self) -> EnergyConfig:
        """The ``--energy-*`` configuration every rank's session gets."""
        return EnergyConfig(
            optimise=True,
            target=self.target,
            backend="simulated",
            gpu_spec=self.gpu_spec,
            dir=self.energy_dir,
            profile_iters=self.profile_iters,
            freq_grid=self.freq_grid,
            safety_tolerance=self.safety_tolerance,
        )


@dataclass(frozen=True)
class StepReport:
    """One step on one rank (modelled)."""

    step: int
    phase: str
    iteration_s: float
    energy_j: float


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
    """Iteration time at stock clocks measured while profiling (modelled on simulated GPUs)."""
    stock_energy_j: float | None
    """This rank's energy per iteration at stock clocks measured while profiling."""


def load_harness() -> Any:
    """Import ``tests/megatron_harness.py`` from the source checkout.

    Raises:
        RuntimeError: The package is not running from a source checkout.
    """
    if not HARNESS.exists():
        raise RuntimeError(
            f"the demo runs megatron-core on CPU through the test harness {HARNESS}, which is not here; "
            "run it from a source checkout of megatron_energy (git clone, then bash scripts/setup.sh)"
        )
    if str(HARNESS.parent) not in sys.path:
        sys.path.insert(0, str(HARNESS.parent))
    return importlib.import_module("megatron_harness")


def demo_worker(rank: int, world_size: int, settings: DemoSettings) -> RankReport:
    """One rank of the demo: a pipeline stage of the tiny GPT with its energy session."""
    from megatron.core import parallel_state
    from megatron.training import global_vars

    from megatron_energy.megatron.hooks import install_hooks
    from megatron_energy.megatron.schedule import pipeline_orders
    from megatron_energy.pipeline.profile import TransformerShape
    from megatron_energy.runtime.assembly import build_session
    from megatron_energy.runtime.comms import TorchComms
    from megatron_energy.runtime.context import JobContext

    harness = load_harness()
    world = harness.PipelineWorld(settings.pipeline_size)
    context = JobContext(
        pipeline_rank=parallel_state.get_pipeline_model_parallel_rank(),
        orders=pipeline_orders(settings.pipeline_size, settings.num_microbatches),
        data_parallel_rank=parallel_state.get_data_parallel_rank(),
        data_parallel_size=parallel_state.get_data_parallel_world_size(),
        shape=TransformerShape.from_name(settings.model),
        global_rank=rank,
        world_size=world_size,
        log_interval=settings.log_interval,
    )
    lines: list[str] = []

    def printer(line: str) -> None:
        lines.append(line)
        if rank == 0 or "straggler" in line or "safety" in line:
            print(line, flush=True)

    comms = TorchComms(parallel_state.get_pipeline_model_parallel_group(), device="cpu")
    session = build_session(settings.energy_config(), context, comms, printer=printer)
    installation = install_hooks(session, num_microbatches_fn=lambda: settings.num_microbatches)
    world.config.timers = global_vars.Timers(0, "minmax")
    profiling = 0 if session.phase != "profiling" else session.collector.steps_needed
    steps, losses = [], []
    progress = _progress(settings, rank, profiling)
    try:
        for step in range(profiling + settings.run_steps):
            _apply_throttle(session, settings, context, step)
            phase = session.phase
            losses += world.run(settings.num_microbatches, seed=step)
            world.zero_grads()
            figures = session.history[-1]
            steps.append(StepReport(step, phase, figures.iteration_s, figures.energy_j))
            if progress is not None and step < profiling:
                progress.advance(0)
    finally:
        if progress is not None:
            progress.stop()
        installation.uninstall()
        session.close()
    baseline = session.baseline
    return RankReport(
        rank=rank,
        stage=context.pipeline_rank,
        replica=context.data_parallel_rank,
        steps=tuple(steps),
        lines=tuple(lines),
        losses=tuple(losses),
        stock_time_s=baseline.iteration_s,
        stock_energy_j=baseline.energy_by_rank.get(rank),
    )


def _apply_throttle(session: Any, settings: DemoSettings, context: Any, step: int) -> None:
    if settings.throttle is None:
        return
    replica, first, last, ceiling = settings.throttle
    if context.data_parallel_rank == replica:
        gpus = session.meter.gpus
        gpus.throttle(context.local_device_index, ceiling if first <= step <= last else None)


def _progress(settings: DemoSettings, rank: int, profiling_steps: int) -> Any:
    if rank != 0 or not settings.progress or profiling_steps == 0:
        return None
    from rich.progress import Progress

    progress = Progress(transient=True)
    progress.start()
    progress.add_task("profiling clocks (simulated GPUs, modelled)", total=profiling_steps)
    return progress


@dataclass(frozen=True)
class DemoSummary:
    """Stock-clock profiling steps against planned steps, whole job (modelled)."""

    stock_iteration_s: float
    planned_iteration_s: float
    stock_energy_j: float
    planned_energy_j: float

    @property
    def saving(self) -> float:
        """Relative energy saved per iteration."""
        return 1.0 - self.planned_energy_j / self.stock_energy_j

    @property
    def slowdown(self) -> float:
        """Relative change of the iteration time."""
        return self.planned_iteration_s / self.stock_iteration_s - 1.0


def summarise(reports: list[RankReport]) -> DemoSummary:
    """Whole-job energy per iteration and iteration time: stock clocks (profiling) against the plan.

    Planned figures are medians over the steps every rank ran with the target plan.
    """
    planned = sorted({s.step for s in reports[0].steps if s.phase == "planned"})
    if not planned or any(r.stock_energy_j is None or r.stock_time_s is None for r in reports):
        raise ValueError("the demo ran no planned step or has no stock baseline; raise run_steps")
    times = [max(s.iteration_s for r in reports for s in r.steps if s.step == step) for step in planned]
    energies = [sum(s.energy_j for r in reports for s in r.steps if s.step == step) for step in planned]
    return DemoSummary(
        stock_iteration_s=max(r.stock_time_s for r in reports),  # type: ignore[type-var]
        planned_iteration_s=statistics.median(times),
        stock_energy_j=sum(r.stock_energy_j for r in reports),  # type: ignore[misc]
        planned_energy_j=statistics.median(energies),
    )


def run_demo(settings: DemoSettings, result_dir: Path) -> list[RankReport]:
    """Spawn the gloo world and run the demo on every rank.

    Args:
        settings: What to run.
        result_dir: An empty folder for the ranks' results.

    Returns:
        Every rank's report, by rank.
    """
    harness = load_harness()
    world_size = settings.pipeline_size * settings.data_parallel_size
    return harness.spawn_world(demo_worker, world_size, result_dir, payload=settings)
