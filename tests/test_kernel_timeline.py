"""Kernel timelines in the profiling steps: a Chrome trace's instruction ranges into phases; when the session
records them (the stock clock's synchronous profile steps, never the run phase) and what the planner gets."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from log_lines import capture_lines
from test_session_parts import _Controller, _Meter, _Timer

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.registry import resolve
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.kineto_trace import kernels_by_annotation
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.runtime.child_process import ChildProcess
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import LocalComms
from megatron_energy.runtime.planning_round.cache import JobCache
from megatron_energy.runtime.profiling.kernel_timeline import (
    PendingTimelines,
    ReadTimelines,
    TimelineReading,
    TimelinesUnread,
    annotation,
    parse_annotation,
    phase_timelines,
    timelines_at_clocks,
)
from megatron_energy.runtime.profiling.recorded_step import RecordedStepCost, logged_recorded_steps
from megatron_energy.runtime.profiling.torch_recorder import (
    TEARDOWN_CUPTI,
    TorchKernelTimeline,
    recorded_instances,
    toggling_works,
)
from megatron_energy.runtime.session import EnergySession
from megatron_energy.runtime.session_phase import SessionPhase

SPEC = load_gpu_spec("h100-sxm")
PID, MAIN, AUTOGRAD = 1, 10, 11


class _Trace:
    """A Kineto-style Chrome trace (µs), built range by range; kernels launched by ``aten`` operators."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._correlation = 0
        self._gpu_free = 0.0  # one stream: a kernel starts once the one before it has finished

    def annotate(self, name: str, ts: float, dur: float) -> None:
        self.events.append(
            {"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": MAIN, "ts": ts, "dur": dur}
        )

    def gemm(self, ts: float, dur: float, tid: int = MAIN) -> None:
        """A 4096^3 bf16 GEMM: compute-bound at this duration."""
        dims = [[4096, 4096], [4096, 4096]]
        self._op("aten::mm", ts, dims, ["c10::BFloat16"] * 2, "sm90_xmma_gemm_bf16", dur, tid)

    def elementwise(self, ts: float, dur: float, tid: int = MAIN) -> None:
        """An add of two 64 Mi-element bf16 tensors: memory-bound."""
        dims = [[8192, 8192], [8192, 8192]]
        self._op("aten::add", ts, dims, ["c10::BFloat16"] * 2, "vectorized_elementwise_kernel", dur, tid)

    def _op(self, op: str, ts: float, dims: list, types: list, kernel: str, dur: float, tid: int) -> None:
        self._correlation += 1
        args = {"Input Dims": dims, "Input type": types}
        self.events.append(
            {"ph": "X", "cat": "cpu_op", "name": op, "pid": PID, "tid": tid, "ts": ts, "dur": 5, "args": args}
        )
        launch = {"correlation": self._correlation}
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": PID,
                "tid": tid,
                "ts": ts + 1,
                "dur": 2,
                "args": launch,
            }
        )
        start = max(ts + 20, self._gpu_free)
        self._gpu_free = start + dur
        gpu = {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": start, "dur": dur}
        self.events.append(gpu | {"args": launch})

    def json(self) -> dict[str, Any]:
        return {"traceEvents": self.events}


def _step_trace(forward_gemm_us: float) -> dict[str, Any]:
    """One step of a one-stage pipeline: forward (GEMM, add), backward launched by autograd's thread
    (add, GEMM, GEMM), then an optimizer kernel outside every instruction."""
    trace = _Trace()
    trace.annotate(annotation(Instruction(0, 0, 0, "forward")), 0, 100)
    trace.gemm(10, forward_gemm_us)
    trace.elementwise(50, 300)
    trace.annotate(annotation(Instruction(0, 0, 0, "backward")), 200, 100)
    trace.elementwise(210, 300, tid=AUTOGRAD)
    trace.gemm(230, 400, tid=AUTOGRAD)
    trace.gemm(250, 400, tid=AUTOGRAD)
    trace.elementwise(400, 500)  # the optimizer step: in no instruction's range
    return trace.json()


def test_a_trace_becomes_each_instruction_classes_phases() -> None:
    timelines = phase_timelines([_step_trace(forward_gemm_us=200)], SPEC)
    assert set(timelines) == {Work(0, 0, "forward"), Work(0, 0, "backward")}
    forward = timelines[Work(0, 0, "forward")]
    assert [kind for kind, _ in forward] == ["compute", "memory"]
    assert forward[0][1].compute_s == pytest.approx(200e-6)
    assert forward[1][1].memory_s == pytest.approx(300e-6)
    backward = timelines[Work(0, 0, "backward")]  # launched on autograd's thread: still the backward's
    assert [kind for kind, _ in backward] == ["memory", "compute"]
    assert sum(work.compute_s for _, work in backward) == pytest.approx(800e-6)
    assert sum(work.memory_s + work.compute_s + work.fixed_s for _, work in forward) < 1e-3  # no optimizer


def test_the_median_instance_speaks_for_an_instruction_class() -> None:
    traces = [_step_trace(forward_gemm_us=us) for us in (100, 900, 300)]
    forward = phase_timelines(traces, SPEC)[Work(0, 0, "forward")]
    assert forward[0][1].compute_s == pytest.approx(300e-6)


def test_instruction_ranges_are_named_and_read_back() -> None:
    instruction = Instruction(3, 1, 7, "backward")
    assert parse_annotation(annotation(instruction)) == instruction
    with pytest.raises(ValueError, match="not an instruction range"):
        parse_annotation("energy:optimizer")


# ---------------------------------------------------------------------------------- the session's steps


class _Recorder:
    """A kernel-timeline recorder that notes when the session drives it; its timelines are fixed.

    While it records, the timer's instructions run ``PROFILER_SLOWDOWN`` times slower, as under
    ``torch.profiler``, whose work on every kernel launch slows the recorded step.
    """

    def __init__(self, session_steps: list[int], timer: _Timer) -> None:
        self.session_steps = session_steps
        self.timer = timer
        self.recording = False
        self.started_at: list[tuple[int, int]] = []
        self.instructions: list[Instruction] = []
        self.costs: list[RecordedStepCost] = []  # the recorded steps' costs, logged by the session
        self.closed = False

    def start(self, clock_mhz: int, step: int) -> None:
        assert step == self.session_steps[-1]
        self.recording = True
        self.timer.slowdown = PROFILER_SLOWDOWN
        self.started_at.append((step, clock_mhz))

    @property
    def response_clocks(self) -> int:
        clocks = {clock for _, clock in self.started_at}
        return len(clocks) if len(clocks) > 1 else 0

    def instruction_begin(self, instruction: Instruction) -> None:
        self.instructions.append(instruction)

    def instruction_end(self, instruction: Instruction) -> None:
        pass

    def stop(self) -> None:
        self.recording = False
        self.timer.slowdown = 1.0
        step, clock = self.started_at[-1]
        self.costs.append(RecordedStepCost(step + 1, clock, 2, 1.5, 3, 0.6, 40.0, 12.0, 1.2))

    def finished(self) -> RecordedStepCost | None:
        return self.costs.pop(0) if self.costs else None

    def read(self) -> PendingTimelines:
        return ReadTimelines(
            {
                Work(0, 0, kind): [
                    ("memory", WorkProfile(0.0, 0.4 * seconds)),
                    ("compute", WorkProfile(0.6 * seconds, 0.0)),
                ]
                for kind, seconds in (("forward", 0.010), ("backward", 0.020))
            }
        )

    def close(self) -> None:
        self.closed = True


class _TraceFileRecorder(_Recorder):
    """Leaves a Chrome trace file per recorded step (``trace`` gives its text), read as the torch recorder's
    are: by a ``TimelineReading`` in a child process."""

    def __init__(self, session_steps: list[int], timer: _Timer, folder: Path, trace: str) -> None:
        super().__init__(session_steps, timer)
        self.folder, self.trace = folder, trace
        self.files: dict[int, list[str]] = {}
        self.reading: ChildProcess | None = None

    def stop(self) -> None:
        super().stop()
        clock = self.started_at[-1][1]
        path = self.folder / f"{clock}-{len(self.files.get(clock, []))}.json"
        path.write_text(self.trace)
        self.files.setdefault(clock, []).append(str(path))

    def read(self) -> PendingTimelines:
        self.reading = ChildProcess(TimelineReading(SPEC, self.files))
        return self.reading


PROFILER_SLOWDOWN = 1.5
"""How much slower a step recorded under the profiler runs in these tests."""


def _run(
    tmp_path,
    mode: str,
    steps: int,
    profile_iters: int = 1,
    can_set_clocks: bool = True,
    trace: str | None = None,
    planning: str = "auto",
) -> tuple[_Recorder, list[str], EnergySession]:
    """Train ``steps`` steps of a one-stage job; ``trace``: the recorder leaves trace files of that text."""
    controller, lines, begun = _Controller(), capture_lines(), []
    context = JobContext(
        pipeline_rank=0, orders=pipeline_orders(1, 1), data_parallel_rank=0, data_parallel_size=1
    )
    timer = _Timer(controller)
    recorder = _Recorder(begun, timer) if trace is None else _TraceFileRecorder(begun, timer, tmp_path, trace)
    session = EnergySession(
        EnergyConfig(optimise=True, mode=mode, dir=tmp_path, profile_iters=profile_iters, planning=planning),
        context,
        optimiser=resolve(mode),
        controller=controller,
        meter=_Meter(),
        timer=timer,
        comms=LocalComms(),
        clocks_mhz=[1980, 1500],
        can_set_clocks=can_set_clocks,
        cache=JobCache(tmp_path, context.job_facts(SPEC.name)),
        spec=SPEC,
        kernel_timeline=recorder,
    )
    for step in range(steps):
        _step(session, begun, step)
    return recorder, lines, session


def _step(session: EnergySession, begun: list[int], step: int) -> None:
    begun.append(step)
    session.on_step_begin(step)
    for kind in ("forward", "backward"):
        session.on_instruction_begin(kind, 0, 0)
        session.on_instruction_end(kind, 0, 0)
    session.on_step_end(step)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("profile_iters", "can_set_clocks", "recorded"),
    [(1, True, [(6, 1980), (9, 1500)]), (2, True, [(7, 1980), (11, 1500)]), (2, False, [(7, 1980)])],
)
def test_kernels_are_recorded_in_a_step_of_their_own_at_each_clocks_end_and_feed_the_phase_planner_only(
    tmp_path, profile_iters: int, can_set_clocks: bool, recorded: list[tuple[int, int]]
) -> None:
    recorder, lines, session = _run(tmp_path, "kernel", 16, profile_iters, can_set_clocks)
    # the stock clock: a settling step, the 4-step baseline pilot, `profile_iters` synchronous profile steps
    # and the recorded step; then 1500 MHz (a settling step, `profile_iters` profile steps and the recorded
    # step) where clocks can be set; then the plan runs: no run-phase step records
    assert session.phase == "planned"
    assert recorder.started_at == recorded
    # the recorded steps ran slower (the profiler's cost): their figures are in no profile row
    rows = {(row.work.kind, row.clock_mhz): row for row in session.collector.rows()}
    assert rows[("forward", 1980)].time_s == pytest.approx(0.010)
    assert rows[("backward", 1980)].time_s == pytest.approx(0.020)
    assert rows[("forward", 1980)].samples == 4 + profile_iters  # baseline and profile steps only
    if can_set_clocks:
        assert rows[("forward", 1500)].time_s == pytest.approx(0.010 * 1980 / 1500)
    assert not recorder.recording
    assert set(recorder.instructions) == {Instruction(0, 0, 0, "forward"), Instruction(0, 0, 0, "backward")}
    # rank 0 logs each recorded step's host cost, naming its iteration (1-based, as Megatron's log)
    logged = logged_recorded_steps("\n".join(lines))
    assert [(cost.iteration, cost.clock_mhz) for cost in logged] == [(s + 1, c) for s, c in recorded]
    assert logged[0] == RecordedStepCost(recorded[0][0] + 1, recorded[0][1], 2, 1.5, 3, 0.6, 40.0, 12.0, 1.2)
    response = "clock response measured (kernel timelines at 2 clocks)" if can_set_clocks else "modelled"
    assert any(
        "measured kernel timelines (torch.profiler" in line
        and "2 instruction classes" in line
        and response in line
        for line in lines
    )


@pytest.mark.slow
def test_optimisers_without_phases_never_record_kernels(tmp_path) -> None:
    recorder, lines, session = _run(tmp_path, "perseus", steps=10)
    assert session.phase == "planned" and recorder.started_at == []
    assert not any("phases inside instructions" in line for line in lines)


# ------------------------------------------------------------------- the torch.profiler recorder (CPU)


def test_one_instance_of_each_class_is_recorded_the_middle_one_in_execution_order() -> None:
    # no pipelining: with three or more microbatches neither the first nor the last (its backward launches
    # the gradient sync); with two, the first
    assert recorded_instances(pipeline_orders(1, 4).steps(0)) == (
        Instruction(0, 0, 1, "forward"),
        Instruction(0, 0, 1, "backward"),
    )
    assert [i.microbatch for i in recorded_instances(pipeline_orders(1, 2).steps(0))] == [0, 0]
    assert [i.microbatch for i in recorded_instances(pipeline_orders(1, 1).steps(0))] == [0, 0]
    # 1F1B, 4 stages, 8 microbatches: on every stage a steady-state forward and backward (past the warm-up
    # forwards, before the cool-down backwards)
    orders = pipeline_orders(4, 8)
    for stage in range(4):
        order = orders.steps(stage)
        forward, backward = sorted(recorded_instances(order), key=lambda i: i.kind, reverse=True)
        assert (forward.kind, backward.kind) == ("forward", "backward")
        position = order.index
        first_backward = next(i for i, step in enumerate(order) if step.kind == "backward")
        last_forward = max(i for i, step in enumerate(order) if step.kind == "forward")
        assert first_backward - 1 <= position(forward) <= last_forward
        assert first_backward <= position(backward) <= last_forward + 1
    # interleaved: one per (chunk, kind), in execution order
    order = pipeline_orders(2, 8, num_chunks=2).steps(0)
    chosen = recorded_instances(order)
    assert sorted(i.work for i in chosen) == sorted({step.work for step in order})
    assert [order.index(i) for i in chosen] == sorted(order.index(i) for i in chosen)


def _torch_step(recorder: Any, order: list[Instruction], side_thread_op: str | None = None) -> None:
    """One CPU training step: each forward a small product, each backward its gradient; CPU work between
    instructions; in the recorded forward (``side_thread_op``), an operator on another thread too, as
    autograd's device threads launch a backward pass's kernels."""
    import threading

    import torch

    weight = torch.randn(32, 32, requires_grad=True)
    loss = None
    for instruction in order:
        recorder.instruction_begin(instruction)
        if instruction.kind == "forward":
            loss = (torch.randn(4, 32) @ weight).relu().sum()
            if side_thread_op is not None and instruction in recorder.instances:
                side = threading.Thread(target=getattr(torch, side_thread_op), args=(torch.ones(3),))
                side.start()
                side.join()
        else:
            assert loss is not None
            loss.backward()
        recorder.instruction_end(instruction)
        torch.randn(16, 16).exp()  # the schedule's own work between instructions: never collected


def _written_trace(recorder: Any) -> dict[str, Any]:
    ((path,),) = recorder._trace_files.values()
    return json.loads(Path(path).read_text())


def test_the_torch_recorder_collects_only_the_recorded_instances_and_their_threads() -> None:
    import threading

    import torch

    order = list(pipeline_orders(1, 3).steps(0))
    recorder = TorchKernelTimeline(SPEC, recorded_instances(order))
    recorder.instruction_begin(order[1])  # no recorded step: nothing happens
    recorder.instruction_end(order[1])
    recorder.start(1980, step=6)
    assert recorder.recording
    _torch_step(recorder, order, side_thread_op="sin")
    side = threading.Thread(target=torch.cos, args=(torch.ones(3),))  # after the last instance: not collected
    side.start()
    side.join()
    recorder.stop()
    assert not recorder.recording
    cost = None
    while cost is None:
        cost = recorder.finished()
    assert (cost.iteration, cost.clock_mhz, cost.instances, cost.toggles, cost.error) == (7, 1980, 2, 3, None)
    assert cost.trace_mib > 0 and recorder.finished() is None  # each recorded step once
    events = [e for e in _written_trace(recorder)["traceEvents"] if e.get("ph") == "X"]
    ranges = [e for e in events if e.get("cat") == "user_annotation"]
    assert [e["name"] for e in ranges] == [annotation(i) for i in recorded_instances(order)]
    operators = [e for e in events if e.get("cat") == "cpu_op"]
    assert operators, "the recorded instances' operators, with their input shapes"
    for operator in operators:  # nothing from before, between or after the recorded instances
        assert any(r["ts"] <= operator["ts"] <= r["ts"] + r["dur"] for r in ranges), operator["name"]
    products = [operator["args"]["Input Dims"] for operator in operators if operator["name"] == "aten::mm"]
    assert [[4, 32], [32, 32]] in products  # the forward's: the shapes the FLOP estimate needs
    names = {operator["name"] for operator in operators}
    assert {"aten::mm", "aten::sin"} <= names and not {"aten::exp", "aten::cos"} & names
    main = threading.get_native_id()
    assert {operator["tid"] for operator in operators if operator["name"] == "aten::sin"} != {main}
    # a CPU run launches no GPU kernels: the ranges are recorded, no phases come out of them (read by a child)
    assert kernels_by_annotation(_written_trace(recorder), "energy:") == {} and recorder.read().wait() == {}
    (path,) = (p for paths in recorder._trace_files.values() for p in paths)
    recorder.close()
    assert not Path(path).exists()


def test_the_trace_is_written_off_the_training_thread_and_read_only_once_written(monkeypatch) -> None:
    import threading
    import time

    import torch

    from megatron_energy.runtime.profiling import torch_recorder

    release, threads = threading.Event(), {}
    real_exit, real_export = torch.profiler.profile.__exit__, torch.profiler.profile.export_chrome_trace

    def exit_on(profile: Any, *args: Any) -> None:
        threads["stop"] = threading.current_thread().name
        real_exit(profile, *args)

    def slow_export(profile: Any, path: str) -> None:
        threads["export"] = threading.current_thread().name
        release.wait(30)  # a large trace
        real_export(profile, path)

    started_reading: list[bool] = []

    def reading(task: TimelineReading) -> ChildProcess:
        started_reading.append(all(Path(p).exists() for paths in task.trace_files.values() for p in paths))
        return ChildProcess(task)

    order = list(pipeline_orders(1, 2).steps(0))
    recorder = TorchKernelTimeline(SPEC, recorded_instances(order))
    monkeypatch.setattr(torch.profiler.profile, "__exit__", exit_on)
    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", slow_export)
    monkeypatch.setattr(torch_recorder, "ChildProcess", reading)
    recorder.start(1980, step=3)
    began = time.perf_counter()
    _torch_step(recorder, order)  # the last instance's end hands the profiler over
    recorder.stop()
    pending = recorder.read()
    training_thread_s = time.perf_counter() - began
    assert recorder.writing and pending.poll() is None and recorder.finished() is None
    assert started_reading == []  # no reader before the trace exists
    time.sleep(0.3)
    release.set()
    assert pending.wait() == {} and started_reading == [True]
    assert threads == {"stop": "megatron_energy-kernel-trace", "export": "megatron_energy-kernel-trace"}
    cost = recorder.finished()
    assert cost is not None and cost.export_ms >= 300 > 1e3 * training_thread_s - cost.start_ms
    recorder.close()


@pytest.mark.parametrize("user_value", [None, "0"])
def test_the_profiler_stops_with_cupti_teardown_asked_for_and_the_environment_is_restored(
    monkeypatch, user_value: str | None
) -> None:
    """Kineto leaves CUPTI attached after a profile unless ``TEARDOWN_CUPTI=1`` when it stops; an attached
    CUPTI slows every later kernel launch of the run (pytorch/pytorch#144455)."""
    import torch

    if user_value is None:
        monkeypatch.delenv(TEARDOWN_CUPTI, raising=False)
    else:
        monkeypatch.setenv(TEARDOWN_CUPTI, user_value)
    real_exit = torch.profiler.profile.__exit__
    seen_at_stop: list[str | None] = []

    def exit_noting_teardown(profile: Any, *args: Any) -> None:
        seen_at_stop.append(os.environ.get(TEARDOWN_CUPTI))
        real_exit(profile, *args)

    order = list(pipeline_orders(1, 1).steps(0))
    recorder = TorchKernelTimeline(SPEC, recorded_instances(order))
    monkeypatch.setattr(torch.profiler.profile, "__exit__", exit_noting_teardown)
    recorder.start(1980, step=0)
    _torch_step(recorder, order)
    recorder.stop()
    recorder.read().wait()  # the writer has stopped the profiler
    assert seen_at_stop == ["1"]
    assert os.environ.get(TEARDOWN_CUPTI) == user_value
    recorder.close()


def test_a_trace_that_cannot_be_written_is_logged_and_leaves_the_split_modelled(monkeypatch) -> None:
    import torch

    def failing_export(profile: Any, path: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", failing_export)
    order = list(pipeline_orders(1, 1).steps(0))
    recorder = TorchKernelTimeline(SPEC, recorded_instances(order))
    recorder.start(1980, step=4)
    _torch_step(recorder, order)
    recorder.stop()
    outcome = recorder.read().wait()
    assert isinstance(outcome, TimelinesUnread) and "disk full" in outcome.reason
    cost = recorder.finished()
    assert cost is not None and cost.error == "OSError: disk full" and recorder.response_clocks == 0
    (logged,) = logged_recorded_steps(cost.line(0))
    assert (logged.iteration, logged.instances, logged.error) == (5, 2, "OSError: disk full")
    recorder.close()


def test_a_profiler_only_its_own_thread_could_stop_records_nothing_and_says_why(monkeypatch) -> None:
    """Stopping a profiler whose state is the starting thread's from the writer thread aborts the process."""
    import torch

    order = list(pipeline_orders(1, 2).steps(0))
    recorder = TorchKernelTimeline(SPEC, recorded_instances(order))
    monkeypatch.delenv(TEARDOWN_CUPTI, raising=False)
    monkeypatch.setattr(torch._C._autograd, "_profiler_enabled", lambda: True)  # PyTorch < 2.7's state
    recorder.start(1980, step=2)
    _torch_step(recorder, order)
    recorder.stop()
    cost = recorder.finished()
    assert cost is not None and cost.instances == 0 and "starting thread's own" in str(cost.error)
    outcome = recorder.read().wait()
    assert isinstance(outcome, TimelinesUnread) and "did not start" in outcome.reason
    assert TEARDOWN_CUPTI not in os.environ
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        pass  # the failed profiler was stopped: another may start
    recorder.close()


@pytest.mark.parametrize("refused", [True, False], ids=["collection-back-on", "collection-off"])
def test_a_profiler_that_refuses_a_toggle_ends_recording_and_training_goes_on(monkeypatch, refused) -> None:
    """torch 2.11 on an H100 raised 'Expected profiler state set' at a toggle (2026-12-06): never fatal."""
    import torch

    order = list(pipeline_orders(1, 3).steps(0))
    recorder = TorchKernelTimeline(SPEC, recorded_instances(order))

    def toggle(self: Any, enable: bool, activities: Any) -> None:
        if enable == refused:
            raise RuntimeError("registration_state_ptr INTERNAL ASSERT FAILED\nExpected profiler state set")

    monkeypatch.setattr(torch.profiler.profile, "toggle_collection_dynamic", toggle)
    recorder.start(1980, step=4)
    _torch_step(recorder, order)  # raises nothing
    recorder.stop()
    cost = recorder.finished()
    assert cost is not None and cost.iteration == 5 and "Expected profiler state set" not in str(cost.error)
    assert "INTERNAL ASSERT FAILED" in str(cost.error) and "no more recording" in str(cost.error)
    assert not recorder.recording and TEARDOWN_CUPTI not in os.environ
    recorder.start(1410, step=9)  # a later recorded step records nothing
    assert not recorder.recording
    outcome = recorder.read().wait()
    assert isinstance(outcome, TimelinesUnread) and "no more recording" in outcome.reason
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        pass  # the failed profiler was stopped: another may start
    recorder.close()


def test_where_torch_cannot_toggle_collection_the_step_is_recorded_with_collection_on(monkeypatch) -> None:
    import torch

    real = torch.profiler.profile.toggle_collection_dynamic

    def toggle(self: Any, enable: bool, activities: Any) -> None:
        if enable:  # torch 2.11's profile_all_threads: off works, on again raises
            raise RuntimeError("Expected profiler state set")
        real(self, enable, activities)

    monkeypatch.setattr(torch.profiler.profile, "toggle_collection_dynamic", toggle)
    assert not toggling_works(torch)
    order = list(pipeline_orders(1, 3).steps(0))
    recorder = TorchKernelTimeline(SPEC, recorded_instances(order))
    recorder.start(1980, step=6)
    _torch_step(recorder, order)
    recorder.stop()
    cost = None
    while cost is None:
        cost = recorder.finished()
    assert (cost.instances, cost.toggles, cost.error) == (2, 0, None) and cost.trace_mib > 0
    events = [e for e in _written_trace(recorder)["traceEvents"] if e.get("ph") == "X"]
    ranges = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert ranges == [annotation(i) for i in recorded_instances(order)]
    recorder.close()


def test_closing_during_a_recorded_step_stops_the_profiler_and_removes_the_traces() -> None:
    order = list(pipeline_orders(1, 2).steps(0))
    recorder = TorchKernelTimeline(SPEC, recorded_instances(order))
    recorder.start(1980, step=5)
    recorder.instruction_begin(order[0])  # the step breaks off inside a recorded instance
    recorder.close()
    assert not recorder.recording and not recorder.writing
    cost = recorder.finished()
    assert cost is not None and cost.error is None and cost.instances == 1
    assert recorder._folder is None


def test_the_recorded_step_line_reads_back() -> None:
    cost = RecordedStepCost(12, 1980, 4, 3.25, 7, 1.5, 41.0, 18.5, 2.3)
    line = cost.line(0)
    assert line.startswith("[energy] rank 0: iteration 12 recorded the kernel timelines at 1980 MHz")
    assert logged_recorded_steps(f"noise\n{line}\n{cost.line(0).replace('12', '13', 1)}") == [
        RecordedStepCost(12, 1980, 4, 3.2, 7, 1.5, 41.0, 18.5, 2.3),
        RecordedStepCost(13, 1980, 4, 3.2, 7, 1.5, 41.0, 18.5, 2.3),
    ]


def _clocked_forward(gemm_us: float, add_us: float) -> dict[str, Any]:
    """A forward range (GEMM, then an elementwise add) with the kernels' durations at some clock."""
    trace = _Trace()
    trace.annotate(annotation(Instruction(0, 0, 0, "forward")), 0, 100)
    trace.gemm(10, gemm_us)
    trace.elementwise(50, add_us)
    return trace.json()


def test_timelines_at_two_clocks_give_each_class_its_measured_clock_response() -> None:
    traces = {1980: [_clocked_forward(200, 300)]}  # the stock clock alone: the classes' own law
    ((_, gemm), (_, add)) = timelines_at_clocks(traces, SPEC)[Work(0, 0, "forward")]
    assert add.memory_s == pytest.approx(300e-6) and add.compute_s == 0
    # at 990 MHz the add slowed down as much as the GEMM did (as compute-bound work does under the model,
    # power cap included): measured, it is priced like compute
    model = GpuPowerModel(SPEC)
    compute = WorkProfile(1.0, 0.0)
    slower = model.time_s(compute, 990) / model.time_s(compute, 1980)
    traces[990] = [_clocked_forward(200 * slower, 300 * slower)]
    ((gemm_kind, gemm), (add_kind, add)) = timelines_at_clocks(traces, SPEC)[Work(0, 0, "forward")]
    assert (gemm_kind, add_kind) == ("compute", "memory")
    for work in (gemm, add):
        assert model.time_s(work, 990) / model.time_s(work, 1980) == pytest.approx(slower, rel=1e-3)
    assert add.compute_s > 0.9 * (add.compute_s + add.memory_s + add.fixed_s)


# --------------------------------------------------------------- reading the traces off the training thread


def _train_while(session: EnergySession, recorder: _Recorder, phase: str, limit_s: float = 60.0) -> list[str]:
    """Train on while the session is in ``phase``; the phase each step ran in."""
    import time

    steps = recorder.session_steps
    phases, step, deadline = [], len(steps), time.monotonic() + limit_s
    while session.phase == phase and time.monotonic() < deadline:
        phases.append(session.phase)
        _step(session, steps, step)
        step += 1
        time.sleep(0.01)
    return phases


READ_LINE = "measured kernel timelines (torch.profiler"


@pytest.mark.slow
def test_kernel_timelines_are_read_in_a_child_process_while_training_goes_on(tmp_path) -> None:
    """The H200's `all` run stalled the step profiling ended at 1.87 s (against 0.3 s): the training thread
    parsed the traces and grouped their kernels. Now it only starts a child process that does."""
    trace = json.dumps(_step_trace(forward_gemm_us=200))
    recorder, lines, session = _run(tmp_path, "kernel", 0, trace=trace, planning="background")
    _train_while(session, recorder, "profiling")
    assert (
        session.phase == SessionPhase.PLANNING
    )  # profiling has ended; the traces are not read on this thread
    assert isinstance(recorder, _TraceFileRecorder) and isinstance(recorder.reading, ChildProcess)
    assert not any(READ_LINE in line for line in lines)
    phases = _train_while(session, recorder, SessionPhase.PLANNING)
    assert session.phase == "planned" and len(phases) >= 2
    recorded = {clock: [json.loads(trace)] * len(paths) for clock, paths in recorder.files.items()}
    assert len(recorded) == 2 and recorder.reading.poll() == timelines_at_clocks(recorded, SPEC)
    assert any(READ_LINE in line and "2 instruction classes" in line for line in lines)
    session.close()
    assert recorder.closed


@pytest.mark.slow
def test_kernel_timelines_that_cannot_be_read_leave_the_split_modelled_with_one_line(tmp_path) -> None:
    recorder, lines, session = _run(tmp_path, "kernel", 0, trace="{not json", planning="background")
    _train_while(session, recorder, "profiling")
    _train_while(session, recorder, SessionPhase.PLANNING)
    assert session.phase == "planned"
    unread = [line for line in lines if "kernel timeline not read" in line]
    assert len(unread) == 1 and "JSONDecodeError" in unread[0], lines
    assert any("phases inside instructions: modelled per-class split" in line for line in lines)


@pytest.mark.slow
def test_planning_that_waits_reads_the_kernel_timelines_at_the_step_profiling_ends(tmp_path) -> None:
    trace = json.dumps(_step_trace(forward_gemm_us=200))
    recorder, lines, session = _run(tmp_path, "kernel", 0, trace=trace, planning="wait")
    _train_while(session, recorder, "profiling")
    assert session.phase == "planned"
    assert any(READ_LINE in line for line in lines)
