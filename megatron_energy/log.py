"""The package's logging: one ``logging`` logger per module under ``megatron_energy``, as Megatron's.

Every module logs through ``logging.getLogger(__name__)``, so its records carry the module's dotted name
(``megatron_energy.runtime.session``, ``megatron_energy.dvfs.guard``, ...) under the ``megatron_energy``
root logger, and propagate to the root logger as megatron-core's records do. Users route them as they route
Megatron's: a handler or level on ``megatron_energy`` (or a sub-package), or on the root logger.

:func:`configure_logging` (called once per process by ``megatron_energy.launch`` and the patched path's
``attach_to_training``) sets the ``megatron_energy`` level (``--energy-log-level``) and which ranks print the
messages every rank would print identically (``--energy-log-ranks``), and adds :class:`ConsoleHandler`, which
prints each record to standard output (where Megatron prints): INFO records as their message alone (the
``[energy] ...`` lines, exactly as documented), the other levels in Megatron's format
(``logging.BASIC_FORMAT``, ``LEVEL:logger:message``, what megatron-training's
``logging.basicConfig(handlers=[CustomHandler()])`` gives megatron-core's records). Records still propagate
to the root logger, so a user's handlers there get them too; Megatron's own console handler skips them, as
it skips ``torch.distributed``'s (``megatron.console_log``), so each appears on the console once.

Each record is written with one ``write`` of the whole line and its newline, so the lines of ranks that share
one pipe (``torch.distributed.run``) never run into each other (``print`` writes the text and the newline
separately). Messages a rank prints about itself carry ``rank N``; those every rank would print alike go
through :func:`log_single_rank` (megatron-core's name for the same rule), which logs on rank 0 only unless
``--energy-log-ranks all``.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

ROOT_LOGGER = "megatron_energy"
"""The logger every module's logger sits under."""

LogLevel = Literal["debug", "info", "warning", "error"]
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")
"""Choices of ``--energy-log-level``: ``logging``'s level names, lower-case."""

LogRanks = Literal["0", "all"]
LOG_RANKS: tuple[str, ...] = ("0", "all")
"""Choices of ``--energy-log-ranks``: rank 0 alone, or every rank, prints what all ranks would print alike."""

MEGATRON_FORMAT = logging.BASIC_FORMAT
"""Megatron's log format (``LEVEL:logger:message``): what ``logging.basicConfig`` gives megatron-core's
records in megatron-training (``megatron/training/training.py``)."""

_every_rank = False
"""``--energy-log-ranks all``: every rank logs what :func:`log_single_rank` logs."""


class EnergyFormatter(logging.Formatter):
    """INFO records as their message alone (the ``[energy]`` lines); the other levels in Megatron's format."""

    def __init__(self) -> None:
        super().__init__(MEGATRON_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        """The record's line: its message at INFO, ``LEVEL:logger:message`` otherwise."""
        if record.levelno == logging.INFO and not record.exc_info:
            return record.getMessage()
        return super().format(record)


class ConsoleHandler(logging.Handler):
    """Prints ``megatron_energy``'s records to standard output, each in one ``write`` (module docstring).

    Args:
        stream: Where lines go; the process's standard output at the time of each record when ``None`` (so
            a redirected ``sys.stdout`` is followed, as ``print`` follows it).
    """

    terminator = "\n"

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self.stream = stream
        self.setFormatter(EnergyFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record's line and its newline in one ``write``, then flush."""
        try:
            stream = self.stream if self.stream is not None else sys.stdout
            stream.write(self.format(record) + self.terminator)
            stream.flush()
        except Exception:  # as logging.StreamHandler: a broken stream must not stop training
            self.handleError(record)


def configure_logging(level: str = "info", ranks: str = "0", stream: TextIO | None = None) -> ConsoleHandler:
    """Set up ``megatron_energy``'s logging for this process (see the module docstring); idempotent.

    Args:
        level: ``--energy-log-level``: the least severe level logged (one of :data:`LOG_LEVELS`).
        ranks: ``--energy-log-ranks``: ``0`` or ``all`` (:func:`log_single_rank`).
        stream: Where the console handler writes; the current standard output when ``None``.

    Returns:
        The console handler now on the ``megatron_energy`` logger (any earlier one is replaced).
    """
    global _every_rank
    if level not in LOG_LEVELS or ranks not in LOG_RANKS:
        raise ValueError(
            f"log level {level!r} or ranks {ranks!r} unknown; give one of {LOG_LEVELS}, {LOG_RANKS}"
        )
    _every_rank = ranks == "all"
    root = logging.getLogger(ROOT_LOGGER)
    root.setLevel(level.upper())
    for handler in [h for h in root.handlers if isinstance(h, ConsoleHandler)]:
        root.removeHandler(handler)
    handler = ConsoleHandler(stream)
    root.addHandler(handler)
    return handler


def log_single_rank(logger: logging.Logger, rank: int, message: str, level: int = logging.INFO) -> None:
    """Log a message every rank would log alike: on rank 0, or on every rank with ``--energy-log-ranks all``.

    Args:
        logger: The calling module's logger.
        rank: This process's global rank.
        message: The message.
        level: Its ``logging`` level.
    """
    if rank == 0 or _every_rank:
        logger.log(level, message)
