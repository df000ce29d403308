"""The one way this package writes a file other processes may read: atomically, plus a folder lock.

:func:`write_atomically` writes to a unique temporary file in the target's folder, flushes and fsyncs it,
renames it over the target (``os.replace``, atomic on POSIX within one file system) and fsyncs the folder,
so a reader sees either the old file or the new one, never a mix, and the new one survives a power cut once
the call returns. Any number of threads and processes may write the same path at once: the last rename
wins, none fails. A failed write leaves the old file intact and removes its temporary file. A writer
killed mid-write (SIGKILL) cannot remove its own: its temporary names its host and process, and the next
successful write of the same path on that host removes the temporaries of processes that no longer run.

:func:`folder_lock` takes an advisory ``fcntl.flock`` on a lock file in a folder, shared (readers) or
exclusive (a writer replacing a set of files that must stay consistent with each other). Pure Python,
POSIX only.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

LOCK_FILE_NAME = ".lock"
"""Name of the lock file :func:`folder_lock` creates in the folder it locks."""


def write_atomically(path: str | os.PathLike[str], data: str | bytes, *, durable: bool = True) -> None:
    """Replace ``path`` by ``data`` so that no reader ever sees a partial file.

    The folder is created if missing. Text is encoded as UTF-8.

    Args:
        path: The file to write.
        data: Its new content.
        durable: fsync the file and its folder, so the new content survives a power cut. ``False`` keeps
            the atomicity but skips the fsyncs, for files rewritten many times a second whose loss at a
            crash does not matter (the simulated GPUs' state).

    Raises:
        OSError: The folder cannot be created or written; ``path`` then keeps its old content.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=_temporary_prefix(target, os.getpid()), suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_folder(target.parent)
    _remove_dead_writers_temporaries(target)


def _temporary_prefix(target: Path, pid: int) -> str:
    """The name every temporary of ``target`` written by process ``pid`` of this host starts with."""
    return f".{target.name}.{socket.gethostname()}-{pid}."


def _remove_dead_writers_temporaries(target: Path) -> None:
    """Remove the temporaries of ``target`` left by processes of this host that no longer run.

    Temporaries of other hosts (a shared file system) are left alone: their processes cannot be checked.
    """
    host_prefix = f".{target.name}.{socket.gethostname()}-"
    for temporary in target.parent.glob(f"{glob.escape(host_prefix)}*.tmp"):
        pid_text = temporary.name[len(host_prefix) :].split(".", 1)[0]
        if pid_text.isdigit() and not _process_runs(int(pid_text)):
            temporary.unlink(missing_ok=True)


def _process_runs(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (a process of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (some file systems refuse to fsync a folder: that is fine)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def folder_lock(
    folder: str | os.PathLike[str], mode: Literal["shared", "exclusive"] = "exclusive"
) -> Iterator[None]:
    """Hold an advisory lock on ``folder`` (its ``.lock`` file) for the ``with`` block; blocks until granted.

    Many shared holders may hold it at once; an exclusive holder excludes every other holder. The lock is
    per open file, so it also excludes other threads of the same process. The folder is created if missing.

    Args:
        folder: The folder to lock.
        mode: ``"shared"`` to read a consistent set of files, ``"exclusive"`` to replace them.

    Raises:
        ValueError: ``mode`` is neither ``"shared"`` nor ``"exclusive"``.
    """
    if mode not in ("shared", "exclusive"):
        raise ValueError(f"lock mode {mode!r} is unknown; use 'shared' or 'exclusive'")
    Path(folder).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(folder) / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if mode == "shared" else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
