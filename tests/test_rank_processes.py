"""The demo's rank processes: output logged and echoed, Megatron's arguments kept to the log, no orphans.

Each test runs a real parent process (``python -c``) that calls ``run_ranks`` on a real child command, then
ends that parent the way a user or the system would, and checks that the child went with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from megatron_energy.commands.rank_processes import run_ranks

pytestmark = pytest.mark.slow  # starts Python processes

SLEEPER = "import os, time; print('child', os.getpid(), flush=True); time.sleep(120)"
"""A rank that prints its pid and never ends by itself."""


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def start_parent(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """A parent running ``run_ranks`` on the sleeper; returns it and the sleeper's pid."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from megatron_energy.commands.rank_processes import run_ranks
        sys.exit(run_ranks([sys.executable, "-c", {SLEEPER!r}], dict(os.environ),
                           Path({str(tmp_path / "ranks.log")!r}), lambda line: print(line, flush=True)))
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=as_from_a_terminal,
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.startswith("child "), line
    return parent, int(line.split()[1])


def as_from_a_terminal() -> None:
    """SIGINT delivered and handled as a terminal's Ctrl-C would be, whatever the test process inherited.

    A shell's background job (pytest started with ``&``) ignores SIGINT, and Python installs no
    KeyboardInterrupt handler for a signal ignored at its start; a thread of a test runner may also block it,
    and a fork keeps the forking thread's signal mask across ``exec``.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_the_ranks_die_with_their_parent(tmp_path: Path, how: signal.Signals) -> None:
    parent, child = start_parent(tmp_path)
    try:
        assert alive(child)
        os.kill(parent.pid, how)
        parent.wait(timeout=30)
        assert gone_within(child, 15), f"the rank outlived a parent ended by {how.name}"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_output_is_logged_whole_and_echoed_without_megatrons_arguments(tmp_path: Path) -> None:
    printing = (
        "print('using world size: 2');"
        "print('------------------------ arguments ------------------------');"
        "print('  lr .............. 0.0001');"
        "print('-------------------- end of arguments ---------------------');"
        "print(' [2026-01-01 00:00:00] iteration        1/       1 |')"
    )
    echoed: list[str] = []
    log = tmp_path / "ranks.log"
    status = run_ranks([sys.executable, "-c", printing], dict(os.environ), log, echoed.append)
    assert status == 0
    assert echoed == [
        "using world size: 2",
        f"(Megatron's arguments: in {log})",
        " [2026-01-01 00:00:00] iteration        1/       1 |",
    ]
    assert "  lr .............. 0.0001" in log.read_text().splitlines()


def test_the_exit_status_of_the_ranks_is_returned(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; print('failing'); sys.exit(3)"]
    assert run_ranks(command, dict(os.environ), tmp_path / "ranks.log", lambda line: None) == 3
