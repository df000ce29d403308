"""What the launcher's ranks print: whole lines, one ``write`` each, Megatron's noise set aside in a file.

Under ``torch.distributed.run`` every rank writes to the same pipe. ``print`` writes its text and its newline
in two calls, so two ranks' messages can share one line; :class:`RankOutput` (in place of ``sys.stdout`` and
``sys.stderr`` while the launcher runs the script) holds a line until its newline and writes it whole, in one
call (a pipe takes a write of up to 4 KiB at once).

Unless ``--energy-show-megatron-log`` is given, it also keeps off the console what says nothing to the
reader of a training log, writing it instead to the rank's file under the energy directory
(``energy_dir.megatron_output_path``), and says once where it went:

- Megatron's list of arguments (the ``------------------------ arguments ------------------------``
  block, hundreds of lines);
- the :data:`KNOWN_WARNINGS` of megatron-core (Transformer Engine, Apex or absl missing), through
  :func:`warnings_aside`.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

KNOWN_WARNINGS: tuple[str, ...] = (
    "Transformer Engine and Apex are not installed",
    "Apex is not installed",
    "Only transformer-engine>=",
    "absl.logging is not installed",
)
"""Beginnings of the warnings megatron-core gives where Transformer Engine, Apex or absl are missing: they
describe the installation, not the run (a CPU run never has them)."""

ARGUMENTS_BEGIN = re.compile(r"^-+ arguments -+$")
"""The first line of Megatron's list of arguments (``megatron.training.arguments._print_args``)."""
ARGUMENTS_END = re.compile(r"^-+ end of arguments -+$")
"""Its last line."""


class AsideFile:
    """The rank's file for what is kept off the console, opened (and the console told) at its first line.

    Args:
        path: The file (overwritten at its first line).
        console: Where the one line saying so goes.
    """

    def __init__(self, path: Path, console: TextIO) -> None:
        self.path = path
        self._console = console
        self._file: TextIO | None = None

    def write(self, text: str) -> None:
        """Append ``text``; at the first call, create the file and say where it is."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", encoding="utf-8")
            self._console.write(
                f"[energy] Megatron's argument list and known warnings: in {self.path} "
                "(--energy-show-megatron-log shows them here)\n"
            )
            self._console.flush()
        self._file.write(text)
        self._file.flush()

    def close(self) -> None:
        """Close the file, if it was opened."""
        if self._file is not None:
            self._file.close()


class RankOutput(io.TextIOBase):
    """A text stream that writes whole lines to ``console``, and Megatron's argument list to ``aside``.

    Args:
        console: The stream it stands in for.
        aside: Where the argument list goes; ``None``: it stays on the console.
    """

    def __init__(self, console: TextIO, aside: AsideFile | None) -> None:
        super().__init__()
        self.console = console
        self._aside = aside
        self._pending = ""
        self._in_arguments = False

    def writable(self) -> bool:
        """It is written to."""
        return True

    def write(self, text: str) -> int:
        """Take ``text``; write each line it completes, whole."""
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._line(line + "\n")
        return len(text)

    def flush(self) -> None:
        """Write a line still without its newline as it is (a prompt, a progress bar), then flush."""
        if self._pending:
            text, self._pending = self._pending, ""
            self._line(text)
        self.console.flush()

    def fileno(self) -> int:
        """The console's file descriptor (for code that writes to it directly)."""
        return self.console.fileno()

    def isatty(self) -> bool:
        """Whether the console is a terminal."""
        return self.console.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The console's encoding."""
        return self.console.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        """The console's error handler."""
        return self.console.errors

    def __getattr__(self, name: str) -> object:
        """Anything else a stream has (``buffer``, ``mode``) is the console's."""
        return getattr(self.console, name)

    def _line(self, text: str) -> None:
        stripped = text.strip()
        if self._aside is not None and (self._in_arguments or ARGUMENTS_BEGIN.match(stripped)):
            self._in_arguments = not ARGUMENTS_END.match(stripped)
            self._aside.write(text)
            return
        self.console.write(text)


@contextlib.contextmanager
def rank_output(aside_path: Path | None) -> Iterator[None]:
    """While inside, ``sys.stdout`` and ``sys.stderr`` write whole lines (:class:`RankOutput`).

    Args:
        aside_path: The rank's file for Megatron's argument list and the known warnings; ``None`` keeps
            them on the console (``--energy-show-megatron-log``).
    """
    stdout, stderr = sys.stdout, sys.stderr
    aside = None if aside_path is None else AsideFile(aside_path, stdout)
    sys.stdout = RankOutput(stdout, aside)
    sys.stderr = RankOutput(stderr, None)
    try:
        with warnings_aside(aside):
            yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        sys.stdout, sys.stderr = stdout, stderr
        if aside is not None:
            aside.close()


@contextlib.contextmanager
def warnings_aside(aside: AsideFile | None) -> Iterator[None]:
    """While inside, a warning that begins with one of :data:`KNOWN_WARNINGS` goes to ``aside``.

    Other warnings are shown as before. ``None``: every warning is shown as before.
    """
    if aside is None:
        yield
        return
    shown = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if str(message).startswith(KNOWN_WARNINGS):
            aside.write(warnings.formatwarning(message, category, filename, lineno, line))
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown
