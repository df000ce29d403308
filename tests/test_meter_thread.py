"""The session's meter reader: laps on a worker thread keep their order and their windows."""

from __future__ import annotations

import threading
import time

from megatron_energy.dvfs.meter import EnergyWindow
from megatron_energy.runtime.energy_log.meter_thread import MeterThread


class SlowCounter:
    """A meter whose every lap takes ``read_s`` and returns the lap's number; records the reading thread."""

    def __init__(self, read_s: float) -> None:
        self.read_s = read_s
        self.laps: list[str] = []
        self.threads: set[str] = set()

    def lap(self, name: str = "iteration") -> EnergyWindow | None:
        time.sleep(self.read_s)
        self.laps.append(name)
        self.threads.add(threading.current_thread().name)
        number = float(len(self.laps))
        return EnergyWindow(name, number - 1, number, {0: number}, number, None, True, False, "measured")


def test_queued_laps_return_at_once_and_are_read_in_order_off_the_calling_thread() -> None:
    counter = SlowCounter(read_s=0.02)
    laps = MeterThread(counter, synchronous=False)
    began = time.perf_counter()
    pending = [laps.lap_later() for _ in range(3)]
    assert time.perf_counter() - began < 0.02  # the caller never waited for a read
    now = laps.lap("overhead-check")  # a synchronous lap waits for the queued ones first
    assert [p.result().energy_j for p in pending] == [1.0, 2.0, 3.0]
    assert now is not None and now.energy_j == 4.0
    assert counter.laps == ["iteration"] * 3 + ["overhead-check"]
    assert threading.current_thread().name not in counter.threads
    laps.close()


def test_a_synchronous_reader_reads_on_the_callers_thread() -> None:
    counter = SlowCounter(read_s=0.0)
    laps = MeterThread(counter, synchronous=True)
    assert laps.lap_later().done()
    assert counter.threads == {threading.current_thread().name}
    laps.close()
