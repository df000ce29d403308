"""Reading ``--energy-*`` values from text: the parsers the flags' ``argparse`` types are made of.

A flag's type parses its text (a parser here, or ``int``, ``float``, ``parse_target``) and then holds the
value to the flag's check (``checks``) through :func:`checked_value`, so the message quotes what was typed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import cast

from megatron_energy.config.checks import Check, whole_number_problem
from megatron_energy.dvfs.spec import load_gpu_spec

_UNREADABLE = object()
"""What :func:`checked_value` checks for text its parser cannot read: of no check's type, so every check
refuses it with its own message (e.g. ``'abc' must be a whole number >= 1``)."""


def checked_value[T](text: str, parse: Callable[[str], T], check: Check) -> T:
    """``text`` parsed, if ``check`` finds nothing wrong with the value (the body of an ``argparse`` type).

    Args:
        text: The text given on the command line.
        parse: Text -> value; a ``ValueError`` counts as a value the check refuses.
        check: The value's rule (``checks``).

    Returns:
        The parsed value.

    Raises:
        argparse.ArgumentTypeError: What ``check`` found, quoting ``text``.
    """
    try:
        value: object = parse(text)
    except ValueError:
        value = _UNREADABLE
    problem = check(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"'{text}' {problem}")
    return cast(T, value)


def positive_int(text: str) -> int:
    """Parse a whole number >= 1 (an ``argparse`` type).

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a whole number >= 1.
    """
    return checked_value(text, int, whole_number_problem)


def parse_freq_grid(text: str) -> tuple[int, ...] | None:
    """Read an ``--energy-freq-grid`` value; its check (``checks.clock_grid_problem``) judges the clocks.

    Args:
        text: ``auto`` or a comma-separated list of SM clocks in MHz, e.g. ``1980,1800,1500``.

    Returns:
        ``None`` for ``auto`` (the GPU's own supported clocks), else the distinct clocks, highest first.

    Raises:
        argparse.ArgumentTypeError: The text is not a list of whole numbers.
    """
    if text.strip().lower() == "auto":
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        return tuple(sorted({int(part) for part in parts}, reverse=True))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a clock list; give 'auto' or comma-separated MHz values such as 1980,1605,1410"
        ) from None


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
