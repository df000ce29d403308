import sys
import threading
import time
import types

import pytest

from megatron_energy.dvfs.backends import open_gpus
from megatron_energy.dvfs.controller import RESET, FrequencyController, snap_clock
from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.dvfs.simulated import SimulatedGPUs
from megatron_energy.dvfs.spec import load_gpu_spec


class FakeBoundaryEvent:
    """Stands in for a CUDA event: the test decides when the 'GPU' reaches the boundary."""

    def __init__(self, reached: bool = False) -> None:
        self._reached = threading.Event()
        if reached:
            self._reached.set()

    def reach(self) -> None:
        self._reached.set()

    def synchronize(self) -> None:
        self._reached.wait()

    def query(self) -> bool:
        return self._reached.is_set()


class FakeCudaEvent(FakeBoundaryEvent):
    """torch.cuda.Event stand-in: each record() marks a new boundary the 'GPU' has not reached yet."""

    def __init__(self, blocking: bool = False) -> None:
        super().__init__()
        self.blocking = blocking

    def record(self) -> None:
        self._reached.clear()


def wait_until(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.001)


@pytest.fixture
def spec():
    return load_gpu_spec("h200")


@pytest.fixture
def gpus(spec, tmp_path):
    return SimulatedGPUs(spec, state_path=tmp_path / "state.json")


@pytest.fixture
def make_controller(gpus, spec):
    made = []

    def make(**kwargs):
        kwargs.setdefault("dry_run", False)
        controller = FrequencyController(gpus, 0, spec.sm_clocks_mhz, **kwargs)
        made.append(controller)
        return controller

    yield make
    for controller in made:
        controller.close()


def test_snap_clock_picks_nearest_and_ties_go_up():
    clocks = [345, 360, 375]
    assert snap_clock(clocks, 352.5) == 360
    assert snap_clock(clocks, 350) == 345
    assert snap_clock(clocks, 10) == 345
    assert snap_clock(clocks, 9999) == 375


def test_requests_apply_in_order_at_their_boundaries_and_dedupe(make_controller, gpus):
    controller = make_controller()
    wanted = [1410, 1410, 1200, 1200, 1410]
    events = [FakeBoundaryEvent() for _ in wanted]
    queued = [controller.request(clock, event) for clock, event in zip(wanted, events, strict=True)]
    assert queued == [True, False, True, False, True]
    time.sleep(0.05)
    assert gpus.state(0).set_calls == 0  # no boundary reached yet: nothing applied
    applied = []
    for event, was_queued in zip(events, queued, strict=True):
        event.reach()
        if was_queued:
            expected = len(applied) + 1
            wait_until(lambda: len(controller.switch_records()) == expected)  # noqa: B023
            applied.append(gpus.state(0).locked_sm_clock_mhz)
    assert applied == [1410, 1200, 1410]
    assert [r.clock_mhz for r in controller.switch_records()] == [1410, 1200, 1410]
    assert gpus.state(0).set_calls == 3
    assert controller.stats()["deduped"] == 2
    for record in controller.switch_records():
        assert record.requested_at_s <= record.boundary_reached_at_s <= record.applied_at_s
        assert record.latency_s >= 0


def test_requests_snap_to_supported_clocks(make_controller, gpus, spec):
    controller = make_controller()
    controller.request(1401)
    assert controller.flush(5)
    assert gpus.state(0).locked_sm_clock_mhz == 1395
    controller.request(5000)
    controller.request(1980)  # same clock after snapping: not re-sent
    assert controller.flush(5)
    assert gpus.state(0).set_calls == 2
    assert gpus.state(0).locked_sm_clock_mhz == spec.max_sm_clock_mhz


def test_later_reached_boundaries_supersede_stale_requests(make_controller, gpus):
    controller = make_controller()
    first = FakeBoundaryEvent()
    controller.request(1200, first)
    controller.request(1300, FakeBoundaryEvent(reached=True))
    controller.request(1500, FakeBoundaryEvent(reached=True))
    first.reach()
    assert controller.flush(5)
    records = controller.switch_records()
    assert [(r.clock_mhz, r.superseded) for r in records] == [(1500, 2)]
    assert gpus.state(0).set_calls == 1


def test_dry_run_records_but_never_calls_a_setter(make_controller, gpus):
    controller = make_controller(dry_run=True)
    for clock in (1200, 1500, 900):
        controller.request(clock)
        assert controller.flush(5)
    controller.request(RESET)
    assert controller.flush(5)
    assert [r.clock_mhz for r in controller.switch_records()] == [1200, 1500, 900, None]
    assert all(r.dry_run for r in controller.switch_records())
    controller.close()
    state = gpus.state(0)
    assert (state.set_calls, state.reset_calls, state.locked_sm_clock_mhz) == (0, 0, None)


def test_request_never_blocks_and_full_queue_drops_oldest(make_controller, gpus):
    controller = make_controller(max_queue=4)
    blocker = FakeBoundaryEvent()
    controller.request(1000, blocker)
    wait_until(lambda: controller._queue.qsize() == 0)  # the thread now waits on `blocker`
    start = time.perf_counter()
    for i in range(10):
        controller.request(1110 + 15 * i, FakeBoundaryEvent(reached=True))
    assert time.perf_counter() - start < 0.5
    assert controller.stats()["dropped"] == 6
    blocker.reach()
    assert controller.flush(5)
    assert gpus.state(0).locked_sm_clock_mhz == 1110 + 15 * 9


def test_close_resets_the_clock_it_locked(make_controller, gpus, spec):
    controller = make_controller()
    controller.request(900)
    assert controller.flush(5)
    controller.close()
    assert gpus.state(0).locked_sm_clock_mhz is None
    assert not controller.request(1200)


def test_monitor_only_controller_ignores_requests(make_controller, gpus):
    controller = make_controller(monitor_only=True)
    assert not controller.request(1200)
    assert not controller.active
    assert gpus.state(0).set_calls == 0


def test_guard_is_armed_before_the_first_setter(make_controller, gpus):
    armed_with_clock = []

    class RecordingGuard:
        def arm(self, index, clock_mhz=None):
            armed_with_clock.append((index, clock_mhz, gpus.state(0).set_calls))

    controller = make_controller(guard=RecordingGuard())
    controller.request(1200)
    assert controller.flush(5)
    assert armed_with_clock == [(0, 1200, 0)]


def test_request_at_boundary_records_an_event_unless_deduped(make_controller, gpus, monkeypatch):
    recorded: list[FakeCudaEvent] = []

    class RecordingEvent(FakeCudaEvent):
        def record(self) -> None:
            super().record()
            recorded.append(self)

    monkeypatch.setitem(
        sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(Event=RecordingEvent))
    )
    controller = make_controller()
    assert controller.request_at_boundary(1200)
    assert not controller.request_at_boundary(1200)  # deduped before any event is made
    assert len(recorded) == 1
    assert recorded[0].blocking
    time.sleep(0.02)
    assert gpus.state(0).set_calls == 0  # waits for the boundary
    recorded[0].reach()
    assert controller.flush(5)
    assert gpus.state(0).locked_sm_clock_mhz == 1200


def test_simulated_handle_gets_a_synchronous_deterministic_controller(tmp_path, spec):
    handle = open_gpus(
        "simulated", "h200", dry_run=False, num_simulated_gpus=1, state_path=tmp_path / "s.json"
    )
    controller = FrequencyController.from_handle(handle, 0)
    gpus = handle.gpus
    gpus.execute(0, WorkProfile(compute_s=0.03, memory_s=0.01))
    requested_at_virtual_s = gpus.virtual_time_s(0)
    assert controller.request(1200)
    state = gpus.state(0)  # applied before request() returned, at the current virtual time
    assert (state.set_calls, state.pending_sm_clock_mhz) == (1, 1200)
    assert state.pending_at_s == pytest.approx(requested_at_virtual_s + spec.switch_latency_s)
    controller.close()
    assert state.locked_sm_clock_mhz is None


def test_an_inside_request_lands_between_two_boundaries_and_a_stale_one_is_dropped(make_controller, gpus):
    controller = make_controller()
    start = FakeBoundaryEvent()
    controller.request(1500, start)
    start.reach()
    wait_until(lambda: gpus.state(0).locked_sm_clock_mhz == 1500)
    assert controller.request_inside(1200, lambda: False)
    assert gpus.state(0).locked_sm_clock_mhz == 1200
    assert not controller.request_inside(1000, lambda: True)  # its instruction ended: never applied
    assert gpus.state(0).locked_sm_clock_mhz == 1200
    assert controller.stats()["inside"] == 1


def test_the_next_boundary_repeats_its_clock_after_an_inside_request(make_controller, gpus):
    controller = make_controller()
    controller.request(1500)
    controller.allow_repeat()
    controller.flush(5.0)
    controller.request_inside(1200, lambda: False)
    assert controller.request(1500)  # not deduplicated: a phase clock is in force
    controller.flush(5.0)
    assert gpus.state(0).locked_sm_clock_mhz == 1500
    assert not controller.request(1500)  # without a phase clock in between, deduplicated as before


def test_a_stale_check_runs_under_the_lock_the_boundary_clock_takes(make_controller, gpus):
    """The staleness check and the boundary's application never interleave: the phase clock is either
    applied before the next boundary's clock or dropped."""
    controller = make_controller()
    boundary = FakeBoundaryEvent()
    controller.request(1500, boundary)
    checking = threading.Event()
    release = threading.Event()

    def stale() -> bool:
        checking.set()
        release.wait(5.0)
        return False

    phase = threading.Thread(target=controller.request_inside, args=(1200, stale))
    phase.start()
    checking.wait(5.0)
    boundary.reach()  # the controller thread now wants the lock the phase request holds
    time.sleep(0.05)
    assert gpus.state(0).locked_sm_clock_mhz is None  # the boundary clock waits for the phase request
    release.set()
    phase.join(5.0)
    controller.flush(5.0)
    assert [r.clock_mhz for r in controller.switch_records()] == [1200, 1500]


def test_an_inactive_controller_takes_no_inside_request(make_controller, gpus):
    controller = make_controller(monitor_only=True)
    assert not controller.request_inside(1200, lambda: False)
    assert gpus.state(0).set_calls == 0
