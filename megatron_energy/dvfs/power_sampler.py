"""A background thread reading one GPU's power and SM clock every few tens of milliseconds into a ring buffer.

:class:`PowerSampler` reads a :class:`~megatron_energy.dvfs.power_reader.PowerReader` (averaged power,
instant-power field, SM clock; read-only) every ``period_s`` and keeps the readings in a bounded ring
(:data:`RING_SECONDS` of them, preallocated), from which :meth:`PowerSampler.samples` copies a span. Beside
the training thread it costs little: between reads it sleeps (``threading.Event.wait``, no GIL held), each
read is two NVML calls that release the GIL (their CPU time, in the driver, is most of the thread's: the
Python around them is ~4 µs a read), and it holds the GIL only to store four numbers. Work handed to it
(:meth:`PowerSampler.run_beside`: the power log's interval figures) runs after a read, one piece per read,
so the training thread does none of it. It registers as ``power sampler`` with
:mod:`~megatron_energy.plugin_threads`, so its CPU time is counted with the plugin's other threads
(``runtime.energy_log.host_cost``).

The period should not be much shorter than the instant field's refresh (about 100 ms on an H100, measured):
the default :data:`DEFAULT_PERIOD_S` reads each refresh about twice. Its time stamps come from the same clock
as the energy meter's (``dvfs.meter``): ``time.monotonic`` on a GPU, the GPU's virtual time on a simulated
one, whose readings are then as dense in virtual time as the emulation's pace allows (the figures built from
them state the spacing they had). Where an NVML read fails, the thread stops and :attr:`PowerSampler.error`
says why; the readings so far stay.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from megatron_energy.dvfs.power_reader import PowerReader, open_power_reader
from megatron_energy.errors import EnergyValueError
from megatron_energy.plugin_threads import register_current_thread

if TYPE_CHECKING:
    from megatron_energy.dvfs.backends import GpuHandle

logger = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 0.05
"""Seconds between reads: about two reads per refresh of the instant field (~100 ms on an H100)."""
MIN_PERIOD_S = 0.01
"""The shortest period allowed: NVML refreshes the instant field far more slowly than that."""
RING_SECONDS = 600.0
"""How many seconds of readings the ring holds (at 50 ms, 12,000 readings of four numbers: 384 kB)."""
THREAD_NAME = "power sampler"
"""The name the thread's CPU time is counted under (``plugin_threads``)."""
_COLUMNS = 4  # time, averaged power, instant power, SM clock


@dataclass(frozen=True)
class PowerSamples:
    """One GPU's readings over a span, oldest first; each holds until the next (a step function).

    Attributes:
        time_s: When each reading was taken (the sampler's clock). Units: s.
        average_w: NVML's averaged power at each. Units: W.
        instant_w: The instant-power field at each (the averaged power where the field is unsupported).
        sm_clock_mhz: The SM clock at each. Units: MHz.
        source: ``"measured"`` (NVML) or ``"modelled"`` (a simulated GPU).
        instant_source: What ``instant_w`` was read from (``PowerReader.instant_source``).
        period_s: The period the sampler was asked to read at. Units: s.
        refresh_s: The time over which ``instant_w`` holds still (``PowerReader.refresh_s``). Units: s.
        overwritten: Whether the ring had already dropped readings of the span asked for.
    """

    time_s: np.ndarray
    average_w: np.ndarray
    instant_w: np.ndarray
    sm_clock_mhz: np.ndarray
    source: Literal["measured", "modelled"]
    instant_source: str
    period_s: float
    refresh_s: float
    overwritten: bool = False

    def __len__(self) -> int:
        return len(self.time_s)


class PowerSampler:
    """Reads one GPU's power and SM clock every ``period_s`` on a thread of its own (module docstring).

    Args:
        reader: The GPU's reads.
        period_s: Seconds between reads (at least :data:`MIN_PERIOD_S`).
        source: ``"measured"`` or ``"modelled"``: where the readings come from.
        clock: The time stamps' clock; default ``time.monotonic``.
        capacity: Readings the ring holds; default :data:`RING_SECONDS` worth.

    Raises:
        EnergyValueError: A period below :data:`MIN_PERIOD_S`, or a capacity below 2.
    """

    def __init__(
        self,
        reader: PowerReader,
        period_s: float = DEFAULT_PERIOD_S,
        *,
        source: Literal["measured", "modelled"] = "measured",
        clock: Callable[[], float] = time.monotonic,
        capacity: int | None = None,
    ) -> None:
        if not period_s >= MIN_PERIOD_S:
            raise EnergyValueError(
                f"power sampling period {period_s!r} s is below {MIN_PERIOD_S} s: NVML's instant power "
                "refreshes about every 0.1 s, give 0.02-0.1 s"
            )
        capacity = capacity if capacity is not None else int(RING_SECONDS / period_s)
        if capacity < 2:
            raise EnergyValueError(f"a power sampler's ring holds at least 2 readings, not {capacity}")
        self.reader = reader
        self.period_s = period_s
        self.source: Literal["measured", "modelled"] = source
        self.clock = clock
        self.error: str | None = None
        """Why the thread stopped before :meth:`close`, if it did."""
        self._ring = np.zeros((capacity, _COLUMNS))
        self._written = 0  # readings written since the start; the newest is at (_written - 1) % capacity
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beside: deque[Callable[[], None]] = deque()
        """Work handed to the thread (:meth:`run_beside`), oldest first."""

    @classmethod
    def from_handle(cls, handle: GpuHandle, index: int, period_s: float = DEFAULT_PERIOD_S) -> PowerSampler:
        """The sampler of GPU ``index`` of ``handle``, on the meter's clock (virtual when simulated).

        Raises:
            PowerReadingsUnavailableError: The GPU has no NVML handle.
        """
        virtual_time_s = getattr(handle.gpus, "virtual_time_s", None)
        clock = (lambda: virtual_time_s(index)) if virtual_time_s is not None else time.monotonic
        reader = open_power_reader(handle.gpus, index)
        return cls(reader, period_s, source=handle.energy_source, clock=clock)

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the thread and wait for it (the readings stay); work handed to it and not run is dropped."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._beside.clear()

    def run_beside(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the sampler's thread after one of its next reads (in the order handed over).

        Where the thread does not run (not started, closed, or stopped on an NVML error), ``job`` runs here,
        at once, after any work handed over before it. A job that raises is reported; the thread reads on.
        """
        if self._thread is not None and self._thread.is_alive() and not self._stop.is_set():
            self._beside.append(job)
            return
        self._beside.append(job)
        while self._beside:
            self._run_job(self._beside.popleft())

    def newest_s(self) -> float | None:
        """When the newest reading was taken (the sampler's clock), or ``None`` before the first."""
        with self._lock:
            return float(self._ring[(self._written - 1) % len(self._ring), 0]) if self._written else None

    def read_once(self) -> None:
        """Take one reading into the ring (the thread's step; tests call it directly).

        A reading whose time is not after the newest one's (a simulated GPU's virtual time stood still)
        replaces it.
        """
        reading = self.reader.read()
        row = (self.clock(), reading.average_w, reading.instant_w, reading.sm_clock_mhz)
        with self._lock:
            capacity = len(self._ring)
            newest = (self._written - 1) % capacity
            if self._written and row[0] <= self._ring[newest, 0]:
                self._ring[newest] = row
                return
            self._ring[self._written % capacity] = row
            self._written += 1

    def samples(self, start_s: float = -np.inf, end_s: float = np.inf) -> PowerSamples:
        """The readings taken in ``[start_s, end_s]``, with the one before ``start_s`` that holds into it."""
        with self._lock:
            capacity = len(self._ring)
            count = min(self._written, capacity)
            order = np.arange(self._written - count, self._written) % capacity
            rows = self._ring[order].copy()
        times = rows[:, 0]
        first = max(0, int(np.searchsorted(times, start_s, side="right")) - 1)
        last = int(np.searchsorted(times, end_s, side="right"))
        kept = rows[first:last]
        overwritten = self._written > capacity and (not count or times[0] > start_s)
        return PowerSamples(
            kept[:, 0],
            kept[:, 1],
            kept[:, 2],
            kept[:, 3],
            self.source,
            self.reader.instant_source,
            self.period_s,
            self.reader.refresh_s,
            bool(overwritten),
        )

    def _run(self) -> None:
        """Read every period, on a fixed cadence, until closed or an NVML read fails."""
        register_current_thread(THREAD_NAME)
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                self.read_once()
            except Exception as problem:  # an NVML error: stop reading, keep what was read
                self.error = f"power sampling stopped: {type(problem).__name__}: {problem}"
                return
            if self._beside:  # one piece of handed-over work per read: no long hold of the GIL
                self._run_job(self._beside.popleft())
            due += self.period_s
            now = time.monotonic()
            if due < now:  # a read ran late: skip the missed reads rather than catch up in a burst
                due = now + self.period_s
            self._stop.wait(due - now)

    @staticmethod
    def _run_job(job: Callable[[], None]) -> None:
        """Run one piece of handed-over work; one that raises is reported, never into the caller."""
        try:
            job()
        except Exception:
            logger.exception("[energy] work handed to the power sampler's thread failed")
