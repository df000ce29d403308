"""Phase switchers: requests at their offsets from the instruction's start, stale ones dropped, errors kept.

The thread (``runtime.running.phase_switcher``): CUDA events are stood in for by flags the test sets (the
'GPU' reaching a point); the controller by one that records when each clock was asked for. Timing is host time
(measured), so the bounds leave room for a loaded machine: a request is never early, and late by at most
``LATE_S``. The simulated GPUs' switcher (``runtime.running.simulated_phases``) runs on the virtual clock
with the real controller and simulated GPU (modelled).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

import pytest
from zeus.device.gpu.common import ZeusGPUNotSupportedError

from megatron_energy.config import EnergyConfig, add_energy_args
from megatron_energy.dvfs.controller import FrequencyController
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.simulated import SimulatedGPUs
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.runtime.assembly import build_phase_switcher
from megatron_energy.runtime.control_plane.comms import LocalComms
from megatron_energy.runtime.parts import SwitchCounts
from megatron_energy.runtime.running.phase_switcher import PhaseSwitcher
from megatron_energy.runtime.running.plan_runner import InsideRequest
from megatron_energy.runtime.running.simulated_phases import SimulatedPhaseSwitcher
from megatron_energy.runtime.timing import SimulatedTimer

LATE_S = 0.05
"""How late a request may go out on a busy test machine (the GIL, the scheduler)."""


class FakeEvent:
    """A point on the 'GPU' timeline: reached when the test says so; notes when."""

    def __init__(self, reached: bool = False) -> None:
        self.reached_at_s: float | None = time.perf_counter() if reached else None

    def reach(self) -> None:
        self.reached_at_s = time.perf_counter()

    def query(self) -> bool:
        return self.reached_at_s is not None

    def synchronize(self) -> None:
        while not self.query():
            time.sleep(1e-4)


class RecordingController:
    """Applies inside requests by noting them (host time); can fail or stop on demand."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.active = True
        self.monitor_only_reason: str | None = None
        self.applied: list[tuple[int, float]] = []
        self.repeats = 0
        self._fail_on = fail_on

    def request_inside(self, clock_mhz: float, stale: Callable[[], bool]) -> bool:
        if self._fail_on is not None and int(clock_mhz) == self._fail_on:
            raise OSError("NVML: insufficient permissions")
        if stale():
            return False
        self.applied.append((int(clock_mhz), time.perf_counter()))
        return True

    def allow_repeat(self) -> None:
        self.repeats += 1


def _instruction(microbatch: int) -> Instruction:
    return Instruction(0, 0, microbatch, "forward")


def _wait(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.002)


@pytest.fixture
def switchers():
    made: list[PhaseSwitcher] = []

    def make(controller: RecordingController, **kwargs) -> PhaseSwitcher:
        switcher = PhaseSwitcher(controller, **kwargs)
        made.append(switcher)
        return switcher

    yield make
    for switcher in made:
        switcher.close()


def test_requests_go_out_in_order_at_their_offsets_from_the_gpus_arrival(switchers) -> None:
    controller = RecordingController()
    switcher = switchers(controller)
    anchor = FakeEvent()
    requests = [InsideRequest(0.02, 1200), InsideRequest(0.06, 1500), InsideRequest(0.10, 1300)]
    switcher.begin(_instruction(0), anchor, requests)
    time.sleep(0.05)
    assert controller.applied == []  # the GPU has not reached the instruction: nothing goes out
    anchor.reach()
    _wait(lambda: len(controller.applied) == 3)
    assert [clock for clock, _ in controller.applied] == [1200, 1500, 1300]
    assert anchor.reached_at_s is not None
    for (_, at_s), request in zip(controller.applied, requests, strict=True):
        late_s = at_s - anchor.reached_at_s - request.offset_s
        assert 0.0 <= late_s <= LATE_S
    assert controller.repeats == 1  # the next boundary request is never deduplicated away
    assert switcher.counts.applied == 3 and switcher.counts.stale == 0


def test_requests_of_an_instruction_the_gpu_has_left_are_dropped(switchers) -> None:
    controller = RecordingController()
    switcher = switchers(controller)
    first, first_end, second = FakeEvent(reached=True), FakeEvent(), FakeEvent()
    switcher.begin(_instruction(0), first, [InsideRequest(0.0, 1200), InsideRequest(0.3, 1000)])
    switcher.end(_instruction(0), first_end)
    switcher.begin(_instruction(1), second, [InsideRequest(0.0, 1400)])
    _wait(lambda: len(controller.applied) == 1)
    first_end.reach()  # the instruction ended before its second request's time
    second.reach()
    _wait(lambda: len(controller.applied) == 2)
    assert [clock for clock, _ in controller.applied] == [1200, 1400]
    assert switcher.counts.stale == 1 and switcher.counts.applied == 2


class LateSeenEvent(FakeEvent):
    """An event whose waiter wakes only once the test opens the gate (a thread descheduled for a while)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def synchronize(self) -> None:
        self.gate.wait()
        super().synchronize()


def test_an_instruction_ended_before_its_start_was_seen_makes_no_request(switchers) -> None:
    controller = RecordingController()
    switcher = switchers(controller)
    start, end = LateSeenEvent(), FakeEvent()
    switcher.begin(_instruction(0), start, [InsideRequest(0.0, 1200)])
    switcher.end(_instruction(0), end)
    start.reach()
    end.reach()  # both passed before the thread woke: the request's moment is gone
    start.gate.set()
    _wait(lambda: switcher.counts.stale == 1)
    assert controller.applied == []


def test_on_a_gpu_the_switcher_waits_on_its_own_anchor_recorded_at_the_instruction_start(switchers) -> None:
    controller = RecordingController()
    own: list[FakeEvent] = []
    switcher = switchers(controller, anchor_event=lambda: own.append(FakeEvent()) or own[-1])
    timer_marker = FakeEvent(reached=True)  # the timer's event: not waited on
    switcher.begin(_instruction(0), timer_marker, [InsideRequest(0.0, 1200)])
    assert len(own) == 1  # recorded on the training thread, at begin
    time.sleep(0.05)
    assert controller.applied == []  # the GPU has not reached the switcher's own anchor yet
    own[0].reach()
    _wait(lambda: len(controller.applied) == 1)


def test_a_controller_error_stops_phase_switching_and_is_kept_for_the_session(switchers) -> None:
    controller = RecordingController(fail_on=1000)
    switcher = switchers(controller)
    switcher.begin(
        _instruction(0), FakeEvent(reached=True), [InsideRequest(0.0, 1200), InsideRequest(0.0, 1000)]
    )
    _wait(lambda: switcher.counts.applied == 1)
    _wait(lambda: switcher._error is not None)
    error = switcher.take_error()
    assert isinstance(error, OSError) and "permissions" in str(error)
    assert switcher.take_error() is None  # reported once
    switcher.begin(_instruction(1), FakeEvent(reached=True), [InsideRequest(0.0, 1400)])
    time.sleep(0.05)
    assert [clock for clock, _ in controller.applied] == [1200]  # nothing more after the error


def test_a_controller_that_stops_taking_requests_is_reported(switchers) -> None:
    controller = RecordingController()
    controller.active = False
    controller.monitor_only_reason = "setting the SM clock of GPU 0 failed: no permission"
    switcher = switchers(controller)
    switcher.begin(_instruction(0), FakeEvent(reached=True), [InsideRequest(0.0, 1200)])
    _wait(lambda: switcher._error is not None)
    assert "no permission" in str(switcher.take_error())


def test_cancel_and_a_full_queue_drop_pending_requests(switchers) -> None:
    controller = RecordingController()
    switcher = switchers(controller, max_pending=2)
    blocked = FakeEvent()  # the GPU never gets there: the thread waits on the first job
    switcher.begin(_instruction(0), blocked, [InsideRequest(0.0, 1200)])
    _wait(lambda: not switcher._jobs)
    for microbatch in (1, 2, 3):
        switcher.begin(_instruction(microbatch), FakeEvent(), [InsideRequest(0.0, 1300)])
    assert switcher.counts.dropped == 1  # the oldest queued one
    switcher.cancel()
    assert switcher.counts.dropped == 3
    blocked.reach()
    _wait(lambda: switcher.counts.stale == 1)  # the running one was cancelled too
    assert controller.applied == []


class CountingEvent(FakeEvent):
    """An end marker that counts how often the switcher asks whether the GPU has passed it."""

    def __init__(self) -> None:
        super().__init__()
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return super().query()


def test_the_thread_sleeps_until_a_requests_time_without_polling(switchers) -> None:
    """A plugin thread's work competes with the training thread's launches (the GIL, the driver): the
    thread wakes when a request's time comes, not every few milliseconds before it."""
    controller = RecordingController()
    switcher = switchers(controller)
    end = CountingEvent()
    switcher.begin(_instruction(0), FakeEvent(reached=True), [InsideRequest(0.3, 1200)])
    switcher.end(_instruction(0), end)
    time.sleep(0.2)
    assert end.queries == 0 and controller.applied == []
    _wait(lambda: len(controller.applied) == 1)
    assert end.queries == 1  # the staleness check, once, when the request's time came


def test_cancel_wakes_a_thread_waiting_for_a_requests_time(switchers) -> None:
    controller = RecordingController()
    switcher = switchers(controller)
    switcher.begin(_instruction(0), FakeEvent(reached=True), [InsideRequest(30.0, 1200)])
    _wait(lambda: not switcher._jobs)  # the thread waits for the request 30 s away
    switcher.cancel()
    switcher.begin(_instruction(1), FakeEvent(reached=True), [InsideRequest(0.0, 1400)])
    _wait(lambda: len(controller.applied) == 1, timeout_s=2.0)
    assert [clock for clock, _ in controller.applied] == [1400]


@pytest.mark.slow
def test_the_thread_starts_only_with_the_first_inside_request(switchers) -> None:
    switcher = switchers(RecordingController())
    switcher.begin(_instruction(0), FakeEvent(), [])
    assert not any(thread.name == "PhaseSwitcher" for thread in threading.enumerate())
    switcher.begin(_instruction(0), FakeEvent(), [InsideRequest(0.0, 1200)])
    assert any(thread.name == "PhaseSwitcher" and thread.daemon for thread in threading.enumerate())


@pytest.fixture
def simulated(tmp_path):
    """A simulated H100, its synchronous controller and a timer knowing one instruction class's phases."""
    spec = load_gpu_spec("h100-sxm")
    gpus = SimulatedGPUs(spec, state_path=tmp_path / "state.json")
    controller = FrequencyController(gpus, 0, spec.sm_clocks_mhz, dry_run=False, synchronous=True)
    phases = (WorkProfile(0.05, 0.0), WorkProfile(0.0, 0.08), WorkProfile(0.05, 0.0))
    work = {_instruction(0).work: sum(phases[1:], phases[0])}
    timer = SimulatedTimer(gpus, 0, work, LocalComms(), dag=None, phases={key: phases for key in work})
    yield spec, gpus, controller, timer
    controller.close()


def test_the_simulated_gpu_switches_at_the_offsets_on_its_virtual_clock(simulated) -> None:
    spec, gpus, controller, timer = simulated
    switcher = SimulatedPhaseSwitcher(controller, timer)
    model = GpuPowerModel(spec)
    instruction = _instruction(0)
    whole = timer._work[instruction.work]
    controller.request(1980)
    start_s = gpus.virtual_time_s(0)
    # down for the memory phase at its start, up again one switch latency before the compute phase
    requests = [InsideRequest(0.05, 1200), InsideRequest(0.12, 1980), InsideRequest(5.0, 900)]
    timer.begin(instruction)
    switcher.begin(instruction, None, requests)
    timer.end(instruction)
    switcher.end(instruction, None)
    assert gpus.state(0).set_calls == 3  # the boundary's clock, then two inside it; the third never came
    assert gpus.current_clock_mhz(0) == 1980
    (_, time_s, energy_j) = timer._runs[-1]
    assert time_s == pytest.approx(gpus.virtual_time_s(0) - start_s)
    assert energy_j < model.energy_j(whole, 1980)  # the memory phase ran cheaper
    assert switcher.counts == SwitchCounts(scheduled=3, applied=2, stale=1)
    assert switcher.take_error() is None


def test_a_controller_that_stops_ends_simulated_phase_switching_with_an_error(simulated) -> None:
    _, gpus, controller, timer = simulated
    switcher = SimulatedPhaseSwitcher(controller, timer)
    instruction = _instruction(0)

    def refuse(*args: object) -> None:
        raise ZeusGPUNotSupportedError("no permission")

    gpus.lock_clocks = refuse  # type: ignore[method-assign]
    timer.begin(instruction)
    switcher.begin(instruction, None, [InsideRequest(0.01, 1200), InsideRequest(0.02, 1500)])
    timer.end(instruction)
    error = switcher.take_error()
    assert error is not None and "no permission" in str(error)
    assert switcher.counts.applied == 0 and switcher.counts.dropped == 1


def test_the_flag_chooses_the_switcher_or_none(simulated) -> None:
    _, _, controller, timer = simulated
    parser = add_energy_args(argparse.ArgumentParser())
    auto = EnergyConfig.from_args(parser.parse_args(["--energy-optimise"]))
    off = EnergyConfig.from_args(parser.parse_args(["--energy-optimise", "--energy-phase-switching", "off"]))
    assert isinstance(build_phase_switcher(auto, controller, timer), SimulatedPhaseSwitcher)
    assert build_phase_switcher(off, controller, timer) is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--energy-optimise", "--energy-phase-switching", "on"])
