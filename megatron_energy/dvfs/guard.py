"""ClockGuard: the SM clocks this process locked are reset however it ends.

- normal exit: an ``atexit`` hook;
- an exception: use the guard as a context manager (an uncaught exception also ends in the atexit hook);
- SIGINT / SIGTERM: handlers that reset, then hand the signal to the handler that was there before (a
  callable is called; the default action is re-raised with the default disposition; an ignored signal stays
  ignored);
- SIGKILL (or any death that skips Python): the watchdog process (:mod:`megatron_energy.dvfs.watchdog`),
  which outlives this one and resets the GPUs it was told about;
- both killed: the lease file written when a GPU is armed (:mod:`megatron_energy.dvfs.lease`) lets the next
  start on that GPU find the dead owners and reset the clock.

The guard only resets GPUs that were *armed*: :class:`~megatron_energy.dvfs.controller.FrequencyController`
calls :meth:`ClockGuard.arm` just before each real setter call, and its memory clock setter
(``dvfs.memory_clock_setter``) calls :meth:`ClockGuard.arm_memory` before it locks a memory clock, so a dry
run or a monitor-only run never resets (or otherwise touches) anything. SM locked clocks are reset, and memory
locked clocks where one was locked; there is no code path that changes a power limit.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from megatron_energy.dvfs.lease import lease_path, remove_lease, write_lease

if TYPE_CHECKING:
    from zeus.device.gpu.common import GPUs

logger = logging.getLogger(__name__)

GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class ClockGuard:
    """Resets the SM clocks this process locked, on exit, exception, SIGINT/SIGTERM and (watchdog) SIGKILL.

    Create it once per process, before the controller, and pass it to the controller as ``guard``.

    Args:
        gpus: The zeus ``GPUs`` object (real, or simulated: the watchdog then resets the state file).
        watchdog: Start the watchdog process that covers SIGKILL.
        handle_signals: Install SIGINT/SIGTERM handlers (only possible from the main thread; skipped with a
            log line elsewhere).
        watchdog_poll_s: How often the watchdog checks that this process is alive, besides pipe EOF.
        lease_dir: Where the lease files go; default :func:`~megatron_energy.dvfs.lease.run_dir`.
    """

    def __init__(
        self,
        gpus: GPUs,
        *,
        watchdog: bool = True,
        handle_signals: bool = True,
        watchdog_poll_s: float = 0.5,
        lease_dir: Path | None = None,
    ) -> None:
        self.gpus = gpus
        self._lease_dir = lease_dir
        self._leases: dict[int, Path] = {}
        self._armed: set[int] = set()
        self._memory_armed: dict[int, int] = {}
        self._lease_clocks: dict[int, int | None] = {}
        self._lock = threading.RLock()
        self._closed = False
        self._previous_handlers: dict[int, Any] = {}
        self._watchdog = _start_watchdog(watchdog_poll_s) if watchdog else None
        if handle_signals:
            self._install_signal_handlers()
        atexit.register(self.close)

    @property
    def armed(self) -> frozenset[int]:
        """GPU indices whose clocks this process may have locked and not yet reset."""
        return frozenset(self._armed)

    @property
    def watchdog_pid(self) -> int | None:
        """Pid of the watchdog process, if one runs."""
        return self._watchdog.pid if self._watchdog is not None else None

    def arm(self, index: int, clock_mhz: int | None = None) -> None:
        """Record (here, in the watchdog, in a lease file) that GPU ``index``'s clocks are about to be locked.

        Args:
            index: The GPU.
            clock_mhz: The clock about to be locked, for the lease (the first one only).
        """
        with self._lock:
            if index in self._armed:
                return
            self._armed.add(index)
            target = self._target(index)
            lease = self._write_lease(index, clock_mhz)
            if lease is not None:
                target["lease"] = str(lease)
                target["trainer_pid"] = os.getpid()
            self._tell_watchdog({"op": "arm", **target})

    def arm_memory(self, index: int, clock_mhz: int) -> None:
        """Record that GPU ``index``'s memory clock is about to be locked (reset with its SM clock).

        Args:
            index: The GPU.
            clock_mhz: The memory clock about to be locked, for the lease.
        """
        with self._lock:
            if self._memory_armed.get(index) == clock_mhz:
                return
            self.arm(index)
            self._memory_armed[index] = clock_mhz
            target = self._target(index) | {"memory": True}
            lease = self._write_lease(index, self._lease_clocks.get(index))
            if lease is not None:
                target["lease"] = str(lease)
                target["trainer_pid"] = os.getpid()
            self._tell_watchdog({"op": "arm", **target})

    def restore(self) -> None:
        """Reset the SM clocks (and memory clocks, where locked) of every armed GPU now; idempotent."""
        with self._lock:
            for index in sorted(self._armed):
                try:
                    if index in self._memory_armed:
                        self.gpus.reset_memory_locked_clocks(index)
                        del self._memory_armed[index]
                    self.gpus.reset_gpu_locked_clocks(index)
                except Exception as error:  # reset the others; the watchdog retries this one
                    logger.warning("could not reset the clocks of GPU %d: %s", index, error)
                    continue
                self._armed.discard(index)
                lease = self._leases.pop(index, None)
                if lease is not None:
                    remove_lease(lease, os.getpid())
            if not self._armed:
                self._tell_watchdog({"op": "restored"})

    def close(self) -> None:
        """Restore clocks, stop the watchdog and remove the signal handlers; idempotent, runs at exit."""
        if self._closed:
            return
        self.restore()
        self._closed = True
        atexit.unregister(self.close)
        for signum, previous in self._previous_handlers.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous)
        if self._watchdog is not None and self._watchdog.stdin is not None:
            self._watchdog.stdin.close()  # EOF: the watchdog resets what is still armed (nothing) and exits
            try:
                self._watchdog.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                logger.warning("clock watchdog (pid %d) did not exit", self._watchdog.pid)

    def __enter__(self) -> ClockGuard:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _write_lease(self, index: int, clock_mhz: int | None) -> Path | None:
        """Write GPU ``index``'s lease; a failure only loses the repair after a double kill, so it warns."""
        self._lease_clocks[index] = clock_mhz
        try:
            path = lease_path(self.gpus, index, self._lease_dir)
            write_lease(path, self.gpus, index, clock_mhz, self.watchdog_pid, self._memory_armed.get(index))
        except Exception as error:  # the lease must never stop the job from running
            logger.warning(
                "could not write the clock lease of GPU %d (%s); if this process and its watchdog are both "
                "killed, the next job will not know the clock was left locked",
                index,
                error,
            )
            return None
        self._leases[index] = path
        return path

    def _target(self, index: int) -> dict[str, Any]:
        state_path = getattr(self.gpus, "state_path", None)
        if state_path is not None:  # SimulatedGPUs: the watchdog resets the state file
            return {"backend": "simulated", "index": index, "state_path": str(state_path)}
        return {"backend": "zeus", "index": index}

    def _tell_watchdog(self, message: dict[str, Any]) -> None:
        stdin = None if self._watchdog is None else self._watchdog.stdin
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write((json.dumps(message) + "\n").encode())
            stdin.flush()
        except (BrokenPipeError, ValueError):
            logger.warning("the clock watchdog is gone; a SIGKILL would leave GPU clocks locked")

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.info("ClockGuard created off the main thread: no SIGINT/SIGTERM handlers (watchdog only)")
            return
        for signum in GUARDED_SIGNALS:
            self._previous_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.restore()
        previous = self._previous_handlers.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # default action (or a handler not set from Python): re-raise
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


def _start_watchdog(poll_s: float) -> subprocess.Popen[bytes]:
    """Start the watchdog in a fresh interpreter and its own session (so group signals spare it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
    command = [
        sys.executable,
        "-m",
        "megatron_energy.dvfs.watchdog",
        "--parent-pid",
        str(os.getpid()),
        "--poll-s",
        str(poll_s),
    ]
    return subprocess.Popen(command, stdin=subprocess.PIPE, env=env, start_new_session=True)
