"""The ``--energy-*`` flags on a command line: adding them to a parser, the parser that checks them, and back.

``add_energy_args`` has the signature of Megatron's ``extra_args_provider``: pass it to
``megatron.training.arguments.parse_args`` (or ``parse_and_validate_args``) and the flags become ordinary
Megatron arguments. Each flag's ``argparse`` type refuses a bad value as it is read (an unknown GPU spec, a
clock or count out of range); once all flags are read, :class:`EnergyArgumentParser` refuses what depends on
several of them (an optimisation flag without ``--energy-optimise``, a backend without its GPU spec, an output
folder that cannot be written, and whatever the config itself refuses), with a message that says what to do
instead.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from megatron_energy.config.energy_config import ENERGY_FLAGS, EnergyConfig, EnergyConfigError
from megatron_energy.config.flag import flag_dest


class EnergyArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that, once all flags are read, refuses contradictory ``--energy-*`` flags.

    ``argparse`` checks each flag's value as it reads it, and offers no step after the last one: rules that
    read several flags need a parser whose parse ends with them. They are reported through ``error`` (usage,
    the message, exit status 2), as ``argparse`` reports a bad value.
    """

    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        """Parse as ``argparse`` does, then hold the ``--energy-*`` flags to :func:`command_line_problem`.

        Args:
            args: The command line, ``sys.argv[1:]`` when ``None``.
            namespace: The object to fill; a new ``argparse.Namespace`` when ``None``.

        Returns:
            The filled namespace and the arguments this parser does not know.
        """
        parsed, extras = super().parse_known_args(args, namespace)
        problem = command_line_problem(parsed)
        if problem is not None:
            self.error(problem)
        return parsed, extras

    @classmethod
    def extending(cls, parser: argparse.ArgumentParser) -> EnergyArgumentParser:
        """A parser of this class with ``parser``'s settings, argument groups and arguments.

        Built with ``argparse``'s own ``parents``: the arguments are ``parser``'s, not copies, so the new
        parser reads, shows and defaults them exactly as ``parser`` does (``parents`` would merge two argument
        groups of one title; Megatron's titles are distinct).

        Args:
            parser: Any ``ArgumentParser`` (Megatron's, for one).

        Returns:
            The new parser; ``parser`` itself is left as it was.
        """
        return cls(
            prog=parser.prog,
            usage=parser.usage,
            description=parser.description,
            epilog=parser.epilog,
            parents=[parser],
            formatter_class=parser.formatter_class,
            prefix_chars=parser.prefix_chars,
            fromfile_prefix_chars=parser.fromfile_prefix_chars,
            argument_default=parser.argument_default,
            conflict_handler=parser.conflict_handler,
            add_help=False,  # a help flag of ``parser`` is among the arguments it passes on
            allow_abbrev=parser.allow_abbrev,
            exit_on_error=parser.exit_on_error,
        )


def add_energy_args(
    parser: argparse.ArgumentParser,
    *,
    only: Collection[str] | None = None,
    defaults: Mapping[str, str] | None = None,
) -> EnergyArgumentParser:
    """Add the ``--energy-*`` flags to ``parser``; usable as Megatron's ``extra_args_provider``.

    Args:
        parser: Megatron's argument parser, or any ``argparse.ArgumentParser``.
        only: The ``EnergyConfig`` fields whose flags to add; every flag when ``None``.
        defaults: Field -> default value as it would be typed on the command line (parsed like one). Flags
            without one parse to ``None`` and ``EnergyConfig.from_args`` fills in the config's default; the
            help names the default either way.

    Returns:
        ``parser`` extended, if it is an ``EnergyArgumentParser``; else one that extends it
            (``EnergyArgumentParser.extending``) and refuses contradictory combinations while parsing.
            Megatron parses with the parser its ``extra_args_provider`` returns (and the patch's
            ``add_megatron_arguments`` returns this one), so use the returned parser.
    """
    defaults = defaults or {}
    stock = EnergyConfig()
    group = parser.add_argument_group("energy", "megatron_energy: same throughput, less GPU energy")
    for name, spec in ENERGY_FLAGS.items():
        if only is not None and name not in only:
            continue
        default = defaults.get(name)
        if spec.switch and default is not None:
            raise ValueError(f"{spec.options[0]} is a switch; it takes no default")
        shown = default if default is not None else spec.shown(getattr(stock, name))
        text = spec.text().replace("``", "").replace("%", "%%")
        group.add_argument(
            *spec.options,
            dest=flag_dest(name),
            default=default,
            help=f"{text.removesuffix('.')} (default: {shown}).",
            **spec.argparse_settings(),
        )
    if isinstance(parser, EnergyArgumentParser):
        return parser
    return EnergyArgumentParser.extending(parser)


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
    for name, spec in ENERGY_FLAGS.items():
        value = getattr(config, name)
        if value == getattr(stock, name):
            continue
        words += [spec.options[0]] if spec.switch else [spec.options[0], spec.shown(value)]
    return words


def command_line_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the ``--energy-*`` flags of a parsed command line, or ``None`` when nothing is.

    In order: an output path that cannot be written (``--energy-dir``, the default ``energy`` too when
    optimising, and the folders of ``--energy-trace`` and ``--energy-log-file``: checked with a probe file
    that is removed at once), flags that need ``--energy-optimise`` without it
    (``EnergyFlag.needs_optimise``), what the config refuses (``EnergyConfig``, the one place its rules
    live), and a backend that contradicts ``--energy-gpu-spec``.

    Args:
        args: A namespace parsed with the flags of ``add_energy_args``.

    Returns:
        A message saying what is wrong and what to do instead.
    """
    problem = _unwritable_output(args)
    if problem is not None:
        return problem
    if not getattr(args, flag_dest("optimise"), None):
        given = [
            spec.options[0]
            for name, spec in ENERGY_FLAGS.items()
            if spec.needs_optimise and getattr(args, flag_dest(name), None) is not None
        ]
        if given:
            return (
                f"{', '.join(given)}: no effect without --energy-optimise; add --energy-optimise "
                "or drop them (--energy-trace alone is fine)"
            )
        return None
    try:
        config = EnergyConfig.from_args(args)
    except EnergyConfigError as refused:
        return refused.problems[0]
    if config.backend == "zeus" and config.gpu_spec is not None:
        return (
            "--energy-gpu-spec describes a simulated GPU, but --energy-backend zeus drives real GPUs; "
            "drop --energy-gpu-spec, or use --energy-backend simulated"
        )
    if config.backend == "simulated" and config.gpu_spec is None:
        return "--energy-backend simulated needs --energy-gpu-spec NAME (e.g. h100-sxm, h200, a100-sxm-80gb)"
    return None


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


def _unwritable_output(args: argparse.Namespace) -> str | None:
    """Check ``--energy-dir`` (given, or the default when optimising) and the folders of the output files."""
    energy_dir = getattr(args, flag_dest("dir"), None)
    if energy_dir is None and getattr(args, flag_dest("optimise"), None):
        energy_dir = EnergyConfig.dir
    if energy_dir is not None:
        why = unwritable_folder_reason(Path(energy_dir))
        if why is not None:
            return f"--energy-dir {energy_dir}: {why}; give a folder you can write with --energy-dir PATH"
    for name in ("trace", "log_file"):
        path = getattr(args, flag_dest(name), None)
        if path is None:
            continue
        option = ENERGY_FLAGS[name].options[0]
        if Path(path).is_dir():
            return f"{option} {path} is a folder; give a file name, e.g. {Path(path) / 'events.jsonl'}"
        why = unwritable_folder_reason(Path(path).parent)
        if why is not None:
            return f"{option} {path}: {why}; give a file in a folder you can write"
    return None
