"""``megatron_energy.atomic``: concurrent writers never fail, readers never see half a file, locks exclude."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from megatron_energy import atomic
from megatron_energy.atomic import folder_lock, write_atomically

PAYLOAD_BYTES = 256 * 1024
WRITES_PER_WRITER = 40


def _payload(writer: int) -> bytes:
    """A payload whose every byte names its writer, so a torn or partial file is detectable."""
    return bytes([65 + writer % 26]) * PAYLOAD_BYTES


def _is_whole(content: bytes) -> bool:
    return len(content) == PAYLOAD_BYTES and content == content[:1] * PAYLOAD_BYTES


def _write_many(path: str, writer: int, durable: bool = True) -> None:
    for _ in range(WRITES_PER_WRITER):
        write_atomically(path, _payload(writer), durable=durable)


def _read_until(path: str, stop: threading.Event | multiprocessing.synchronize.Event) -> None:
    """Read ``path`` until ``stop``; exit with status 1 (a process) or raise (a thread) on a partial read."""
    reads = 0
    while not stop.is_set() or reads == 0:
        content = Path(path).read_bytes()
        if not _is_whole(content):
            raise SystemExit(f"partial read: {len(content)} bytes")
        reads += 1


@pytest.mark.slow
@pytest.mark.parametrize("durable", [True, False])
def test_concurrent_writer_threads_never_fail_and_readers_only_see_whole_files(
    tmp_path: Path, durable: bool
) -> None:
    path = tmp_path / "shared" / "profile.csv"
    write_atomically(path, _payload(0))
    stop = threading.Event()
    with ThreadPoolExecutor(9) as pool:
        reader = pool.submit(_read_until, str(path), stop)
        list(pool.map(_write_many, [str(path)] * 8, range(8), [durable] * 8))
        stop.set()
        reader.result()
    assert _is_whole(path.read_bytes())
    assert sorted(p.name for p in path.parent.iterdir()) == ["profile.csv"], "no temporary file left behind"


@pytest.mark.slow
def test_concurrent_writer_processes_never_fail_and_readers_only_see_whole_files(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "profile.csv"
    write_atomically(path, _payload(0))
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    readers = [context.Process(target=_read_until, args=(str(path), stop)) for _ in range(2)]
    writers = [context.Process(target=_write_many, args=(str(path), n)) for n in range(6)]
    for process in readers + writers:
        process.start()
    for process in writers:
        process.join()
    stop.set()
    for process in readers:
        process.join()
    assert [process.exitcode for process in readers + writers] == [0] * 8
    assert _is_whole(path.read_bytes())
    assert sorted(p.name for p in path.parent.iterdir()) == ["profile.csv"], "no temporary file left behind"


def test_a_failing_write_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "plan.json"
    write_atomically(path, '{"old": true}')

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, '{"new": true}')
    assert path.read_text() == '{"old": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_text_is_written_as_utf8_and_the_folder_is_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "note.txt"
    write_atomically(path, "µs – ok")
    assert path.read_bytes() == "µs – ok".encode()


def _hold_lock(folder: str, mode: str, started: multiprocessing.Event, hold_s: float) -> None:
    with folder_lock(folder, mode):  # type: ignore[arg-type]
        started.set()
        time.sleep(hold_s)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("held", "wanted", "waits"), [("exclusive", "shared", True), ("shared", "shared", False)]
)
def test_an_exclusive_lock_excludes_and_shared_locks_coexist(
    tmp_path: Path, held: str, wanted: str, waits: bool
) -> None:
    context = multiprocessing.get_context("fork")
    started = context.Event()
    holder = context.Process(target=_hold_lock, args=(str(tmp_path), held, started, 0.5))
    holder.start()
    assert started.wait(10)
    begin_s = time.monotonic()
    with folder_lock(tmp_path, wanted):  # type: ignore[arg-type]
        waited_s = time.monotonic() - begin_s
    holder.join()
    assert (waited_s > 0.2) is waits


def test_an_unknown_lock_mode_says_which_modes_exist(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="use 'shared' or 'exclusive'"), folder_lock(tmp_path, "read"):  # type: ignore[arg-type]
        pass
    assert not os.path.exists(tmp_path / atomic.LOCK_FILE_NAME)


def _dead_pid() -> int:
    """The pid of a process that ran and has been reaped."""
    child = multiprocessing.get_context("spawn").Process(target=os.getpid)
    child.start()
    child.join()
    assert child.pid is not None
    return child.pid


@pytest.mark.slow
def test_a_write_removes_the_temporaries_of_killed_writers_of_this_host_only(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    dead = tmp_path / f"{atomic._temporary_prefix(target, _dead_pid())}x1.tmp"
    alive = tmp_path / f"{atomic._temporary_prefix(target, os.getpid())}x2.tmp"
    other_host = tmp_path / f".state.json.another-host-{_dead_pid()}.x3.tmp"
    other_file = tmp_path / f"{atomic._temporary_prefix(tmp_path / 'other.json', _dead_pid())}x4.tmp"
    for temporary in (dead, alive, other_host, other_file):
        temporary.write_text("half a file")
    write_atomically(target, "{}")
    assert target.read_text() == "{}"
    assert not dead.exists(), "a dead writer's temporary stays"
    assert alive.exists() and other_host.exists() and other_file.exists()
