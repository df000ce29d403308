"""Collect ``megatron_energy``'s log messages in a list, as a test reads what a rank would print."""

from __future__ import annotations

import logging
import threading

from megatron_energy.log import ROOT_LOGGER


class LogLines(logging.Handler):
    """Appends each ``megatron_energy`` record's message to :attr:`lines` (of one thread's, if given)."""

    def __init__(self, lines: list[str], thread: int | None = None) -> None:
        super().__init__(logging.INFO)
        self.lines = lines
        self.thread = thread

    def emit(self, record: logging.LogRecord) -> None:
        if self.thread is None or record.thread == self.thread:
            self.lines.append(record.getMessage())


def capture_lines(lines: list[str] | None = None, this_thread_only: bool = False) -> list[str]:
    """From now on, every INFO-or-above message of ``megatron_energy`` is appended to ``lines``.

    With ``this_thread_only``, only those logged by the calling thread (a rank emulated in a thread).

    The handler stays until ``release_lines`` (``conftest`` calls it after each test); in a forked rank it
    lasts as long as the rank.

    Returns:
        ``lines`` (a new list when ``None``).
    """
    lines = [] if lines is None else lines
    root = logging.getLogger(ROOT_LOGGER)
    root.setLevel(logging.INFO)
    root.addHandler(LogLines(lines, threading.get_ident() if this_thread_only else None))
    return lines


def release_lines() -> None:
    """Remove every handler ``capture_lines`` added."""
    root = logging.getLogger(ROOT_LOGGER)
    for handler in [h for h in root.handlers if isinstance(h, LogLines)]:
        root.removeHandler(handler)
