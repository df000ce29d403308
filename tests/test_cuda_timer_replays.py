"""``CudaEventTimer`` on replayed CUDA graphs, on a stand-in device timeline (a CPU has no CUDA events).

The stand-in gives each event the device time at which it is recorded; a graph's markers are re-recorded by
each replay (:meth:`FakeDevice.replay`). What is checked is the timer's own logic: a replayed step is read
before the next replay records its markers again, and its iteration time is the device's (from the event
after the previous replay to the one after this), however far the host runs ahead.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.runtime.cuda_timer import CudaEventTimer


class FakeEvent:
    """An event of the stand-in device: the device time (ms) of its latest record."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.time_ms: float | None = None

    def record(self, stream: object = None) -> None:
        self.time_ms = self.device.now_ms

    def synchronize(self) -> None:
        assert self.time_ms is not None, "waited on an event never recorded"

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.time_ms is not None and end.time_ms is not None
        return end.time_ms - self.time_ms


class FakeDevice:
    """The device's clock (ms) and torch's few CUDA calls the timer makes."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.cuda = SimpleNamespace(
            Event=lambda **_: FakeEvent(self), current_stream=lambda: None, synchronize=lambda: None
        )

    def replay(self, markers: list[FakeEvent], span_ms: float) -> None:
        """Run the graph: its markers are recorded at equal steps over ``span_ms``."""
        for i, marker in enumerate(markers):
            self.now_ms += span_ms / (len(markers) - 1) if i else 0.0
            marker.time_ms = self.now_ms


@pytest.fixture
def timed() -> tuple[CudaEventTimer, FakeDevice]:
    timer = CudaEventTimer.__new__(CudaEventTimer)
    device = FakeDevice()
    CudaEventTimer.__init__(timer)
    timer._torch = device  # the boundary: torch's CUDA calls
    return timer, device


def test_replayed_steps_are_read_before_the_next_replay_and_timed_on_the_device(timed) -> None:
    timer, device = timed
    steps = [Instruction(0, 0, 0, "forward"), Instruction(0, 0, 0, "backward")]
    markers = [FakeEvent(device) for _ in range(4)]
    marks = [(steps[0], markers[0], markers[1]), (steps[1], markers[2], markers[3])]
    timings = []
    for span_ms, tail_ms in ((90.0, 30.0), (120.0, 30.0), (60.0, 40.0)):
        timer.step_begin()
        timer.replayed(marks, [])
        device.replay(markers, span_ms)
        timings += timer.finish_step(lagged=True)  # the host seals at once: the GPU has just started
        device.now_ms += tail_ms  # the optimizer step after the graph
    timings += timer.flush()
    assert len(timings) == 3
    # each step's own span, although every replay recorded the same markers again
    assert [round(1e3 * t.intrinsic_s) for t in timings] == [90, 120, 60]
    # the device's iteration: previous replay's end to this replay's end (tail of the previous one included)
    assert timings[0].cycle_s is None or timings[0].cycle_s >= 0
    assert [round(1e3 * t.cycle_s) for t in timings[1:]] == [30 + 120, 30 + 60]
