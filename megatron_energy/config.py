"""The ``--energy-*`` flags and the ``EnergyConfig`` they fill.

``add_energy_args`` has the signature of Megatron's ``extra_args_provider``: pass it to
``megatron.training.arguments.parse_args`` (or ``parse_and_validate_args``) and the flags become ordinary
Megatron arguments. Bad values (an unknown GPU spec, a clock or count out of range, an output folder that
cannot be written) and contradictory combinations are rejected while parsing, with a message that says what
to do instead. ``EnergyConfig.from_args`` turns the parsed namespace into the typed config the
rest of the package uses.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import os
import tempfile
import textwrap
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from megatron_energy.config_checks import (
    Check,
    block_problem,
    choice_check,
    clock_grid_problem,
    fraction_problem,
    power_floor_problem,
    power_target_problem,
    whole_number_problem,
)
from megatron_energy.dvfs.spec import available_gpu_specs, load_gpu_spec
from megatron_energy.errors import EnergyValueError
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
Planning = Literal["auto", "background", "wait"]
PLANNING: tuple[str, ...] = ("auto", "background", "wait")
"""Choices of ``--energy-planning``."""


def parse_freq_grid(text: str) -> tuple[int, ...] | None:
    """Parse an ``--energy-freq-grid`` value.

    Args:
        text: ``auto`` or a comma-separated list of SM clocks in MHz, e.g. ``1980,1800,1500``.

    Returns:
        ``None`` for ``auto`` (the GPU's own supported clocks), else the distinct clocks, highest first.

    Raises:
        argparse.ArgumentTypeError: the list is malformed, has fewer than two clocks or an implausible clock.
    """
    if text.strip().lower() == "auto":
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        clocks = tuple(sorted({int(part) for part in parts}, reverse=True))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a clock list; give 'auto' or comma-separated MHz values such as 1980,1605,1410"
        ) from None
    return _checked(text, clocks, clock_grid_problem)


def _checked[T](text: str, value: T, check: Check) -> T:
    """``value`` parsed from ``text``, if ``check`` finds nothing wrong with it (an ``argparse`` type's end).

    Raises:
        argparse.ArgumentTypeError: What ``check`` found, quoting ``text``.
    """
    problem = check(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"'{text}' {problem}")
    return value


def positive_int(text: str) -> int:
    """Parse a whole number >= 1 (an ``argparse`` type).

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a whole number >= 1.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    return _checked(text, value, whole_number_problem)


def _block_steps(text: str) -> int:
    """Parse ``--energy-overhead-check``: 0 (off) or a block of at least 2 iterations."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    return _checked(text, value, block_problem)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    return _checked(text, value, fraction_problem)


def known_gpu_spec(text: str) -> str:
    """Check an ``--energy-gpu-spec`` value names a GPU spec that loads.

    Args:
        text: A spec name (``configs/gpus/<name>.yaml``) or a path to a spec YAML file.

    Returns:
        ``text`` unchanged.

    Raises:
        argparse.ArgumentTypeError: The spec is unknown (the message lists the known names) or malformed.
    """
    try:
        load_gpu_spec(text)
    except (ValueError, OSError) as error:
        raise argparse.ArgumentTypeError(
            f"{error}; pass one of the known names, or a path to a spec YAML file"
        ) from None
    return text


def unwritable_folder_reason(folder: Path) -> str | None:
    """Why files cannot be written into ``folder`` (created if missing), or None if they can.

    Nothing is left behind: the nearest existing folder on the way to ``folder`` gets a probe file that is
    removed at once, so a parse never creates folders.

    Args:
        folder: The folder that will be written into.
    """
    existing = Path(os.path.abspath(folder))
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".megatron_energy-probe-")
    except OSError as error:
        return f"cannot write into {existing} ({error.strerror or error})"
    os.close(fd)
    os.unlink(probe)
    return None


class EnergyConfigError(EnergyValueError):
    """An ``EnergyConfig`` with a value no flag would accept; the message names the field and the fix."""


@dataclass(frozen=True)
class EnergyConfig:
    """Everything the ``--energy-*`` flags set; one field per flag.

    The docstring under each field is the one text of its flag: ``--help`` shows it (``flag_text``) and the
    documentation's flag reference is generated from it, so the two cannot drift.
    """

    optimise: bool = False
    """Profile, plan and apply per-instruction GPU clocks that save energy at the target speed."""

    mode: str = "perseus"
    """Optimiser: ``perseus`` (a clock per pipeline instruction), ``kareus`` (the launch point and CTA budget
    of every collective class, jointly with the clock; alone at stock clocks), ``kernel`` (a clock per phase
    of kernels inside and outside instructions, under the switch latency), ``all`` (the three composed:
    Perseus's clocks, then Kareus's collectives on them, then phase clocks), or the name of an optimiser an
    installed plugin package declares (``megatron_energy.optimisers.registry``). ``kareus`` and ``all`` plan
    from the job's collective workload, read from Megatron's arguments and its DDP buckets."""

    target: EnergyTarget = field(default_factory=lambda: EnergyTarget("iso-time"))
    """Where on the time–energy frontier to land: ``iso-time`` (no slower than stock clocks), ``min-energy``,
    ``slowdown:X`` with 0 < X < 1, or ``power:W[,peak:P]``: the fastest frontier point whose predicted
    average power per GPU is at most W watts (and no instruction above P). A power budget below the GPU
    spec's idle power is refused while the flags are parsed; one below what the slowest point draws is
    rejected with the lowest reachable power: before profiling where the spec's model is the GPU (simulated
    GPUs), else once, on rank 0, after profiling, keeping the verified profile so that a retry with another
    budget re-plans without profiling; ``kareus`` and ``kernel`` alone (which keep stock clocks) refuse one.
    The log then shows the measured power per GPU against the budget with its 95 % interval, and a sustained
    overshoot reverts to stock clocks like a slowdown."""

    backend: Backend = "auto"
    """GPU backend: ``zeus`` (real GPUs through NVML, amdsmi or zeusd), ``simulated`` (GPUs driven by the
    time/power model of ``--energy-gpu-spec``), or ``auto`` (real GPUs when there are any)."""

    gpu_spec: str | None = None
    """The GPU the simulated backend models: a name of ``configs/gpus/NAME.yaml`` or the path of a spec YAML
    file (e.g. one ``megatron-energy calibrate`` wrote)."""

    dry_run: bool = False
    """Record the clocks that would be set, never change GPU settings (shared machines); only the stock clock
    is measured and the rest of the grid is extrapolated with the model, so the plan is labelled modelled."""

    dir: Path = Path("energy")
    """Where profiles, plans, frontiers, reports and traces go, keyed by the job's fingerprint (a rerun of
    the same job finds its plan there and skips profiling)."""

    profile_iters: int = 2
    """Training steps measured at each profiled clock, after one settling step; the stock clock also measures
    its baseline, at least 4 steps and as many as resolving a 1 % change needs, at most 20 steps and 60 s
    for the stock clock in all (``runtime.profiling.baseline_length``)."""

    freq_grid: tuple[int, ...] | None = None
    """SM clocks to profile, in MHz, comma-separated, or ``auto`` (spread over the top half of the GPU's
    supported clocks)."""

    trace: Path | None = None
    """Write every observed schedule event as one JSON line to this file (``FILE.rankN`` per rank when the
    world size is above 1)."""

    log_file: Path | None = None
    """Also write each ``[energy]`` log line's figures (iteration, phase, source, scalars) as one JSON object
    per line to this file (rank 0, appended)."""

    safety_tolerance: float = 0.05
    """Relative slowdown over the target that counts as a violation (a step must also be slower than the
    target by 2 standard deviations of the measured stock steps, so a noisy machine's swings do not trip
    it)."""

    safety_steps: int = 3
    """Consecutive violating steps after which clocks revert to stock; after such a revert, as many slow
    stock steps (the slowdown came from outside the plan) then as many at their own pace run the plan again,
    at most twice a run."""

    overhead_check: int = 0
    """Once the plan runs, alternate blocks of N iterations with the plugin suspended (stock clocks, its
    hooks idle) and active, and log the measured change in iteration time and energy with its 95 % interval
    at the end (0: off). It measures the training-thread hooks' cost only: the background threads run in
    both kinds of block, so compare against Megatron itself with ``lab/bench_overhead.py``."""

    phase_switching: PhaseSwitchingChoice = "auto"
    """Clocks of phases inside instructions (``--energy-mode kernel`` or ``all``): ``auto`` requests each at
    its planned offset from the instruction's start on the GPU, from a background thread
    (``runtime.running.phase_switcher``); ``off`` keeps every instruction at its own clock (the plan's phase
    saving there is then not realised)."""

    memory_clock: MemoryClockChoice = "auto"
    """The memory clock as a lever: ``auto`` lets the plan lower a rank's memory clock for the whole run phase
    where the GPU offers more than one and that saves energy without slowing any point of the plan
    (modelled; ``optimisers.memory_clock``), set like the SM clocks and restored at exit; ``off`` keeps every
    rank at the stock memory clock."""

    planning: Planning = "auto"
    """``background`` computes the plan in a separate process while training goes on at stock clocks, and
    every rank adopts it at the first step end after it is ready
    (``runtime.planning_round.planner_process``); ``wait`` has training wait for that process at the step
    profiling ends; ``auto``: background on real GPUs, wait on simulated ones (their virtual clock stands
    still while the host plans, so waiting keeps runs deterministic)."""

    def __post_init__(self) -> None:
        """Hold a config built in code to the rules the flags are parsed by.

        Raises:
            EnergyConfigError: A value out of range, an unknown mode or choice, or a target the mode cannot
                plan; the message names each field, its flag and what to give instead.
        """
        problems = [
            f"{name}={getattr(self, name)!r} ({_FLAG_OF[name]}) {problem}"
            for name, check in _VALUE_CHECKS.items()
            if (problem := check(getattr(self, name))) is not None
        ]
        problems += _planning_problems(self.mode, self.target, self.gpu_spec)
        if problems:
            raise EnergyConfigError("EnergyConfig: " + "; ".join(problems))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EnergyConfig:
        """Build the config from a namespace parsed by a parser that ``add_energy_args`` extended.

        Args:
            args: The parsed arguments (Megatron's ``args`` or our own parser's namespace).

        Returns:
            The typed configuration, defaults filled in.
        """
        values = {}
        for spec in fields(cls):
            value = getattr(args, f"energy_{spec.name}", None)
            if value is not None:
                values[spec.name] = value
        for name in ("dir", "trace", "log_file"):
            if name in values:
                values[name] = Path(values[name])
        return cls(**values)


@dataclass(frozen=True)
class EnergyFlag:
    """One ``--energy-*`` flag: the config field it fills, its spellings, its ``argparse`` settings."""

    config_field: str
    """The ``EnergyConfig`` field it fills (its namespace destination is ``energy_<config_field>``)."""

    options: tuple[str, ...]
    """Option strings, the canonical one first."""

    settings: dict[str, Any] = field(default_factory=dict)
    """``type``, ``choices``, ``metavar`` or ``action`` for ``add_argument``."""

    unset: str = "none"
    """How the help names the value ``None``."""

    known: Callable[[], Sequence[str]] | None = None
    """The values this flag knows of, listed after its text (e.g. the shipped GPU specs); ``None``: none."""


ENERGY_FLAGS: tuple[EnergyFlag, ...] = (
    EnergyFlag("optimise", ("--energy-optimise", "--energy-optimize"), {"action": "store_true"}),
    EnergyFlag("mode", ("--energy-mode",), {"metavar": "{perseus,kareus,kernel,all,PLUGIN}"}),
    EnergyFlag(
        "target",
        ("--energy-target",),
        {"type": parse_target, "metavar": "iso-time|min-energy|slowdown:X|power:W[,peak:P]"},
    ),
    EnergyFlag("backend", ("--energy-backend",), {"choices": BACKENDS}),
    EnergyFlag(
        "gpu_spec",
        ("--energy-gpu-spec",),
        {"type": known_gpu_spec, "metavar": "NAME"},
        known=available_gpu_specs,
    ),
    EnergyFlag("dry_run", ("--energy-dry-run",), {"action": "store_true"}),
    EnergyFlag("dir", ("--energy-dir",), {"metavar": "PATH"}),
    EnergyFlag("profile_iters", ("--energy-profile-iters",), {"type": positive_int, "metavar": "N"}),
    EnergyFlag(
        "freq_grid",
        ("--energy-freq-grid",),
        {"type": parse_freq_grid, "metavar": "MHZ,MHZ,...|auto"},
        unset="auto",
    ),
    EnergyFlag("trace", ("--energy-trace",), {"metavar": "FILE"}),
    EnergyFlag("log_file", ("--energy-log-file",), {"metavar": "FILE"}),
    EnergyFlag("safety_tolerance", ("--energy-safety-tolerance",), {"type": _fraction, "metavar": "X"}),
    EnergyFlag("safety_steps", ("--energy-safety-steps",), {"type": positive_int, "metavar": "N"}),
    EnergyFlag("overhead_check", ("--energy-overhead-check",), {"type": _block_steps, "metavar": "N"}),
    EnergyFlag("phase_switching", ("--energy-phase-switching",), {"choices": PHASE_SWITCHING}),
    EnergyFlag("memory_clock", ("--energy-memory-clock",), {"choices": MEMORY_CLOCK}),
    EnergyFlag("planning", ("--energy-planning",), {"choices": PLANNING}),
)
"""Every ``--energy-*`` flag, in ``--help`` order; the one definition the launcher, Megatron's parser
(patched path) and ``megatron-energy demo`` share. What each flag does is its ``EnergyConfig`` field's
docstring (``flag_text``)."""


def _field_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each field of the dataclass ``cls``, read from its source, whitespace collapsed."""
    (klass,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    assert isinstance(klass, ast.ClassDef)
    found: dict[str, str] = {}
    for statement, following in itertools.pairwise(klass.body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[statement.target.id] = " ".join(following.value.value.split())
    return found


FIELD_DOCSTRINGS: dict[str, str] = _field_docstrings(EnergyConfig)
"""``EnergyConfig`` field -> its docstring: what its flag does, with ````code```` markup."""


def flag_text(flag: EnergyFlag) -> str:
    """What ``flag`` does: its ``EnergyConfig`` field's docstring, plus the values it knows of.

    The one text of a flag: ``--help`` shows it without markup, the docs' flag reference as Markdown
    (``docs/hooks/flag_reference.py``); ``tests/test_flag_reference.py`` holds the two to it.

    Args:
        flag: One of ``ENERGY_FLAGS``.

    Returns:
        One paragraph with ````code```` markup (reStructuredText's, as in the docstrings).
    """
    text = FIELD_DOCSTRINGS[flag.config_field]
    if flag.known is not None:
        text = f"{text.removesuffix('.')}; known: {', '.join(f'``{name}``' for name in flag.known())}."
    return text


_FLAG_OF: dict[str, str] = {flag.config_field: flag.options[0] for flag in ENERGY_FLAGS}
"""The canonical flag of each ``EnergyConfig`` field."""

_VALUE_CHECKS: dict[str, Check] = {
    "backend": choice_check(BACKENDS),
    "profile_iters": whole_number_problem,
    "freq_grid": clock_grid_problem,
    "safety_tolerance": fraction_problem,
    "safety_steps": whole_number_problem,
    "overhead_check": block_problem,
    "phase_switching": choice_check(PHASE_SWITCHING),
    "memory_clock": choice_check(MEMORY_CLOCK),
    "planning": choice_check(PLANNING),
}
"""The check of each field with a range or choices; the flags' ``argparse`` types call the same ones."""


def shown_default(flag: EnergyFlag, value: object) -> str:
    """A value of ``flag``'s field as ``--help`` (and the docs' flag reference) shows it.

    Args:
        flag: One of ``ENERGY_FLAGS``.
        value: A value of its ``EnergyConfig`` field.

    Returns:
        ``on``/``off`` for switches, ``flag.unset`` for ``None``, a comma-separated list for a tuple.
    """
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return flag.unset
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def add_energy_args(
    parser: argparse.ArgumentParser,
    *,
    only: Collection[str] | None = None,
    defaults: Mapping[str, str] | None = None,
) -> argparse.ArgumentParser:
    """Add the ``--energy-*`` flags to ``parser``; usable as Megatron's ``extra_args_provider``.

    The parser's ``parse_known_args`` (which ``parse_args`` calls) is wrapped so that contradictory
    combinations are rejected through ``parser.error`` once all flags are known.

    Args:
        parser: Megatron's argument parser, or any ``argparse.ArgumentParser``.
        only: The ``EnergyConfig`` fields whose flags to add; every flag when ``None``.
        defaults: Field -> default value as it would be typed on the command line (parsed like one). Flags
            without one parse to ``None`` and ``EnergyConfig.from_args`` fills in the config's default; the
            help names the default either way.

    Returns:
        The same parser, extended.
    """
    defaults = defaults or {}
    stock = EnergyConfig()
    group = parser.add_argument_group("energy", "megatron_energy: same throughput, less GPU energy")
    for flag in ENERGY_FLAGS:
        if only is not None and flag.config_field not in only:
            continue
        default = defaults.get(flag.config_field)
        shown = default if default is not None else shown_default(flag, getattr(stock, flag.config_field))
        text = flag_text(flag).replace("``", "").replace("%", "%%")
        settings = dict(flag.settings)
        if settings.get("action") == "store_true" and default is not None:
            raise ValueError(f"{flag.options[0]} is a switch; it takes no default")
        group.add_argument(
            *flag.options,
            dest=f"energy_{flag.config_field}",
            default=default,
            help=f"{text.removesuffix('.')} (default: {shown}).",
            **settings,
        )
    _validate_after_parsing(parser)
    return parser


def energy_argv(config: EnergyConfig) -> list[str]:
    """The ``--energy-*`` flags that give ``config`` back through ``EnergyConfig.from_args``.

    Fields at their default are left out.

    Args:
        config: The configuration to pass on (e.g. from ``megatron-energy demo`` to the launcher).

    Returns:
        The flags and their values, as command-line words.
    """
    stock = EnergyConfig()
    words: list[str] = []
    for flag in ENERGY_FLAGS:
        value = getattr(config, flag.config_field)
        if value == getattr(stock, flag.config_field):
            continue
        if isinstance(value, bool):
            words.append(flag.options[0])
        else:
            words += [flag.options[0], shown_default(flag, value)]
    return words


OPTIMISATION_FLAGS = {
    "energy_mode": "--energy-mode",
    "energy_target": "--energy-target",
    "energy_backend": "--energy-backend",
    "energy_gpu_spec": "--energy-gpu-spec",
    "energy_dry_run": "--energy-dry-run",
    "energy_profile_iters": "--energy-profile-iters",
    "energy_freq_grid": "--energy-freq-grid",
    "energy_safety_tolerance": "--energy-safety-tolerance",
    "energy_safety_steps": "--energy-safety-steps",
    "energy_phase_switching": "--energy-phase-switching",
    "energy_memory_clock": "--energy-memory-clock",
    "energy_planning": "--energy-planning",
    "energy_log_file": "--energy-log-file",
    "energy_overhead_check": "--energy-overhead-check",
}


def check_energy_args(args: argparse.Namespace) -> str | None:
    """Find a contradictory combination of ``--energy-*`` flags, or an output path that cannot be written.

    ``--energy-dir`` (the default ``energy`` too when optimising) and the folder of ``--energy-trace`` must
    be writable, or creatable; checked with a probe file that is removed at once.

    Args:
        args: A namespace parsed with the flags of ``add_energy_args``.

    Returns:
        A message saying what is wrong and what to do instead, or ``None`` when the flags are consistent.
    """
    problem = _unwritable_output(args)
    if problem is not None:
        return problem
    if not getattr(args, "energy_optimise", None):
        given = [flag for dest, flag in OPTIMISATION_FLAGS.items() if getattr(args, dest, None) is not None]
        if given:
            return (
                f"{', '.join(given)}: no effect without --energy-optimise; add --energy-optimise "
                "or drop them (--energy-trace alone is fine)"
            )
        return None
    spec = getattr(args, "energy_gpu_spec", None)
    mode = getattr(args, "energy_mode", None) or EnergyConfig.mode
    problems = _planning_problems(mode, getattr(args, "energy_target", None), spec)
    if problems:
        return problems[0]
    backend = getattr(args, "energy_backend", None)
    if backend == "zeus" and spec is not None:
        return (
            "--energy-gpu-spec describes a simulated GPU, but --energy-backend zeus drives real GPUs; "
            "drop --energy-gpu-spec, or use --energy-backend simulated"
        )
    if backend == "simulated" and spec is None:
        return "--energy-backend simulated needs --energy-gpu-spec NAME (e.g. h100-sxm, h200, a100-sxm-80gb)"
    return None


def _planning_problems(mode: str, target: EnergyTarget | None, spec_name: str | None) -> list[str]:
    """What keeps ``mode`` from planning ``target``; empty when nothing does.

    An unknown mode, a power budget the mode cannot plan, or one no GPU of ``spec_name`` can meet. The flag
    parser and ``EnergyConfig`` both ask.
    """
    found = (
        mode_problem(mode),
        power_target_problem(mode, str(target)),
        _power_floor_problem(target, spec_name),
    )
    return [problem for problem in found if problem is not None]


def _power_floor_problem(target: EnergyTarget | None, spec_name: str | None) -> str | None:
    """A power budget below what the named GPU spec draws at any clock (``config_checks``).

    Without a spec (real GPUs, named at start) or with one that does not load (its own check says so),
    nothing is known yet.
    """
    if target is None or target.kind != "power" or spec_name is None:
        return None
    try:
        spec = load_gpu_spec(spec_name)
    except (ValueError, OSError):
        return None
    return power_floor_problem(str(target), target.power_w, spec.name, spec.idle_power_w)


def _unwritable_output(args: argparse.Namespace) -> str | None:
    """Check ``--energy-dir`` (given, or the default when optimising) and the folders of the output files."""
    energy_dir = getattr(args, "energy_dir", None)
    if energy_dir is None and getattr(args, "energy_optimise", None):
        energy_dir = EnergyConfig.dir
    if energy_dir is not None:
        why = unwritable_folder_reason(Path(energy_dir))
        if why is not None:
            return f"--energy-dir {energy_dir}: {why}; give a folder you can write with --energy-dir PATH"
    for dest, option in (("energy_trace", "--energy-trace"), ("energy_log_file", "--energy-log-file")):
        path = getattr(args, dest, None)
        if path is None:
            continue
        if Path(path).is_dir():
            return f"{option} {path} is a folder; give a file name, e.g. {Path(path) / 'events.jsonl'}"
        why = unwritable_folder_reason(Path(path).parent)
        if why is not None:
            return f"{option} {path}: {why}; give a file in a folder you can write"
    return None


def _validate_after_parsing(parser: argparse.ArgumentParser) -> None:
    """Wrap this parser's ``parse_known_args`` so cross-flag checks run once all flags are parsed."""
    parse_known_args = parser.parse_known_args

    def parse_and_check(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = parse_known_args(args, namespace)
        problem = check_energy_args(parsed)
        if problem is not None:
            parser.error(problem)
        return parsed, extras

    parser.parse_known_args = parse_and_check  # type: ignore[assignment]
