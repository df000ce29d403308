"""Iso-time energy saving of instruction-level vs phase-level clocks at several switch latencies (modelled).

For a job (``configs/examples/*.yaml``) and each switch latency: the stock iteration (every instruction at
its fastest clock), the Perseus plan at ``iso-time`` made executable under the latency (instruction level),
and that plan refined by the phase optimiser (``--energy-mode all``: phase level), all simulated from the
job's *modelled* profile (its GPU spec's time/power model, FLOP/byte counts of the model shape, the per-class
split of :mod:`megatron_energy.pipeline.modelled_phases`). Savings are against the stock iteration at the same
latency; every plan keeps the stock iteration time.

Each saving is printed as an energy change with its band (``optimisers.saving_band``: the plan priced again
over the GPU spec's declared ranges, moved to the sweep's own saving): ``-15.80 % (-9.60 to -21.79 %,
modelled)``.

Energy accounting of the iteration tail: the simulator charges a modelled tail (gradient sync, optimizer
step) at idle power, which no clock changes; here every column instead charges it by the same time/power
model at the clock in force (stock: the fastest; instruction level: the rank's last instruction's clock;
phase level: its phase clocks), so the three columns compare like with like.

``megatron-energy simulate --switch-latency-sweep`` and ``lab/bench_phases.py`` print these rows.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.interface import planning_job
from megatron_energy.optimisers.kernel.phase_optimiser import PhaseOptimiser
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.optimisers.saving_band import with_saving_band
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan
from megatron_energy.plan_band import SavingBand
from megatron_energy.plan_outcome import banded_text, run_band
from megatron_energy.target import EnergyTarget

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
"""The example jobs swept when none is named."""

UNITS_S: dict[str, float] = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
"""Duration units a latency may be written in."""

HEADER = (
    "| job | switch latency | stock J/iter (pipeline, modelled) | instruction level: energy vs stock "
    "(modelled, band) | phase level: energy vs stock (modelled, band) | time (modelled) |\n"
    "|---|---|---|---|---|---|"
)
"""The table's header (Markdown, as in the README)."""

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s)\s*$")


def parse_duration(text: str) -> float:
    """A positive duration with its unit (``10ms``, ``100us``, ``100µs``, ``0.01s``) in seconds.

    Raises:
        ValueError: If ``text`` has no unit, an unknown unit, or is not a positive finite number.
    """
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(
            f"{text.strip()!r} is not a duration: write a number and a unit (us, µs, ms or s), "
            "e.g. 10ms or 100us"
        )
    seconds = float(match.group(1)) * UNITS_S[match.group(2)]
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{text.strip()!r} must be a positive duration")
    return seconds


def parse_latencies(text: str) -> list[float]:
    """A comma-separated list of durations (:func:`parse_duration`) in seconds, in the given order.

    Raises:
        ValueError: If the list is empty or any entry is not a duration.
    """
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise ValueError("give at least one switch latency, e.g. 10ms,1ms,100us,10us")
    return [parse_duration(part) for part in parts]


def latencies_argument(text: str) -> list[float]:
    """:func:`parse_latencies` as an ``argparse`` type: a bad list is refused with its message."""
    try:
        return parse_latencies(text)
    except ValueError as problem:
        raise argparse.ArgumentTypeError(str(problem)) from None


def example_jobs(names: Sequence[str] = ()) -> list[JobConfig]:
    """The example jobs, by name (all when ``names`` is empty).

    Raises:
        ValueError: If a name is not an example job.
    """
    jobs = [JobConfig.load(path) for path in sorted(EXAMPLES.glob("*.yaml"))]
    unknown = sorted(set(names) - {job.name for job in jobs})
    if unknown:
        raise ValueError(f"no example job {unknown}; the examples are {[job.name for job in jobs]}")
    return [job for job in jobs if not names or job.name in names]


@dataclass(frozen=True)
class SweepRow:
    """One job at one switch latency (every figure modelled)."""

    job: str
    latency_s: float
    stock_j: float
    """Stock energy per iteration of one pipeline (tail charged at the fastest clock)."""
    instruction_saving: float
    """Relative saving of the executable Perseus plan at iso-time."""
    phase_saving: float
    """Relative saving of that plan refined by the phase optimiser."""
    time_change: float
    """The phase-level plan's iteration time against the stock iteration's, relative."""
    instruction_band: SavingBand | None = None
    """The Perseus plan's saving band (``optimisers.saving_band``) around ``-instruction_saving``."""
    phase_band: SavingBand | None = None
    """The phase-level plan's band around ``-phase_saving``."""

    def markdown(self) -> str:
        """The row as a Markdown table row under :data:`HEADER` (savings as changes with their band)."""
        return (
            f"| {self.job} | {format_latency(self.latency_s)} | {self.stock_j:,.0f} | "
            f"{banded_text(-self.instruction_saving, self.instruction_band)} | "
            f"{banded_text(-self.phase_saving, self.phase_band)} | {self.time_change:+.2%} |"
        )


def format_latency(seconds: float) -> str:
    """``10 ms`` or ``100 µs``."""
    return f"{seconds * 1e3:g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:g} µs"


def sweep_job(
    config: JobConfig, latencies: Sequence[float], clock_stride: int = 4, points: int = 8
) -> Iterator[SweepRow]:
    """Plan ``config`` at each latency and yield its row (see the module docstring).

    Args:
        config: The job.
        latencies: Switch latencies in seconds.
        clock_stride: Use every Nth clock of the GPU spec's grid.
        points: Frontier deadlines in the Perseus sweep.
    """
    spec = config.spec()
    model = GpuPowerModel(spec)
    clocks = spec.sm_clocks_mhz[::clock_stride]
    profile = Profile.synthetic(config.shape, spec, config.pipeline_stages, config.virtual_stages, clocks)
    layers = config.shape.num_layers // (config.pipeline_stages * config.virtual_stages)
    for latency_s in latencies:
        job = planning_job(
            config.orders(),
            config.fingerprint(),
            EnergyTarget("iso-time"),
            spec,
            shape=config.shape,
            switch_latency_s=latency_s,
            comm=config.comm_spec(spec),
            tail=config.iteration_tail(spec),
            layers_per_chunk=layers,
            frontier_points=points,
            kept_points=2,
        )
        instruction = with_saving_band(PerseusOptimiser().plan(profile, job), profile, job)
        phase = with_saving_band(PhaseOptimiser().plan(profile, job, base=instruction), profile, job)
        top = [max(clocks)] * config.pipeline_stages
        stock_j = instruction.baseline.energy_j + _tail_correction_j(config, profile, top, model)
        correction = _tail_correction_j(config, profile, _last_clocks(instruction), model)
        instruction_saving = 1 - (instruction.target_point.energy_j + correction) / stock_j
        phase_saving = 1 - (phase.target_point.energy_j + correction) / stock_j
        yield SweepRow(
            config.name,
            latency_s,
            stock_j,
            instruction_saving,
            phase_saving,
            phase.target_point.iteration_time_s / instruction.baseline.iteration_time_s - 1,
            run_band(instruction, -instruction_saving),
            run_band(phase, -phase_saving),
        )


def _last_clocks(plan: Plan) -> list[int]:
    """Each rank's last instruction clock in the plan's target point (the clock its tail runs at)."""
    return [list(plan.target_point.clock_table(stage).values())[-1] for stage in range(plan.num_stages)]


def _tail_correction_j(config: JobConfig, profile: Profile, clocks: list[int], model: GpuPowerModel) -> float:
    """Per iteration, all stages: the tail at the model's power at each rank's clock, less idle power."""
    tail = config.iteration_tail(model.spec)
    work = WorkProfile(0.0, tail.optimizer_s, tail.dp_sync_s)
    time_s = tail.dp_sync_s + tail.optimizer_s
    return sum(model.energy_j(work, clock) - profile.idle_power_w * time_s for clock in clocks)
