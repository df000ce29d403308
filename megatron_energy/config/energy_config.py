"""``EnergyConfig``: everything the ``--energy-*`` flags set, each field declaring its own flag.

Each field carries its :class:`~megatron_energy.config.flag.EnergyFlag` in its ``metadata`` (spellings, how
its text is read, the rule its value obeys, its help text). ``ENERGY_FLAGS`` is read from the fields, so the
flags, their ``--help``, the docs' flag reference and the config's checks have one definition.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from megatron_energy.config.checks import (
    block_problem,
    clock_grid_problem,
    fraction_problem,
    grid_intensity_problem,
    power_floor_problem,
    power_target_problem,
    sample_period_problem,
    smooth_target_problem,
    whole_number_problem,
)
from megatron_energy.config.flag import FLAG, EnergyFlag, flag_dest
from megatron_energy.config.values import known_gpu_spec, parse_freq_grid
from megatron_energy.dvfs.spec import available_gpu_specs, load_gpu_spec
from megatron_energy.errors import EnergyValueError
from megatron_energy.log import LOG_LEVELS, LOG_RANKS, LogLevel, LogRanks
from megatron_energy.optimisers.registry import mode_problem
from megatron_energy.target import EnergyTarget, parse_target

Backend = Literal["auto", "zeus", "simulated"]

BACKENDS: tuple[str, ...] = ("auto", "zeus", "simulated")
PhaseSwitchingChoice = Literal["auto", "off"]
PHASE_SWITCHING: tuple[str, ...] = ("auto", "off")
"""Choices of ``--energy-phase-switching``."""
MemoryClockChoice = Literal["auto", "off"]
MEMORY_CLOCK: tuple[str, ...] = ("auto", "off")
"""Choices of ``--energy-memory-clock``."""
PowerTraceChoice = Literal["off", "jsonl", "csv"]
POWER_TRACE: tuple[str, ...] = ("off", "jsonl", "csv")
"""Choices of ``--energy-power-trace``."""
Planning = Literal["auto", "background", "wait"]
PLANNING: tuple[str, ...] = ("auto", "background", "wait")
"""Choices of ``--energy-planning``."""


class EnergyConfigError(EnergyValueError):
    """An ``EnergyConfig`` with a value no flag would accept; the message names the field and the fix."""

    def __init__(self, *problems: str) -> None:
        """Name every problem found.

        Args:
            problems: What is wrong and what to give instead, one per problem: the fields' in field order,
                then the planning rules'.
        """
        super().__init__(*problems)
        self.problems = problems
        """The problems, as given."""

    def __str__(self) -> str:
        return "EnergyConfig: " + "; ".join(self.problems)


@dataclass(frozen=True)
class EnergyConfig:
    """Everything the ``--energy-*`` flags set; one field per flag (field ``dry_run``: ``--energy-dry-run``).

    Each field's ``help`` (in its ``metadata``, ``flag.EnergyFlag``) documents it and is the one text of its
    flag: ``--help`` shows it and the documentation's flag reference is generated from it, so the two cannot
    drift. The defaults are the flags' defaults.
    """

    optimise: bool = field(
        default=False,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-optimise", "--energy-optimize"),
                switch=True,
                needs_optimise=False,
                help="""Profile, plan and apply per-instruction GPU clocks that save energy at the target
                speed.""",
            )
        },
    )

    mode: str = field(
        default="perseus",
        metadata={
            FLAG: EnergyFlag(
                ("--energy-mode",),
                metavar="{perseus,kareus,kernel,all,PLUGIN}",
                help="""Optimiser: ``perseus`` (a clock per pipeline instruction), ``kareus`` (the launch
                point and CTA budget of every collective class, jointly with the clock; alone at stock
                clocks), ``kernel`` (a clock per phase of kernels inside and outside instructions, under the
                switch latency), ``all`` (the three composed: Perseus's clocks, then Kareus's collectives on
                them, then phase clocks), or the name of an optimiser an installed plugin package declares
                (``megatron_energy.optimisers.registry``). ``kareus`` and ``all`` plan from the job's
                collective workload, read from Megatron's arguments and its DDP buckets.""",
            )
        },
    )

    target: EnergyTarget = field(
        default=EnergyTarget("iso-time"),
        metadata={
            FLAG: EnergyFlag(
                ("--energy-target",),
                parse=parse_target,
                metavar="iso-time|min-energy|slowdown:X|power:W[,peak:P]|smooth:KEY=VALUE,...",
                help="""Where on the time–energy frontier to land: ``iso-time`` (no slower than stock clocks),
                ``min-energy``, ``slowdown:X`` with 0 < X < 1, or ``power:W[,peak:P]``: the fastest frontier
                point whose predicted average power per GPU is at most W watts (and no instruction above P). A
                power budget below the GPU spec's idle power is refused while the flags are parsed; one below
                what the slowest point draws is rejected with the lowest reachable power: before profiling
                where the spec's model is the GPU (simulated GPUs), else once, on rank 0, after profiling,
                keeping the verified profile so that a retry with another budget re-plans without profiling;
                ``kareus`` and ``kernel`` alone (which keep stock clocks) refuse one. The log then shows the
                measured power per GPU against the budget with its 95 % interval, and a sustained overshoot
                reverts to stock clocks like a slowdown. ``smooth:floor=F,ramp=R,job-ramp=J@N[,slowdown=X]``
                (any of the three bounds) bounds the power swing at 20 ms bins: no GPU below F times the peak,
                no ramp above R W/s per GPU or J W/s for the job of N GPUs in phase, at the least energy
                within iso-time (or the slowdown), filler included where the clocks alone do not meet it
                (``perseus`` or ``all``; the filler is modelled, not executed).""",
            )
        },
    )

    backend: Backend = field(
        default="auto",
        metadata={
            FLAG: EnergyFlag(
                ("--energy-backend",),
                choices=BACKENDS,
                help="""GPU backend: ``zeus`` (real GPUs through NVML, amdsmi or zeusd), ``simulated`` (GPUs
                driven by the time/power model of ``--energy-gpu-spec``), or ``auto`` (real GPUs when there
                are any, else simulated ones, with a warning at start that every figure is modelled; refused
                where CUDA sees GPUs that NVML cannot open).""",
            )
        },
    )

    gpu_spec: str | None = field(
        default=None,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-gpu-spec",),
                parse=known_gpu_spec,
                metavar="NAME",
                known=available_gpu_specs,
                help="""The GPU the simulated backend models: a name of ``configs/gpus/NAME.yaml`` or the path
                of a spec YAML file (e.g. one ``megatron-energy calibrate`` wrote).""",
            )
        },
    )

    dry_run: bool = field(
        default=False,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-dry-run",),
                switch=True,
                help="""Record the clocks that would be set, never change GPU settings (shared machines); only
                the stock clock is measured and the rest of the grid is extrapolated with the model, so the
                plan is labelled modelled.""",
            )
        },
    )

    dir: Path = field(
        default=Path("energy"),
        metadata={
            FLAG: EnergyFlag(
                ("--energy-dir",),
                metavar="PATH",
                path=True,
                needs_optimise=False,
                help="""Where profiles, plans, frontiers, reports and traces go, keyed by the job's
                fingerprint (a rerun of the same job finds its plan there and skips profiling).""",
            )
        },
    )

    profile_iters: int = field(
        default=2,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-profile-iters",),
                parse=int,
                check=whole_number_problem,
                metavar="N",
                help="""Training steps measured at each profiled clock, after one settling step; the stock
                clock also measures its baseline, at least 4 steps and as many as resolving a 1 % change
                needs, at most 20 steps and 60 s for the stock clock in all
                (``runtime.profiling.baseline_length``).""",
            )
        },
    )

    freq_grid: tuple[int, ...] | None = field(
        default=None,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-freq-grid",),
                parse=parse_freq_grid,
                check=clock_grid_problem,
                metavar="MHZ,MHZ,...|auto",
                unset="auto",
                help="""SM clocks to profile, in MHz, comma-separated, or ``auto`` (spread over the top half
                of the GPU's supported clocks).""",
            )
        },
    )

    trace: Path | None = field(
        default=None,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-trace",),
                metavar="FILE",
                path=True,
                needs_optimise=False,
                help="""Write every observed schedule event as one JSON line to this file (``FILE.rankN`` per
                rank when the world size is above 1).""",
            )
        },
    )

    log_file: Path | None = field(
        default=None,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-log-file",),
                metavar="FILE",
                path=True,
                help="""Also write each ``[energy]`` log line's figures (iteration, phase, source, scalars) as
                one JSON object per line to this file (rank 0, appended).""",
            )
        },
    )

    grid_gco2_per_kwh: float | None = field(
        default=None,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-grid-gco2-per-kwh",),
                parse=float,
                check=grid_intensity_problem,
                metavar="G",
                help="""The electricity grid's carbon intensity in grams of CO2 per kWh: the run's totals at
                its end (``runtime.energy_log.run_totals``) then also state its CO2 in kg, and the saving's
                (GPU energy only; the grid's figure is the user's). Unset: no CO2 figure.""",
            )
        },
    )

    safety_tolerance: float = field(
        default=0.05,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-safety-tolerance",),
                parse=float,
                check=fraction_problem,
                metavar="X",
                help="""Relative slowdown over the target that counts as a violation (a step must also be
                slower than the target by 2 standard deviations of the measured stock steps, so a noisy
                machine's swings do not trip it).""",
            )
        },
    )

    safety_steps: int = field(
        default=3,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-safety-steps",),
                parse=int,
                check=whole_number_problem,
                metavar="N",
                help="""Consecutive violating steps after which clocks revert to stock; after such a revert,
                as many slow stock steps (the slowdown came from outside the plan) then as many at their own
                pace run the plan again, at most twice a run.""",
            )
        },
    )

    overhead_check: int = field(
        default=0,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-overhead-check",),
                parse=int,
                check=block_problem,
                metavar="N",
                help="""Once the plan runs, alternate blocks of N iterations with the plugin suspended (stock
                clocks, its hooks idle) and active, and log the measured change in iteration time and energy
                with its 95 % interval at the end (0: off). It measures the training-thread hooks' cost only:
                the background threads run in both kinds of block, so compare against Megatron itself with
                ``lab/bench_overhead.py``.""",
            )
        },
    )

    phase_switching: PhaseSwitchingChoice = field(
        default="auto",
        metadata={
            FLAG: EnergyFlag(
                ("--energy-phase-switching",),
                choices=PHASE_SWITCHING,
                help="""Clocks of phases inside instructions (``--energy-mode kernel`` or ``all``): ``auto``
                requests each at its planned offset from the instruction's start on the GPU, from a background
                thread (``runtime.running.phase_switcher``); ``off`` keeps every instruction at its own clock
                (the plan's phase saving there is then not realised).""",
            )
        },
    )

    memory_clock: MemoryClockChoice = field(
        default="auto",
        metadata={
            FLAG: EnergyFlag(
                ("--energy-memory-clock",),
                choices=MEMORY_CLOCK,
                help="""The memory clock as a lever: ``auto`` lets the plan lower a rank's memory clock for
                the whole run phase where the GPU offers more than one and that saves energy without slowing
                any point of the plan (modelled; ``optimisers.memory_clock``), set like the SM clocks and
                restored at exit; ``off`` keeps every rank at the stock memory clock.""",
            )
        },
    )

    planning: Planning = field(
        default="auto",
        metadata={
            FLAG: EnergyFlag(
                ("--energy-planning",),
                choices=PLANNING,
                help="""``background`` computes the plan in a separate process while training goes on at stock
                clocks, and every rank adopts it at the first step end after it is ready
                (``runtime.planning_round.planner_process``); ``wait`` has training wait for that process at
                the step profiling ends; ``auto``: background on real GPUs, wait on simulated ones (their
                virtual clock stands still while the host plans, so waiting keeps runs deterministic).""",
            )
        },
    )

    log_level: LogLevel = field(
        default="info",
        metadata={
            FLAG: EnergyFlag(
                ("--energy-log-level",),
                choices=LOG_LEVELS,
                help="""The least severe messages the plugin logs (its ``megatron_energy`` loggers, one per
                module; ``megatron_energy.log``): ``warning`` keeps only what went wrong, ``debug`` adds
                detail.""",
            )
        },
    )

    log_ranks: LogRanks = field(
        default="0",
        metadata={
            FLAG: EnergyFlag(
                ("--energy-log-ranks",),
                choices=LOG_RANKS,
                help="""Which ranks print the messages every rank would print alike: ``0`` (rank 0 only) or
                ``all``. Messages about one rank are printed by that rank, naming it (``rank N``).""",
            )
        },
    )

    show_megatron_log: bool = field(
        default=False,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-show-megatron-log",),
                switch=True,
                help="""Launcher: keep Megatron's argument list and megatron-core's known warnings about
                missing Transformer Engine, Apex or absl on the console; without it they go to
                ``megatron-output/rank<N>.log`` in ``--energy-dir`` (``megatron_energy.launch_output``).""",
            )
        },
    )

    power_sample_ms: float = field(
        default=50.0,
        metadata={
            FLAG: EnergyFlag(
                ("--energy-power-sample-ms",),
                parse=float,
                check=sample_period_problem,
                metavar="MS",
                help="""Read each rank's GPU power (NVML's averaged power and instant-power field) and SM
                clock every MS milliseconds on a background thread, read-only, and log their figures at each
                log interval: levels, SM clock, each iteration's swing, ramps and grid-band share
                (``runtime.energy_log.power_log``); 0: off. NVML refreshes the instant power about every
                100 ms, so 20-100 ms suits.""",
            )
        },
    )

    power_trace: PowerTraceChoice = field(
        default="off",
        metadata={
            FLAG: EnergyFlag(
                ("--energy-power-trace",),
                choices=POWER_TRACE,
                help="""Also write every power reading and iteration end of each rank's GPU to
                ``<energy-dir>/<job>/power_trace.rank<r>.jsonl`` (or ``.csv``), appended at each log
                interval (``runtime.energy_log.power_trace_file``); ``off``: none.""",
            )
        },
    )

    def __post_init__(self) -> None:
        """Hold the config to its rules: each field's (its flag's check or choices), then the planning rules.

        The one place a config is validated; a command line is held to the same rules by building its config
        (``command_line``).

        Raises:
            EnergyConfigError: A value out of range, an unknown mode or choice, or a target the mode cannot
                plan; the message names each field, its flag and what to give instead.
        """
        problems = [
            f"{name}={getattr(self, name)!r} ({spec.options[0]}) {problem}"
            for name, spec in ENERGY_FLAGS.items()
            if (problem := spec.problem(getattr(self, name))) is not None
        ]
        problems += _planning_problems(self.mode, self.target, self.gpu_spec)
        if self.power_trace != "off" and self.power_sample_ms == 0:
            problems.append(
                f"power_trace={self.power_trace!r} (--energy-power-trace) needs power readings, but "
                "--energy-power-sample-ms is 0 (off): give a period of 10-1000 ms, or drop the trace"
            )
        if problems:
            raise EnergyConfigError(*problems)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EnergyConfig:
        """Build the config from a namespace parsed by a parser that ``add_energy_args`` extended.

        Args:
            args: The parsed arguments (Megatron's ``args`` or our own parser's namespace).

        Returns:
            The typed configuration, defaults filled in.

        Raises:
            EnergyConfigError: The values break a rule of the config (``__post_init__``).
        """
        values: dict[str, Any] = {}
        for name, spec in ENERGY_FLAGS.items():
            value = getattr(args, flag_dest(name), None)
            if value is not None:
                values[name] = Path(value) if spec.path else value
        return cls(**values)


ENERGY_FLAGS: Mapping[str, EnergyFlag] = {spec.name: spec.metadata[FLAG] for spec in fields(EnergyConfig)}
"""Every ``--energy-*`` flag by the ``EnergyConfig`` field it fills, in ``--help`` order: read from the
fields, the one definition the launcher, Megatron's parser (patched path) and ``megatron-energy demo``
share."""


def _planning_problems(mode: str, target: EnergyTarget, spec_name: str | None) -> list[str]:
    """What keeps ``mode`` from planning ``target``; empty when nothing does.

    An unknown mode, a power budget the mode cannot plan, or one no GPU of ``spec_name`` can meet.
    """
    found = (
        mode_problem(mode),
        power_target_problem(mode, str(target)),
        smooth_target_problem(mode, target.kind, str(target)),
        _power_floor_problem(target, spec_name),
    )
    return [problem for problem in found if problem is not None]


def _power_floor_problem(target: EnergyTarget, spec_name: str | None) -> str | None:
    """A power budget below what the named GPU spec draws at any clock (``checks.power_floor_problem``).

    Without a spec (real GPUs, named at start) or with one that does not load (its own check says so),
    nothing is known yet.
    """
    if target.kind != "power" or spec_name is None:
        return None
    try:
        spec = load_gpu_spec(spec_name)
    except (ValueError, OSError):
        return None
    return power_floor_problem(str(target), target.power_w, spec.name, spec.idle_power_w)
