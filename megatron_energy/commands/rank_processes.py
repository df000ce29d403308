"""Run a job's rank processes from a command: their output streamed and logged, their lives tied to ours.

:func:`run_ranks` starts the command (``torch.distributed.run``) in a process group of its own, with Linux's
``PR_SET_PDEATHSIG`` set so that it gets SIGTERM if this process dies, however it dies (torchrun then stops
its workers). If this process is interrupted (Ctrl-C, SIGTERM) or fails while the ranks run, the whole group
is sent SIGTERM, then SIGKILL after a grace period. Every line the ranks print goes to a log file; lines are
echoed as they come, except Megatron's list of arguments (hundreds of lines), which stays in the log.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal this process gets when its parent thread exits (linux/prctl.h)."""

GRACE_S = 10.0
"""How long the ranks get to stop after SIGTERM before SIGKILL."""

ARGUMENTS_BEGIN = re.compile(r"^-+ arguments -+$")
ARGUMENTS_END = re.compile(r"^-+ end of arguments -+$")


def free_port() -> int:
    """A TCP port on the loopback interface that was free a moment ago (for ``--master-port``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def die_with_parent() -> None:
    """In the child, before ``exec``: ask Linux for SIGTERM when the parent dies (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the process-group kill still covers normal exits
        pass


def stop_group(process: subprocess.Popen[Any]) -> None:
    """SIGTERM the process's group, then SIGKILL it if it has not ended within ``GRACE_S``."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """While inside, SIGTERM raises ``SystemExit(143)`` (so ``finally`` blocks run), in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_ranks(
    command: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    echo: Callable[[str], Any],
) -> int:
    """Run ``command``, echo and log its output, and make sure no rank outlives the call.

    Args:
        command: The launcher command line.
        env: The processes' environment.
        log_path: Where every line of output goes (overwritten).
        echo: Called with each line to show (without its newline); Megatron's argument list is not shown.

    Returns:
        The command's exit status.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        log_path.open("w", encoding="utf-8") as log,
        sigterm_as_exit(),
        subprocess.Popen(
            list(command),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=die_with_parent,  # safe: no other thread runs here while it forks
        ) as process,
    ):
        try:
            _stream(process, log, log_path, echo)
            return process.wait()
        finally:
            stop_group(process)


def _stream(process: subprocess.Popen[str], log: Any, log_path: Path, echo: Callable[[str], Any]) -> None:
    """Copy the process's output to the log, echoing all but Megatron's argument list."""
    assert process.stdout is not None
    in_arguments = False
    for raw in process.stdout:
        log.write(raw)
        line = raw.rstrip("\n")
        if ARGUMENTS_BEGIN.match(line.strip()):
            in_arguments = True
            echo(f"(Megatron's arguments: in {log_path})")
        elif in_arguments:
            in_arguments = not ARGUMENTS_END.match(line.strip())
        else:
            echo(line)
