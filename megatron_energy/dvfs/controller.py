"""Asynchronous SM-clock controller: one per rank, never stalls the training thread.

The training thread calls :meth:`FrequencyController.request_at_boundary` at each instruction/phase boundary
with the clock the next phase should run at: it records a CUDA event on the current stream and queues the
request (or :meth:`FrequencyController.request` with a CUDA event the caller recorded itself,
e.g. on another stream, or None on CPU / simulated GPUs). The call snaps the clock to a supported one,
drops it when it equals the previous request, and puts it on a bounded queue: no
``torch.cuda.synchronize()``, no NVML call; about a microsecond for ``request`` itself
(``lab/bench_controller.py``) and a few µs with the event record (``lab/gpu_check_dvfs.py``).

The controller's own thread takes requests in order, waits for each boundary event (``event.synchronize()``,
so the change fires when the GPU actually reaches the boundary, not when the CPU enqueued it), then calls
``set_gpu_locked_clocks(index, f, f)``. If the GPU has meanwhile passed later boundaries too, the stale
requests are skipped and only the latest reached one is applied. Every switch is recorded with host-side
timestamps; its latency runs from "boundary observed reached" to "setter returned" (the hardware's own
transition time after the NVML call is not observable here; the spec's ``switch_latency_s`` models it).

A phase switcher (``runtime.running.phase_switcher``) asks for clocks *inside* an instruction from its own
thread with :meth:`FrequencyController.request_inside`: applied at once unless the caller's staleness check
(run under the same lock as every other application) says the instruction has ended, so a phase clock never
lands after the next boundary's clock. The training thread calls :meth:`FrequencyController.allow_repeat`
after the boundary request of an instruction with phase clocks, so the next boundary's request goes out even
when it names the same clock (a phase clock may be in force by then).

In dry-run mode the thread does all of this except calling the setter: it records what it would set. A
setter error (no permission, unsupported GPU) turns the controller into monitor-only with one warning. On
simulated GPUs (``synchronous=True``, chosen by :meth:`FrequencyController.from_handle`) requests apply on
the caller's thread, so a switch lands at exactly the virtual time it was asked for.
torch is only imported by :meth:`FrequencyController.request_at_boundary`.
"""

from __future__ import annotations

import atexit
import bisect
import enum
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from megatron_energy.dvfs.backends import monitor_only_message, supported_sm_clocks_mhz
from megatron_energy.dvfs.memory_clock_setter import MemoryArmer, MemoryClockSetter
from megatron_energy.plugin_threads import register_current_thread

if TYPE_CHECKING:
    from zeus.device.gpu.common import GPUs

    from megatron_energy.dvfs.backends import GpuHandle

logger = logging.getLogger(__name__)

RESET = None
"""Clock value of a request that returns the GPU to its default clocks (``reset_gpu_locked_clocks``)."""


class BoundaryEvent(Protocol):
    """What the controller needs of a boundary marker: ``torch.cuda.Event`` fits."""

    def synchronize(self) -> None:
        """Block until the GPU has passed the boundary."""

    def query(self) -> bool:
        """Return True if the GPU has passed the boundary."""


class ClockArmer(Protocol):
    """Told before the first clock setter for a GPU, so it can reset that GPU however the process ends."""

    def arm(self, index: int, clock_mhz: int | None = None) -> None:
        """Record that this process is about to lock GPU ``index``'s clocks (at ``clock_mhz``)."""


@dataclass(frozen=True)
class SwitchRecord:
    """One clock switch the controller applied (or, in dry-run, would have applied).

    Timestamps are ``time.perf_counter()`` seconds of this process (*measured*, host side).

    Attributes:
        clock_mhz: The clock locked; None for a reset to default clocks.
        requested_at_s: When the training thread called ``request``.
        boundary_reached_at_s: When the controller thread saw the boundary event complete.
        applied_at_s: When the setter returned (dry-run: when it would have been called).
        dry_run: True if no setter was called.
        superseded: Earlier requests skipped because this one's boundary had also been reached.
    """

    clock_mhz: int | None
    requested_at_s: float
    boundary_reached_at_s: float
    applied_at_s: float
    dry_run: bool
    superseded: int = 0

    @property
    def latency_s(self) -> float:
        """Switch latency: boundary reached -> clock applied."""
        return self.applied_at_s - self.boundary_reached_at_s


class _Stop:
    """Queue sentinel that ends the controller thread."""


_STOP = _Stop()
_UNKNOWN = object()


class _Rejected(enum.Enum):
    """A request the controller drops (inactive, closed, or the same as the previous one)."""

    REJECTED = enum.auto()


_REJECTED = _Rejected.REJECTED
_Request = tuple[int | None, BoundaryEvent | None, float]


def snap_clock(clocks_ascending: Sequence[int], mhz: float) -> int:
    """Return the clock in ``clocks_ascending`` nearest to ``mhz`` (ties go to the higher clock).

    Requests outside the supported range clamp to its ends.
    """
    i = bisect.bisect_left(clocks_ascending, mhz)
    if i == 0:
        return clocks_ascending[0]
    if i == len(clocks_ascending):
        return clocks_ascending[-1]
    lower, higher = clocks_ascending[i - 1], clocks_ascending[i]
    return higher if higher - mhz <= mhz - lower else lower


class FrequencyController:
    """Applies SM-clock requests for one GPU from a background thread, at the GPU's phase boundaries.

    ``request`` / ``request_at_boundary`` must be called from one thread (the training thread); everything
    else is thread-safe.

    Args:
        gpus: The zeus ``GPUs`` object (real or simulated).
        index: The GPU this rank controls (CUDA-visible index).
        supported_clocks_mhz: Clocks requests snap to (any order).
        dry_run: Record what would be set; call no setter.
        guard: Told (``arm(index)``) before each real setter call, so the clock can be reset however the
            process ends; see :class:`~megatron_energy.dvfs.guard.ClockGuard`.
        monitor_only: Start inactive: every request is ignored (clock control unavailable).
        max_queue: Bound on queued requests; when full the oldest queued request is dropped.
        max_records: How many switch records to keep (oldest dropped first).
        blocking_events: Create the events of :meth:`request_at_boundary` with
            ``cudaEventBlockingSync``, so the controller thread sleeps instead of spinning a CPU core while it
            waits (tens of µs more wake-up latency; far below a clock switch).
        synchronous: Apply each request on the caller's thread, with no controller thread. For simulated
            GPUs, whose virtual clock only moves when the caller runs work: a switch then lands exactly at
            the virtual time it was asked for, so simulations are deterministic. Never for real GPUs (the
            caller would wait for every boundary and setter).

    The run phase's memory clock goes through :meth:`set_memory_clock` (``dvfs.memory_clock_setter``): the
    same GPU, dry run and guard; :meth:`close` restores it with the SM clock.
    """

    def __init__(
        self,
        gpus: GPUs,
        index: int,
        supported_clocks_mhz: Sequence[int],
        dry_run: bool,
        *,
        guard: ClockArmer | None = None,
        monitor_only: bool = False,
        max_queue: int = 1024,
        max_records: int = 65536,
        blocking_events: bool = True,
        synchronous: bool = False,
    ) -> None:
        if not supported_clocks_mhz:
            raise ValueError("supported_clocks_mhz is empty")
        self.gpus = gpus
        self.index = index
        self.dry_run = dry_run
        self._guard = guard
        self._clocks = sorted(set(supported_clocks_mhz))
        self._snapped: dict[float, int] = {}
        self._max_queue = max_queue
        self._queue: queue.SimpleQueue[_Request | _Stop] = queue.SimpleQueue()
        self._records: deque[SwitchRecord] = deque(maxlen=max_records)
        self._blocking_events = blocking_events
        self._active = not monitor_only
        self.monitor_only_reason: str | None = "clock control unavailable" if monitor_only else None
        self._last_requested: object = _UNKNOWN
        self._applied: object = _UNKNOWN
        self._locked_any = False
        self._counts = {
            "requested": 0,
            "deduped": 0,
            "dropped": 0,
            "superseded": 0,
            "applied": 0,
            "inside": 0,
        }
        self._apply_lock = threading.Lock()  # one application at a time, whichever thread asks
        self._enqueued = 0
        self._done = 0
        self._done_changed = threading.Condition()
        self._closed = False
        self._synchronous = synchronous
        self.memory = MemoryClockSetter(
            gpus, index, dry_run, guard if isinstance(guard, MemoryArmer) else None
        )
        """The memory clock of the run phase (its records, and why the GPU refused one)."""
        self._thread: threading.Thread | None = None
        if not synchronous:
            self._thread = threading.Thread(
                target=self._run, name=f"FrequencyController[{index}]", daemon=True
            )
            self._thread.start()
        atexit.register(self.close)

    @classmethod
    def from_handle(
        cls, handle: GpuHandle, index: int, guard: ClockArmer | None = None
    ) -> FrequencyController:
        """Build the controller a :class:`~megatron_energy.dvfs.backends.GpuHandle`'s mode calls for.

        ``"control"`` sets clocks, ``"dry-run"`` records only, ``"monitor-only"`` ignores requests.
        Simulated GPUs get a ``synchronous`` controller (deterministic virtual time).
        """
        return cls(
            handle.gpus,
            index,
            supported_sm_clocks_mhz(handle.gpus, index),
            dry_run=handle.mode == "dry-run",
            guard=guard,
            monitor_only=handle.mode == "monitor-only",
            synchronous=handle.backend == "simulated",
        )

    @property
    def active(self) -> bool:
        """False once the controller is closed or monitor-only."""
        return self._active and not self._closed

    def request(self, clock_mhz: float | None, boundary_event: BoundaryEvent | None = None) -> bool:
        """Ask for ``clock_mhz`` from ``boundary_event`` on; returns at once.

        Args:
            clock_mhz: The clock for the next phase (snapped to a supported clock), or ``RESET`` (None) to
                return to default clocks.
            boundary_event: A CUDA event recorded at the boundary on the compute stream; None applies as
                soon as the controller thread gets to it (CPU, simulated GPUs).

        Returns:
            True if the request was queued; False if it was dropped as equal to the previous request or the
            controller is inactive.
        """
        clock = self._accept(clock_mhz)
        if clock is _REJECTED:
            return False
        if self._synchronous:
            if boundary_event is not None:
                boundary_event.synchronize()
            now_s = time.perf_counter()
            with self._apply_lock:
                self._apply(clock, now_s, now_s, superseded=0)
        else:
            self._enqueue(clock, boundary_event)
        return True

    def set_memory_clock(self, clock_mhz: int | None) -> None:
        """Run at memory clock ``clock_mhz`` from now on (``None``: stock); nothing when inactive."""
        if self.active:
            self.memory.apply(clock_mhz)

    def request_inside(self, clock_mhz: float, stale: Callable[[], bool]) -> bool:
        """Apply ``clock_mhz`` now, from any thread, unless ``stale()`` says its moment has passed.

        For clocks of phases inside an instruction (``runtime.running.phase_switcher``). ``stale`` is called
        under the lock every application takes, so a request checked as current is applied before any later
        boundary's clock, and one checked after that boundary's clock was applied is dropped. The previous
        request is not deduplicated against (call :meth:`allow_repeat` on the training thread).

        Args:
            clock_mhz: The phase's clock (snapped to a supported clock).
            stale: Whether the instruction the phase belongs to has ended on the GPU.

        Returns:
            True if applied (dry run: recorded); False if stale or the controller is inactive.
        """
        if not self.active:
            return False
        clock = snap_clock(self._clocks, clock_mhz)
        with self._apply_lock:
            if stale():
                return False
            self._counts["inside"] += 1
            now_s = time.perf_counter()
            self._apply(clock, now_s, now_s, superseded=0)
        return True

    def allow_repeat(self) -> None:
        """Let the next :meth:`request` out even if it equals the previous one (training thread only).

        Called after the boundary request of an instruction with phase clocks: one of those may be in force
        when the next boundary comes, so its clock must be requested again.
        """
        self._last_requested = _UNKNOWN

    def request_at_boundary(self, clock_mhz: float | None) -> bool:
        """Like :meth:`request`, recording the boundary event itself on the current CUDA stream.

        A request equal to the previous one is dropped before any event is made or recorded. A synchronous
        controller records no event (there is no GPU timeline to mark).
        """
        if self._synchronous:
            return self.request(clock_mhz)
        clock = self._accept(clock_mhz)
        if clock is _REJECTED:
            return False
        import torch

        event = torch.cuda.Event(blocking=self._blocking_events)
        event.record()
        self._enqueue(clock, event)
        return True

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every request queued so far has been applied or skipped; True if done in time."""
        target = self._enqueued
        with self._done_changed:
            return self._done_changed.wait_for(lambda: self._done >= target, timeout_s)

    def switch_records(self) -> list[SwitchRecord]:
        """Return the switches applied so far (dry-run: would have applied), oldest first."""
        return list(self._records)

    def stats(self) -> dict[str, int]:
        """Return counters: requested, deduped, dropped (queue full), superseded (stale), applied, inside.

        ``inside`` counts the phase clocks :meth:`request_inside` took.
        """
        return dict(self._counts)

    def close(self, reset_clocks: bool = True, timeout_s: float = 5.0) -> None:
        """Stop the controller thread; reset the GPU's clocks if this controller locked them.

        Idempotent; also runs at interpreter exit.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout_s)
        if reset_clocks:
            self.memory.restore()
        if reset_clocks and self._locked_any and not self.dry_run:
            try:
                self.gpus.reset_gpu_locked_clocks(self.index)
            except Exception as error:  # a failed reset must not mask the caller's own exit path
                logger.warning("could not reset the SM clock of GPU %d: %s", self.index, error)

    def _accept(self, clock_mhz: float | None) -> int | Literal[_Rejected.REJECTED] | None:
        """Snap and dedupe on the caller's thread; return the clock to queue or ``_REJECTED``."""
        if not self._active or self._closed:
            return _REJECTED
        counts = self._counts
        counts["requested"] += 1
        if clock_mhz is not None:
            snapped = self._snapped.get(clock_mhz)
            if snapped is None:
                snapped = self._snapped[clock_mhz] = snap_clock(self._clocks, clock_mhz)
            clock_mhz = snapped
        if clock_mhz == self._last_requested:
            counts["deduped"] += 1
            return _REJECTED
        self._last_requested = clock_mhz
        return clock_mhz

    def _enqueue(self, clock_mhz: int | None, boundary_event: BoundaryEvent | None) -> None:
        if self._queue.qsize() >= self._max_queue:
            self._drop_oldest()
        self._enqueued += 1
        self._queue.put((clock_mhz, boundary_event, time.perf_counter()))

    def _drop_oldest(self) -> None:
        try:
            self._queue.get_nowait()
        except queue.Empty:
            return
        self._counts["dropped"] += 1
        self._mark_done(1)

    def _mark_done(self, count: int) -> None:
        with self._done_changed:
            self._done += count
            self._done_changed.notify_all()

    def _run(self) -> None:
        register_current_thread("frequency controller")
        held: _Request | _Stop | None = None
        while True:
            item = held if held is not None else self._queue.get()
            held = None
            if isinstance(item, _Stop):
                return
            clock_mhz, event, requested_at_s = item
            if event is not None:
                event.synchronize()
            reached_at_s = time.perf_counter()
            superseded = 0
            while True:  # later requests whose boundary has also been reached make this one stale
                try:
                    later = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(later, _Stop) or (later[1] is not None and not later[1].query()):
                    held = later
                    break
                clock_mhz, _, requested_at_s = later
                superseded += 1
            self._counts["superseded"] += superseded
            if self._active:
                with self._apply_lock:
                    self._apply(clock_mhz, requested_at_s, reached_at_s, superseded)
            self._mark_done(1 + superseded)

    def _apply(
        self, clock_mhz: int | None, requested_at_s: float, reached_at_s: float, superseded: int
    ) -> None:
        if clock_mhz == self._applied:
            return
        if not self.dry_run:
            try:
                if self._guard is not None:
                    self._guard.arm(self.index, clock_mhz)
                self._locked_any = True
                if clock_mhz is None:
                    self.gpus.reset_gpu_locked_clocks(self.index)
                else:
                    self.gpus.set_gpu_locked_clocks(self.index, clock_mhz, clock_mhz)
            except Exception as error:
                self._become_monitor_only(f"setting the SM clock of GPU {self.index} failed: {error}")
                return
        self._applied = clock_mhz
        self._counts["applied"] += 1
        self._records.append(
            SwitchRecord(
                clock_mhz, requested_at_s, reached_at_s, time.perf_counter(), self.dry_run, superseded
            )
        )

    def _become_monitor_only(self, why: str) -> None:
        self._active = False
        self.monitor_only_reason = why
        logger.warning(monitor_only_message(why))
