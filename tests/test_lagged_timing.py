"""The run phase never waits for the GPU at a step's end: CUDA-event timing one step late, paired with energy.

``torch.cuda.Event`` and ``torch.cuda.synchronize`` are replaced, at the boundary only, by a fake device
that knows which step each event was recorded in and when Megatron's own per-iteration synchronisation has
completed a step. Every wait of the host on an event that has not completed is recorded: that is the stall
the lagged timer removes. Reading an incomplete event's time raises, as CUDA does.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from log_lines import capture_lines

from megatron_energy.config import EnergyConfig, Planning
from megatron_energy.dvfs.meter import EnergyWindow
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.registry import resolve
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import LocalComms
from megatron_energy.runtime.cuda_timer import CudaEventTimer
from megatron_energy.runtime.energy_log.meter_thread import MeterThread
from megatron_energy.runtime.parts import SwitchCounts
from megatron_energy.runtime.planning_round import cache as cache_module
from megatron_energy.runtime.planning_round.cache import JobCache
from megatron_energy.runtime.profiling.baseline_length import MIN_STOCK_STEPS
from megatron_energy.runtime.session import EnergySession
from megatron_energy.runtime.session_phase import SessionPhase


class FakeDevice:
    """One GPU seen through its events: device time, the step the host is in, what the host waited on."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.host_step = 0
        self.recorded = 0  # events recorded so far, in stream order
        self.completed = 0  # events that have completed (the first this many recorded)
        self.waits: list[tuple[int, int]] = []  # (host step, event's step) of each blocking wait
        self.device_syncs: list[int] = []  # host step of each torch.cuda.synchronize()
        self.stream = object()  # what torch.cuda.current_stream() returns
        self.stream_lookups = 0
        self.streams_recorded_on: set[int] = set()

    def current_stream(self, device: Any = None) -> object:
        self.stream_lookups += 1
        return self.stream

    def synchronize(self) -> None:
        self.device_syncs.append(self.host_step)
        self.complete_all()

    def complete_all(self) -> None:
        """The device has caught up with everything the host gave it."""
        self.completed = self.recorded


class FakeEvent:
    """A CUDA event on the fake device."""

    device: FakeDevice

    def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
        self.step: int | None = None
        self.position = 0
        self.time_s = 0.0

    def record(self, stream: Any = None) -> None:
        self.device.streams_recorded_on.add(id(stream))
        self.device.recorded += 1
        self.step, self.position = self.device.host_step, self.device.recorded
        self.time_s = self.device.now_s

    def query(self) -> bool:
        return self.step is not None and self.position <= self.device.completed

    def synchronize(self) -> None:
        if not self.query():
            assert self.step is not None
            self.device.waits.append((self.device.host_step, self.step))
            self.device.completed = self.position  # the stream ran up to this event

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")
        return 1e3 * (end.time_s - self.time_s)


@pytest.fixture
def device(monkeypatch) -> FakeDevice:
    fake = FakeDevice()
    FakeEvent.device = fake
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda, "current_stream", fake.current_stream)
    return fake


class _Controller:
    def request(self, clock_mhz: int | None, boundary: object = None) -> None:
        pass

    def set_memory_clock(self, clock_mhz: int | None) -> None:
        pass

    def close(self) -> None:
        pass


class _Meter:
    """Each lap's energy names the host step it was taken at: 1000 J per step number, plus 7."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device

    def lap(self, name: str = "iteration") -> EnergyWindow:
        energy_j = 1000.0 * self.device.host_step + 7.0
        return EnergyWindow("iteration", 0.0, 1.0, {0: energy_j}, energy_j, None, True, False, "measured")


def _forward_ms(step: int) -> float:
    return 10.0 + step


def _run_step(session: EnergySession, device: FakeDevice, step: int) -> None:
    """One step of a one-stage, one-microbatch pipeline; Megatron synchronises after the schedule."""
    device.host_step = step
    session.on_step_begin(step)
    for kind, duration_ms in (("forward", _forward_ms(step)), ("backward", 2 * _forward_ms(step))):
        session.on_instruction_begin(kind, 0, 0)
        device.now_s += duration_ms / 1e3
        session.on_instruction_end(kind, 0, 0)
    session.on_step_end(step)
    device.complete_all()  # the optimizer step's host reads (grad norm, loss) wait for the device


def _session(
    tmp_path, device: FakeDevice, log_interval: int = 1000, planning: Planning = "wait"
) -> tuple[EnergySession, list[str]]:
    spec = load_gpu_spec("h100-sxm")
    context = JobContext(
        pipeline_rank=0,
        orders=pipeline_orders(1, 1),
        data_parallel_rank=0,
        data_parallel_size=1,
        log_interval=log_interval,
    )
    lines = capture_lines()
    session = EnergySession(
        # by default the plan is adopted as profiling ends (as on simulated GPUs): most tests time steps
        EnergyConfig(optimise=True, dir=tmp_path, profile_iters=1, planning=planning),
        context,
        optimiser=resolve("perseus"),
        controller=_Controller(),
        meter=_Meter(device),
        timer=CudaEventTimer(),
        comms=LocalComms(),
        clocks_mhz=[1980, 1500],
        can_set_clocks=False,
        cache=JobCache(tmp_path, context.job_facts(spec.name)),
        spec=spec,
    )
    # the fake counter names the host step it is read in: read it where the lap is asked for, exactly, so the
    # attribution below is deterministic (a real run reads it on a worker thread, a few µs later)
    session.laps = MeterThread(session.meter, synchronous=True)
    return session, lines


def _profile(session: EnergySession, device: FakeDevice) -> int:
    step = 0
    while session.phase == "profiling":
        _run_step(session, device, step)
        step += 1
    return step


@pytest.mark.slow
def test_the_run_phase_never_waits_for_the_current_step_and_reports_each_step_one_step_late(tmp_path, device):
    session, _ = _session(tmp_path, device)
    first_run_step = _profile(session, device)
    # profiling is exact: it waits for the device at every step (the fake sees those waits)
    assert device.device_syncs and device.waits
    assert len(session.history) == first_run_step
    waits, syncs = len(device.waits), len(device.device_syncs)

    for step in range(first_run_step, first_run_step + 4):
        _run_step(session, device, step)
        # the step just ended is not reported yet; the one before it is
        assert len(session.history) == step, step
    assert device.waits[waits:] == [] and device.device_syncs[syncs:] == []

    # each reported step carries its own device times and the energy lapped at its own end
    for step in range(first_run_step, first_run_step + 3):
        figures = session.history[step]
        forward, backward = figures.timing.samples
        assert forward.duration_s == pytest.approx(_forward_ms(step) / 1e3)
        assert backward.duration_s == pytest.approx(2 * _forward_ms(step) / 1e3)
        assert figures.timing.intrinsic_s == pytest.approx(3 * _forward_ms(step) / 1e3)
        assert figures.energy_j == 1000.0 * step + 7.0
        assert figures.timing.cycle_s is not None and figures.timing.cycle_s > 0


@pytest.mark.slow
def test_close_flushes_the_last_step_with_its_own_energy(tmp_path, device):
    session, lines = _session(tmp_path, device, log_interval=1)
    last = _profile(session, device) + 2
    for step in range(last - 2, last + 1):
        _run_step(session, device, step)
    assert len(session.history) == last
    lines.clear()

    session.close()
    assert len(session.history) == last + 1
    figures = session.history[-1]
    assert figures.energy_j == 1000.0 * last + 7.0
    assert figures.timing.samples[0].duration_s == pytest.approx(_forward_ms(last) / 1e3)
    assert session.energy_logger.window.window[-1] == (last, figures)
    summaries = ("model vs measured at stock clocks", "plugin host time", "run totals")  # closing summaries
    closing = [line for line in lines if not any(summary in line for summary in summaries)]
    assert closing == [
        f"[energy] rank 0 iteration {last + 1} (last, this rank only): {figures.energy_j:.1f} J, "
        f"{1e3 * figures.iteration_s:.1f} ms (measured)"
    ]


def test_lagged_steps_use_alternate_event_pools_and_are_read_only_once_complete(device):
    timer = CudaEventTimer()
    starts, returned = [], []
    for step in range(4):
        device.host_step = step
        starts.append(timer.step_begin())
        timer.end(_begun(timer, step))
        returned.append(timer.finish_step(lagged=True))
        device.complete_all()
    assert [len(timings) for timings in returned] == [0, 1, 1, 1]
    assert device.waits == []
    # step N+2 records into step N's events, which were read one step earlier
    assert starts[2] is starts[0] and starts[3] is starts[1] and starts[0] is not starts[1]
    (last,) = timer.flush()
    assert last.samples[0].instruction.microbatch == 3
    assert timer.flush() == ()
    # every event goes on the schedule's stream, looked up once per step (not once per event)
    assert device.streams_recorded_on == {id(device.stream)} and device.stream_lookups == 4


def test_a_step_after_a_flush_has_no_cycle_rather_than_the_pause_before_it(device):
    timer = CudaEventTimer()
    timings = []
    for step in range(5):
        if step == 2:
            timer.flush()  # a suspension: the steps in between run without the timer
        device.host_step = step
        timer.step_begin()
        timer.end(_begun(timer, step))
        timings.extend(timer.finish_step(lagged=True))
        device.complete_all()
    cycles = {timing.samples[0].instruction.microbatch: timing.cycle_s for timing in timings}
    assert cycles[0] is None and cycles[2] is None  # the first step, and the first after the flush
    assert cycles[3] is not None and cycles[3] > 0


def test_an_exact_step_after_a_lagged_one_returns_both_in_order(device):
    timer = CudaEventTimer()
    for step, lagged in ((0, True), (1, False)):
        device.host_step = step
        timer.step_begin()
        timer.end(_begun(timer, step))
        timings = timer.finish_step(lagged=lagged)
    assert [timing.samples[0].instruction.microbatch for timing in timings] == [0, 1]
    assert device.waits == [(1, 1)]  # exact: it waited for its own step


def _begun(timer: CudaEventTimer, microbatch: int) -> Instruction:
    instruction = Instruction(0, 0, microbatch, "forward")
    timer.begin(instruction)
    FakeEvent.device.now_s += 0.01
    return instruction


@pytest.mark.slow
def test_the_stock_baseline_is_made_of_steps_timed_as_the_run_phase_times_its_own(tmp_path, device):
    session, _ = _session(tmp_path, device)
    first_run_step = _profile(session, device)
    waited = set(device.device_syncs) | {host_step for host_step, _ in device.waits}
    # the steps during which the host never waited for the device, after the settling step
    unsynchronised = [step for step in range(1, first_run_step) if step not in waited]
    baseline = session.baseline
    assert baseline.steps == len(unsynchronised) >= MIN_STOCK_STEPS
    # the comparison baseline is exactly those steps: each one's single lap (1000 J per step number + 7)
    assert baseline.step_energy_j == tuple(1000.0 * step + 7.0 for step in unsynchronised)
    assert baseline.step_iteration_s == tuple(session.history[step].iteration_s for step in unsynchronised)
    # the synchronous profile steps (profile rows, measured tail) ran too, and stay out of the baseline
    synchronous = [step for step in range(1, first_run_step) if step in device.device_syncs]
    assert synchronous and not set(synchronous) & set(unsynchronised)
    # and the run phase's steps are timed the same way: no wait at all
    syncs, waits = len(device.device_syncs), len(device.waits)
    for step in range(first_run_step, first_run_step + 3):
        _run_step(session, device, step)
    assert device.device_syncs[syncs:] == [] and device.waits[waits:] == []


@pytest.mark.slow
def test_planning_in_the_background_keeps_the_lag_and_its_steps_reach_no_run_phase_policy(
    tmp_path, device, monkeypatch
) -> None:
    session, lines = _session(tmp_path, device, planning="auto")  # CUDA events: in the background
    checked: list[str] = []  # the phase of every step the safety net was given
    check_safety = session.run_guard.check_safety
    monkeypatch.setattr(
        session.run_guard,
        "check_safety",
        lambda figures, alone, at, phase: checked.append(phase) or check_safety(figures, alone, at, phase),
    )
    step = _profile(session, device)
    assert session.phase == SessionPhase.PLANNING
    syncs, waits = len(device.device_syncs), len(device.waits)
    deadline = time.monotonic() + 60
    while session.phase == SessionPhase.PLANNING and time.monotonic() < deadline:
        _run_step(session, device, step)
        step += 1
        time.sleep(0.01)
    assert session.phase == "planned"
    planned_from = step
    for _ in range(2):  # the last planning step is reported one step late, in the first planned one
        _run_step(session, device, step)
        step += 1
    assert device.device_syncs[syncs:] == [] and device.waits[waits:] == []  # timed as the run phase
    assert checked == ["planned"]  # the first planned step, reported in the second; no planning step
    (line,) = [line for line in lines if line.startswith("[energy] plan took effect")]
    ran = planned_from - session.collector.steps_needed
    assert line.startswith(f"[energy] plan took effect at iteration {planned_from + 1}: computed in ")
    assert f" s while {ran} iteration(s) ran at stock clocks; adopting it took " in line
    assert line.endswith(" ms of the training thread (measured)")


class _FailedSwitcher:
    """A phase switcher whose thread failed (``runtime.running.phase_switcher`` keeps the error for the
    session)."""

    def __init__(self) -> None:
        self.counts = SwitchCounts(scheduled=4, applied=1)
        self.error: BaseException | None = OSError("NVML: insufficient permissions")
        self.closed = False

    def begin(self, instruction: Instruction, anchor: Any, requests: Any) -> None:
        raise AssertionError("phase switching is off")

    def end(self, instruction: Instruction, marker: Any) -> None:
        pass

    def cancel(self) -> None:
        pass

    def take_error(self) -> BaseException | None:
        error, self.error = self.error, None
        return error

    def close(self) -> None:
        self.closed = True


def test_a_phase_switching_error_turns_it_off_with_a_log_line_and_training_goes_on(tmp_path, device):
    session, lines = _session(tmp_path, device)
    switcher = _FailedSwitcher()
    session.state.phase_switcher = switcher
    _run_step(session, device, 0)
    assert switcher.closed and session.state.phase_switcher is None
    assert (
        "[energy] rank 0: phase switching turned off (OSError: NVML: insufficient permissions); training "
        "continues at the instruction clocks"
    ) in lines
    _run_step(session, device, 1)  # the next steps run without it
    assert sum("phase switching turned off" in line for line in lines) == 1


@pytest.mark.slow
def test_the_plan_is_cached_off_the_training_thread_so_slow_disks_do_not_slow_the_adopting_step(
    tmp_path, device, monkeypatch
) -> None:
    # an fsync on a busy network file system can take a second: the adopting step must not wait for it
    write_s = 1.0
    durable_write = cache_module.write_atomically

    def slow_write(path, data, **kwargs) -> None:
        time.sleep(write_s / 4)
        durable_write(path, data, **kwargs)

    monkeypatch.setattr(cache_module, "write_atomically", slow_write)
    session, lines = _session(tmp_path, device)  # waits for the planner: the decision is at profiling's end
    _profile(session, device)
    assert session.phase == "planned"
    (line,) = [line for line in lines if line.startswith("[energy] plan took effect")]
    adopting_ms = float(line.split("adopting it took ")[1].split(" ms")[0])
    assert adopting_ms < 1e3 * write_s / 4  # not even one of the cache's writes
    session.close()  # waits for the cache writer
    assert len(list(tmp_path.glob("*/plan.json"))) == 1
