"""The console every command prints through: nothing wrapped when the output goes to a file or a pipe."""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_WIDTH = 240
"""Width of the page when the output is not a terminal: wide enough that no table cell wraps."""


def output_console(min_width: int = 0) -> Console:
    """A rich console on standard output that never wraps a line.

    Long lines (paths) are not wrapped at all; tables are laid out for the terminal's width, or for
    ``PIPED_WIDTH`` columns when the output is piped or redirected, so numbers and paths stay whole.

    Args:
        min_width: The narrowest page the caller's tables fit; a narrower terminal gets this width.
    """
    piped = not sys.stdout.isatty()
    console = Console(soft_wrap=True, width=PIPED_WIDTH if piped else None)
    console.width = max(console.width, min_width)
    return console
