"""The session's energy meter, read off the training thread where a real counter is read.

One read of NVML's total-energy counter takes about 4 ms of host time on an H200 (measured,
``README.md``, *What it costs*), once per step at the step's end. On the launcher path the in-process
overhead check (``runtime.energy_log.overhead_check``) measured the plugin's host time as the iteration's
slowdown, so the read is not always hidden behind queued GPU work. :class:`MeterThread` owns the meter and
reads it on one worker thread, in the order the laps are asked for (a single-worker executor); the training
thread only queues the lap (:meth:`MeterThread.lap_later`) and collects the window when the step's lagged
timing comes, one step later. The NVML call releases the GIL (ctypes), so the read overlaps the training
thread's work. The lap's timestamps are those of the read, a few µs after it was asked for.

Simulated GPUs keep their reads on the caller's thread (``synchronous``): their counter is virtual and
advances with the work the training thread's hooks emulate, so a read must land exactly where it is asked
for. Synchronous laps (:meth:`MeterThread.lap`) wait for the queued ones first, so every lap sees the same
order as on one thread.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from megatron_energy.dvfs.meter import EnergyWindow
from megatron_energy.plugin_threads import register_current_thread
from megatron_energy.runtime.parts import Meter


class MeterThread:
    """A :class:`~megatron_energy.runtime.parts.Meter` whose laps can be read on a worker thread.

    Args:
        meter: The meter it owns (no one else may lap it).
        synchronous: Read on the caller's thread (simulated GPUs).
    """

    def __init__(self, meter: Meter, synchronous: bool) -> None:
        self._meter = meter
        self._executor = (
            None
            if synchronous
            else ThreadPoolExecutor(
                1,
                thread_name_prefix="energy-meter",
                initializer=register_current_thread,
                initargs=("energy meter",),
            )
        )

    def lap_later(self, name: str = "iteration") -> Future[EnergyWindow | None]:
        """Queue a lap; its window is the future's result (at once when synchronous)."""
        if self._executor is not None:
            return self._executor.submit(self._meter.lap, name)
        done: Future[EnergyWindow | None] = Future()
        done.set_result(self._meter.lap(name))
        return done

    def lap(self, name: str = "iteration") -> EnergyWindow | None:
        """Lap now, after every queued lap, and return the window."""
        return self.lap_later(name).result()

    def close(self) -> None:
        """Finish the queued laps and stop the worker."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
