"""The plugin's background threads and the CPU time each has used, read from any thread.

Every thread the plugin starts beside the training thread (the energy meter's worker, the frequency
controller, the phase switcher) registers itself here when it starts. :func:`cpu_seconds` reads each
registered thread's CPU clock (``pthread_getcpuclockid`` + ``clock_gettime``: one system call per thread,
no GIL held while the kernel answers), so the session can count the plugin's cost on every thread, not only
the time its hooks take on the training thread (``runtime.energy_log.host_cost``). A thread that has ended
keeps the last figure read for it. All figures are *measured* (the kernel's per-thread CPU accounting).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

_LOCK = threading.Lock()
_THREADS: dict[int, _Registered] = {}


@dataclass
class _Registered:
    name: str
    clock_id: int
    last_s: float = 0.0


def register_current_thread(name: str) -> None:
    """Register the calling thread under ``name`` (call it first thing in the thread's target).

    Threads of the same name (one per GPU, one per session) add up in :func:`cpu_seconds`.
    """
    ident = threading.get_ident()
    try:
        clock_id = time.pthread_getcpuclockid(ident)
    except (AttributeError, OSError):  # a platform without per-thread CPU clocks: nothing to count
        return
    with _LOCK:
        _THREADS[ident] = _Registered(name, clock_id)


def cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by the registered threads, summed per name."""
    totals: dict[str, float] = {}
    with _LOCK:
        for thread in _THREADS.values():
            with contextlib.suppress(OSError):  # a thread that has ended keeps its last reading
                thread.last_s = time.clock_gettime(thread.clock_id)
            totals[thread.name] = totals.get(thread.name, 0.0) + thread.last_s
    return totals
