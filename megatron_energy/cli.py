"""The ``megatron-energy`` command and its subcommands (``demo``, ``plan``, ``report``, ``clocks``, ...).

Each subcommand lives in its own module under ``megatron_energy/commands/`` and exposes
``register(subparsers)``; this module only assembles them. A command line that names its subcommand imports
that subcommand's module alone, so ``plan`` never imports what ``demo`` or ``calibrate`` need.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from megatron_energy import __version__
from megatron_energy.commands.arguments import INTERRUPTED_STATUS
from megatron_energy.config import EnergyArgumentParser

COMMANDS: dict[str, str] = {
    "demo": "demo",
    "plan": "plan_command",
    "simulate": "simulate",
    "report": "report",
    "patch": "patch",
    "calibrate": "calibrate",
    "clocks": "clocks",
    "estimate": "estimate",
}
"""Each subcommand and its module under ``megatron_energy/commands/``."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Build the ``megatron-energy`` parser.

    Args:
        command: Register this subcommand alone; ``None``: every subcommand (for ``--help`` and errors).

    Each subcommand's parser is an ``EnergyArgumentParser``, so the ``--energy-*`` flags ``demo`` takes are
    held to the launcher's rules while parsing.

    Returns:
        The top-level parser.
    """
    parser = argparse.ArgumentParser(
        prog="megatron-energy",
        description=(
            "Energy optimisation for Megatron-LM training: plan, simulate, report, patch, demo, calibrate, "
            "clocks."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=EnergyArgumentParser
    )
    for name, module_name in COMMANDS.items():
        if command is None or name == command:
            module = importlib.import_module(f"megatron_energy.commands.{module_name}")
            module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``megatron-energy`` command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        The process exit status.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:  # Ctrl-C anywhere: one line, not a traceback
        print(f"megatron-energy {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED_STATUS


if __name__ == "__main__":
    sys.exit(main())
