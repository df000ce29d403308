"""Checks shared by the ``megatron-energy`` commands: ``argparse`` types for ranges and paths, one error line.

Bad input is refused while parsing (``argparse`` prints usage and the message, exit status 2); problems
found later in a file's content go through :func:`fail`: one line on stderr, exit status 2, no traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from megatron_energy.config import unwritable_folder_reason

INPUT_ERROR_STATUS = 2
INTERRUPTED_STATUS = 130
"""Exit status of a command ended by Ctrl-C (128 + SIGINT, as a shell reports it)."""


def non_negative_float(text: str) -> float:
    """Parse a number >= 0 (an ``argparse`` type)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"'{text}' must be a number >= 0")
    return value


def non_negative_int(text: str) -> int:
    """Parse a whole number >= 0 (an ``argparse`` type)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be a whole number >= 0")
    return value


def readable_file(text: str) -> Path:
    """An existing, readable file (an ``argparse`` type)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{path} is not a file; check the path")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{path} is not readable; check its permissions")
    return path


def output_file(text: str) -> Path:
    """A file that can be written: not a folder, its folder writable or creatable (an ``argparse`` type)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder; give a file name inside it")
    why = unwritable_folder_reason(path.parent)
    if why is not None:
        raise argparse.ArgumentTypeError(f"cannot write {path}: {why}; choose another path")
    return path


def output_folder(text: str) -> Path:
    """A folder that can be written into, or created (an ``argparse`` type)."""
    path = Path(text)
    why = unwritable_folder_reason(path)
    if why is not None:
        raise argparse.ArgumentTypeError(f"cannot write into {path}: {why}; choose another folder")
    return path


def plain_text(docstring: str) -> str:
    """A docstring as ``--help`` shows it: reST markup (double backquotes, roles, emphasis, ``::``) out."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", docstring)  # :func:`name` -> name
    text = re.sub(r"::$", ":", text, flags=re.MULTILINE)  # a literal block's "::" -> ":"
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"`([^`]+)`", r"\1", text)
    return re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"\1", text)


def fail(command: str, problem: object) -> int:
    """Print ``megatron-energy COMMAND: error: PROBLEM`` as one line on stderr and return exit status 2."""
    text = " ".join(str(problem).split())
    print(f"megatron-energy {command}: error: {text}", file=sys.stderr)
    return INPUT_ERROR_STATUS
