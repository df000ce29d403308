"""Clock watchdog: a separate process that resets a training process's locked SM clocks when it dies.

:class:`~megatron_energy.dvfs.guard.ClockGuard` starts it (``python -m megatron_energy.dvfs.watchdog
--parent-pid PID``, a fresh interpreter in its own session, never a fork carrying CUDA state) and writes
one JSON message per line to its stdin:

- ``{"op": "arm", "backend": "zeus", "index": 0}`` or
  ``{"op": "arm", "backend": "simulated", "index": 0, "state_path": "..."}``: the parent is about to lock
  that GPU's clocks (with ``"lease"`` and ``"trainer_pid"`` when the parent wrote a lease file, which the
  watchdog removes after its reset);
- ``{"op": "restored"}``: the parent reset every clock it locked; nothing is armed any more.

The parent is gone when its end of the pipe closes (EOF) or the watchdog's parent pid changes (checked every
``--poll-s`` seconds, in case a forked child of the trainer keeps the pipe open). Then every GPU still armed
gets ``reset_gpu_locked_clocks`` (real GPUs through zeus, i.e. NVML or zeusd; simulated GPUs by rewriting
their state file) and the watchdog exits. Only SM locked clocks are reset: power limits and memory clocks
are never touched. SIGINT is ignored (a Ctrl-C reaches the trainer, which resets its own clocks); SIGTERM
resets what is armed and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
from pathlib import Path
from typing import Any

from megatron_energy.dvfs.lease import remove_lease

READ_CHUNK_BYTES = 4096


class _TerminatedError(Exception):
    """Raised by the SIGTERM handler to leave the wait loop."""


class _ArmedGpus:
    """GPUs the parent may have locked; resets them on request."""

    def __init__(self) -> None:
        self._armed: dict[tuple[str, str, int], dict[str, Any]] = {}
        self._zeus_gpus: Any = None
        self._reset_state_file: Any = None

    def handle(self, message: dict[str, Any]) -> None:
        if message["op"] == "restored":
            self._armed.clear()
        elif message["op"] == "arm":
            key = (message["backend"], message.get("state_path", ""), int(message["index"]))
            self._armed[key] = message
            try:
                self._prepare(message["backend"])
            except Exception as error:  # the reset retries; say now that it may fail
                _log(f"cannot prepare a {message['backend']} reset yet: {error}")
        else:
            _log(f"ignoring unknown message {message!r}")

    def _prepare(self, backend: str) -> None:
        """Import and open what a reset needs now, so the reset after a crash is quick."""
        if backend == "simulated" and self._reset_state_file is None:
            from megatron_energy.dvfs.simulated_state import reset_state_file

            self._reset_state_file = reset_state_file
        elif backend == "zeus" and self._zeus_gpus is None:
            from zeus.device import get_gpus

            self._zeus_gpus = get_gpus()

    def reset_all(self, parent_pid: int) -> None:
        for backend, state_path, index in sorted(self._armed):
            try:
                self._prepare(backend)
                if backend == "simulated":
                    self._reset_state_file(state_path, [index])
                else:
                    if self._armed[(backend, state_path, index)].get("memory"):
                        self._zeus_gpus.reset_memory_locked_clocks(index)
                    self._zeus_gpus.reset_gpu_locked_clocks(index)
                _log(
                    f"reset the SM clock of {backend} GPU {index}: process {parent_pid} ended with it locked"
                )
                self._remove_lease(self._armed[(backend, state_path, index)])
            except Exception as error:  # keep resetting the others
                _log(f"could not reset the SM clock of {backend} GPU {index}: {error}")
        self._armed.clear()

    @staticmethod
    def _remove_lease(message: dict[str, Any]) -> None:
        if "lease" in message:
            remove_lease(Path(message["lease"]), int(message["trainer_pid"]))


def _log(text: str) -> None:
    print(f"[megatron_energy clock watchdog] {text}", file=sys.stderr, flush=True)


def _parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


def watch(parent_pid: int, poll_s: float, fd: int) -> None:
    """Read messages from ``fd`` until the parent is gone, then reset whatever is still armed.

    Once the parent is gone, messages it wrote before dying are still read (a watchdog that starts slowly
    may find the parent already dead and its ``arm`` messages waiting in the pipe).
    """
    armed = _ArmedGpus()
    pending = b""
    try:
        while True:
            parent_alive = _parent_alive(parent_pid)
            readable, _, _ = select.select([fd], [], [], poll_s if parent_alive else 0.0)
            if not readable:
                if parent_alive:
                    continue
                break
            chunk = os.read(fd, READ_CHUNK_BYTES)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    armed.handle(json.loads(line))
    except _TerminatedError:
        pass
    finally:
        armed.reset_all(parent_pid)


def _on_sigterm(signum: int, frame: object) -> None:
    raise _TerminatedError


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m megatron_energy.dvfs.watchdog --parent-pid PID``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, required=True, help="pid of the training process watched")
    parser.add_argument("--poll-s", type=float, default=0.5, help="how often to check the parent pid")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    watch(args.parent_pid, args.poll_s, sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
