"""The recorded step's kernel timelines, taken with ``torch.profiler`` at a small cost to the step (CUDA).

**What is recorded, and why so little.** The phase planner needs one instance of each instruction class
(``Work``: stage, chunk, kind; ``kernel_timeline.phase_timelines`` keeps the median of those recorded), so
the recorded step records exactly one: per class of this rank's stage, the middle instance in the rank's
execution order (:func:`recorded_instances`). Recording costs the host per event: on every operator while the
profiler collects (its callbacks, the input shapes), then again when it stops (Kineto gathers and PyTorch
post-processes every event: ~7 µs each with shapes, measured on a CPU) and when it writes the trace (~2 µs
each); recording a whole step of a 16-layer GPT cost 1.27x (GPU-bound job), 1.64x and 3.0x (host-bound job)
a normal step on an H100. So:

- the profiler starts only at the first recorded instance, not at the step's start;
- its operator collection (aten operators with their input shapes, which the FLOP and byte estimates of
  ``pipeline.kineto_trace`` need, and the instance's ``record_function`` range, :func:`~megatron_energy.
  runtime.profiling.kernel_timeline.annotation`) is on only while a recorded instance runs:
  ``toggle_collection_dynamic`` removes the operator callbacks in between (PyTorch logs a warning at each
  toggle; where this torch cannot toggle, :func:`toggling_works`, collection stays on from the first
  recorded instance to the hand-off). Its CUDA side (CUPTI: kernels and their launches) runs from the
  first instance's start to the profiler's stop, and is never toggled: Kineto's toggle synchronises the
  device, mid-step. Kernels launched outside every range are in the trace but belong to no instruction;
- at the last instance's end the profiler passes to a writer thread, which stops it and writes the trace;
- no stacks, no memory events, no FLOP counters;
- Kineto initialises itself at the process's first profile (its library, CUPTI's; 2-4 s measured on a
  CPU-only host): the recorder runs an empty CPU-only profile when it is built, so that is not in the step.

**What runs on which thread.** On the training thread: the profiler's start, and at each recorded
instance's start and end a toggle and its range (~0.1 ms each, measured on a CPU), then the hand-off. On the
writer thread (:class:`_TraceWriter`): the profiler's stop, which waits for the device to finish the
instances' kernels and has Kineto gather the events (native code that runs without the GIL, measured beside
a busy thread), then the Chrome trace's export (Kineto's writer, which holds the GIL: the one burst beside
the training thread, once per recorded step, ~5 ms per MiB of trace measured on a CPU). Stopping on another
thread needs the profiler's state to be the process's, not the starting thread's: ``profile_all_threads``
(PyTorch 2.7 and later; how PyTorch's own debug server profiles a job from its handler thread). Its operator
callbacks then also see the autograd engine's threads, where a backward pass runs. A trace is read only once
written: :meth:`TorchKernelTimeline.read` starts the reading child process (``kernel_timeline.
TimelineReading``) when the writer has finished. The training thread logs the measured costs
(``recorded_step.RecordedStepCost``) once the writer has finished.

**CUPTI is torn down when the profiler stops** (``TEARDOWN_CUPTI=1``, set on the training thread before the
profiler starts and restored there once the writer has stopped it): Kineto leaves CUPTI attached after a
profile unless told otherwise, and an attached CUPTI taxes every later kernel launch of the run (PyTorch
reports 10-20 % slower training after a finished profile, pytorch/pytorch#144455). torch itself turns
teardown off again for jobs with CUDA graphs on CUDA < 12.6, where it crashes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_energy.dvfs.kernel_classes import KernelClass
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.instruction import Instruction, Step, Work
from megatron_energy.plugin_threads import register_current_thread
from megatron_energy.runtime.child_process import ChildProcess
from megatron_energy.runtime.profiling.kernel_timeline import (
    PendingTimelines,
    ReadTimelines,
    TimelineReading,
    TimelinesRead,
    TimelinesUnread,
    annotation,
)
from megatron_energy.runtime.profiling.recorded_step import RecordedStepCost

TEARDOWN_CUPTI = "TEARDOWN_CUPTI"
"""Kineto's switch: ``1`` finalises CUPTI when a profile stops, so no profiler is left attached to the run."""

CLOSE_WAIT_S = 30.0
"""How long closing waits for a trace still being written."""


def recorded_instances(order: Sequence[Step]) -> tuple[Instruction, ...]:
    """The instances the recorded step records: of each instruction class, the middle one in ``order``.

    The lower middle of a class's instances in the rank's execution order: past a 1F1B pipeline's warm-up
    and before its cool-down where the microbatches allow; without pipelining, with three or more
    microbatches, neither the first microbatch nor the last (whose backward pass launches the gradient
    reduction), with two the first. Fused steps of the combined 1F1B schedule are left out: kernel ranges
    cover single passes only.

    Args:
        order: One rank's steps in execution order (``PipelineOrders.steps``).

    Returns:
        One instance per class, in execution order.
    """
    by_class: dict[Work, list[Instruction]] = {}
    for step in order:
        if isinstance(step, Instruction):
            by_class.setdefault(step.work, []).append(step)
    chosen = {found[(len(found) - 1) // 2] for found in by_class.values()}
    return tuple(step for step in order if step in chosen)


def toggling_works(torch: Any) -> bool:
    """Whether this torch can turn operator collection off and on again in a ``profile_all_threads`` profile.

    Runs one CPU-only profile (which also initialises Kineto) and toggles inside it. torch 2.11 on an H100
    raised "Expected profiler state set" at the toggle back on (``lab/profiler_toggle_probe.py``,
    2026-12-06); where it cannot, the recorded step collects operators from its first recorded instance to
    the hand-off instead (more events, the same ranges).
    """
    cpu = [torch.profiler.ProfilerActivity.CPU]
    config = torch.profiler._ExperimentalConfig(profile_all_threads=True)
    try:
        with torch.profiler.profile(activities=cpu, experimental_config=config) as profiler:
            profiler.toggle_collection_dynamic(False, cpu)
            profiler.toggle_collection_dynamic(True, cpu)
    except RuntimeError:
        return False
    return True


@dataclass
class _Recording:
    """The recorded step in progress (training thread)."""

    clock_mhz: int
    step: int
    left: set[Instruction]
    """The recorded instances that have not ended yet."""
    profiler: Any = None
    """The profiler, from the first recorded instance's start until the hand-off to the writer."""
    ranges: dict[Instruction, Any] = field(default_factory=dict)
    """The ``record_function`` ranges open now."""
    recorded: int = 0
    start_s: float = 0.0
    toggles: int = 0
    toggles_s: float = 0.0


class _TraceWriter(threading.Thread):
    """Stops a profiler and writes its Chrome trace, off the training thread (module docstring)."""

    def __init__(self, profiler: Any, path: Path, device: int | None, recording: _Recording) -> None:
        super().__init__(name="megatron_energy-kernel-trace", daemon=True)
        self.profiler = profiler
        self.path = path
        self.device = device
        self.recording = recording
        self.stop_s = 0.0
        self.export_s = 0.0
        self.error: str | None = None

    def run(self) -> None:
        register_current_thread("kernel-timeline writer")
        try:
            if self.device is not None:  # the profiler's stop synchronises this thread's current device
                import torch

                torch.cuda.set_device(self.device)
            began = time.perf_counter()
            self.profiler.__exit__(None, None, None)
            stopped = time.perf_counter()
            self.stop_s = stopped - began
            self.profiler.export_chrome_trace(str(self.path))
            self.export_s = time.perf_counter() - stopped
        except Exception as problem:  # the trace is then missing: the planner models this stage's split
            self.error = f"{type(problem).__name__}: {problem}"
        self.profiler = None

    def cost(self) -> RecordedStepCost:
        """What the recording cost (on the training thread, once this thread has ended)."""
        recording = self.recording
        written = self.error is None and self.path.exists()
        return RecordedStepCost(
            iteration=recording.step + 1,
            clock_mhz=recording.clock_mhz,
            instances=recording.recorded,
            start_ms=1e3 * recording.start_s,
            toggles=recording.toggles,
            toggles_ms=1e3 * recording.toggles_s,
            stop_ms=1e3 * self.stop_s,
            export_ms=1e3 * self.export_s,
            trace_mib=self.path.stat().st_size / 2**20 if written else 0.0,
            error=self.error,
        )


class _ReadAfterWriting:
    """The traces' reading, begun once the writer has finished (a ``kernel_timeline.PendingTimelines``).

    Args:
        writing: Whether the writer still runs.
        wait_for_writer: Waits for it.
        start_reading: Starts reading the written traces.
    """

    def __init__(
        self,
        writing: Callable[[], bool],
        wait_for_writer: Callable[[], None],
        start_reading: Callable[[], PendingTimelines],
    ) -> None:
        self._writing = writing
        self._wait_for_writer = wait_for_writer
        self._start_reading = start_reading
        self._reading: PendingTimelines | None = None

    def poll(self) -> TimelinesRead | None:
        """The timelines once read; ``None`` at once while the trace is written or read."""
        if self._reading is None:
            if self._writing():
                return None
            self._reading = self._start_reading()
        return self._reading.poll()

    def wait(self) -> TimelinesRead:
        """The timelines, once written and read (waits)."""
        if self._reading is None:
            self._wait_for_writer()
            self._reading = self._start_reading()
        return self._reading.wait()

    def terminate(self) -> None:
        """Stop reading (a trace being written is finished by its thread)."""
        if self._reading is not None:
            self._reading.terminate()


class TorchKernelTimeline:
    """Records the recorded steps' kernel timelines with ``torch.profiler`` (CUDA; see the module docstring).

    Args:
        spec: The GPU whose roofline classifies the kernels.
        instances: The instances to record in each recorded step, one per instruction class of the rank's
            stage (:func:`recorded_instances`).
        gemm_class: The job's GEMM class, for kernels whose names do not say their compute class.
    """

    def __init__(
        self, spec: GpuSpec, instances: Sequence[Instruction], gemm_class: KernelClass = KernelClass.GEMM_BF16
    ) -> None:
        import torch

        self._torch = torch
        self._operators = [torch.profiler.ProfilerActivity.CPU]  # what a toggle turns on or off
        self.spec = spec
        self.instances = tuple(instances)
        self.gemm_class = gemm_class
        self._recording: _Recording | None = None
        self._writer: _TraceWriter | None = None
        self._costs: list[RecordedStepCost] = []  # finished recordings not yet taken by `finished`
        self._errors: list[str] = []  # why a recorded step left no trace
        self._folder: Path | None = None  # the trace files', made at the first hand-off
        self._trace_files: dict[int, list[str]] = {}  # per clock, the first one the reference
        self._teardown_before: str | None = None
        self._teardown_set = False
        self._broken: str | None = (
            None  # why torch's profiler failed mid-run, after which nothing is recorded
        )
        # Kineto initialises at the process's first profile: here, not in the recorded step
        self._toggling = toggling_works(torch)

    @property
    def recording(self) -> bool:
        """Whether a recorded step runs now (between :meth:`start` and :meth:`stop`)."""
        return self._recording is not None

    def start(self, clock_mhz: int, step: int) -> None:
        """A recorded step (``step``, at ``clock_mhz``) begins; the profiler starts at its first instance.

        Nothing is recorded once torch's profiler has failed in this run (:meth:`_abandon`).
        """
        if self._broken is None:
            self._recording = _Recording(clock_mhz, step, set(self.instances))

    def instruction_begin(self, instruction: Instruction) -> None:
        """A recorded instance starts: the profiler starts (or collects operators again); its range opens."""
        recording = self._recording
        if recording is None or instruction not in recording.left or instruction in recording.ranges:
            return
        began = time.perf_counter()
        if recording.profiler is None:
            recording.profiler = self._start_profiler(recording)
            if recording.profiler is None:
                return
            started = time.perf_counter()
            recording.start_s, began = started - began, started
        try:
            if recording.recorded and self._toggling:
                recording.profiler.toggle_collection_dynamic(True, self._operators)
                recording.toggles += 1
            scope = self._torch.profiler.record_function(annotation(instruction))
            scope.__enter__()
        except Exception as problem:  # torch's profiler refused: this recorder stops, training goes on
            self._abandon(recording, f"{instruction}'s start", problem)
            return
        recording.ranges[instruction] = scope
        recording.recorded += 1
        recording.toggles_s += time.perf_counter() - began

    def instruction_end(self, instruction: Instruction) -> None:
        """A recorded instance ends: its range closes, operator collection pauses; the last hands off."""
        recording = self._recording
        scope = None if recording is None else recording.ranges.pop(instruction, None)
        if recording is None or scope is None:
            return
        began = time.perf_counter()
        recording.left.discard(instruction)
        try:
            scope.__exit__(None, None, None)
            if self._toggling:
                recording.profiler.toggle_collection_dynamic(False, self._operators)
                recording.toggles += 1
        except Exception as problem:  # torch's profiler refused: this recorder stops, training goes on
            self._abandon(recording, f"{instruction}'s end", problem)
            return
        if not recording.left:
            self._hand_off(recording)
        recording.toggles_s += time.perf_counter() - began

    def stop(self) -> None:
        """The recorded step ends (after its device sync); a profiler still running passes to the writer."""
        recording, self._recording = self._recording, None
        if recording is None or recording.profiler is None:
            return
        began = time.perf_counter()
        try:
            for scope in recording.ranges.values():  # an instance that began and did not end
                scope.__exit__(None, None, None)
        except Exception as problem:
            self._abandon(recording, "the step's end", problem)
            return
        recording.ranges.clear()
        self._hand_off(recording)
        recording.toggles_s += time.perf_counter() - began

    def _abandon(self, recording: _Recording, where: str, problem: Exception) -> None:
        """Give up recording for the rest of the run after torch's profiler raised (training thread).

        The profiler is stopped here if it can be (once; a synchronising stop is cheaper than a broken
        profiler left attached), no later recorded step starts one, and the planner models the split of the
        instruction classes left unrecorded, as for any trace that was not written.
        """
        reason = str(problem).strip().splitlines()[0] if str(problem).strip() else ""
        error = f"the profiler failed at {where} ({type(problem).__name__}: {reason}); no more recording"
        self._broken = error
        profiler, recording.profiler = recording.profiler, None
        recording.ranges.clear()
        recording.left.clear()
        if self._recording is recording:
            self._recording = None
        with contextlib.suppress(Exception):
            profiler.__exit__(None, None, None)
        self._restore_teardown()
        self._record_failure(recording, error)

    def _record_failure(self, recording: _Recording, error: str) -> None:
        """Keep why a recorded step left no trace, with what it cost until then."""
        self._errors.append(error)
        self._costs.append(
            RecordedStepCost(
                iteration=recording.step + 1,
                clock_mhz=recording.clock_mhz,
                instances=recording.recorded,
                start_ms=1e3 * recording.start_s,
                toggles=recording.toggles,
                toggles_ms=1e3 * recording.toggles_s,
                stop_ms=0.0,
                export_ms=0.0,
                trace_mib=0.0,
                error=error,
            )
        )

    def _start_profiler(self, recording: _Recording) -> Any:
        """The profiler, started once the previous trace is written (training thread); ``None``: it failed."""
        self._wait_for_writer()
        torch = self._torch
        self._teardown_before = os.environ.get(TEARDOWN_CUPTI)
        os.environ[TEARDOWN_CUPTI] = "1"
        self._teardown_set = True
        try:
            profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                record_shapes=True,
                experimental_config=torch.profiler._ExperimentalConfig(profile_all_threads=True),
            )
            profiler.__enter__()
            if torch._C._autograd._profiler_enabled():  # a thread's own state: no writer may stop it
                profiler.__exit__(None, None, None)
                raise RuntimeError("its state is the starting thread's own (profile_all_threads unsupported)")
        except Exception as problem:  # nothing recorded in this step: the planner models the split
            self._restore_teardown()
            self._record_failure(
                recording, f"the profiler did not start ({type(problem).__name__}: {problem})"
            )
            recording.left.clear()
            return None
        return profiler

    def _hand_off(self, recording: _Recording) -> None:
        """Pass the profiler to a writer thread that stops it and writes its trace (training thread)."""
        profiler, recording.profiler = recording.profiler, None
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="megatron_energy-kernels-"))
        paths = self._trace_files.setdefault(recording.clock_mhz, [])
        path = self._folder / f"{recording.clock_mhz}-{len(paths)}.json"
        paths.append(str(path))
        cuda = self._torch.cuda
        device = cuda.current_device() if cuda.is_initialized() else None
        self._writer = _TraceWriter(profiler, path, device, recording)
        self._writer.start()

    @property
    def writing(self) -> bool:
        """Whether a trace is being written now."""
        return self._writer is not None and self._writer.is_alive()

    def _settle(self) -> None:
        """Once the writer has ended (training thread): its cost kept, a lost trace dropped, env restored."""
        writer = self._writer
        if writer is None or writer.is_alive():
            return
        self._writer = None
        writer.join()
        if writer.error is not None:
            self._errors.append(f"the trace was not written ({writer.error})")
            self._trace_files[writer.recording.clock_mhz].remove(str(writer.path))
            if not self._trace_files[writer.recording.clock_mhz]:
                del self._trace_files[writer.recording.clock_mhz]
        self._costs.append(writer.cost())
        self._restore_teardown()

    def _wait_for_writer(self, timeout_s: float | None = None) -> None:
        """Wait for the trace being written (at most ``timeout_s``), then settle."""
        if self._writer is not None:
            self._writer.join(timeout_s)
        self._settle()

    def _restore_teardown(self) -> None:
        """``TEARDOWN_CUPTI`` as it was before the profiler started."""
        if not self._teardown_set:
            return
        self._teardown_set = False
        if self._teardown_before is None:
            os.environ.pop(TEARDOWN_CUPTI, None)
        else:
            os.environ[TEARDOWN_CUPTI] = self._teardown_before

    def finished(self) -> RecordedStepCost | None:
        """What a recorded step cost, once its trace is written (each recorded step once; else ``None``)."""
        self._settle()
        return self._costs.pop(0) if self._costs else None

    @property
    def response_clocks(self) -> int:
        """Clocks recorded: with two or more, the kernel classes' clock response is measured."""
        return len(self._trace_files) if len(self._trace_files) > 1 else 0

    def read(self) -> PendingTimelines:
        """Read the recorded traces in a child process once written (none recorded: no timelines, at once)."""
        if self._writer is None and not self._trace_files:
            return ReadTimelines(TimelinesUnread("; ".join(self._errors)) if self._errors else {})
        return _ReadAfterWriting(lambda: self.writing, self._wait_for_writer, self._start_reading)

    def _start_reading(self) -> PendingTimelines:
        """The child process reading the written traces (training thread, the writer ended)."""
        self._settle()
        if not self._trace_files:
            return ReadTimelines(TimelinesUnread("; ".join(self._errors)) if self._errors else {})
        files = {clock: list(paths) for clock, paths in self._trace_files.items()}
        return ChildProcess(TimelineReading(self.spec, files, self.gemm_class))

    def close(self) -> None:
        """Stop a recording still running, wait (bounded) for its trace, remove the trace files."""
        self.stop()
        self._wait_for_writer(CLOSE_WAIT_S)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
            self._trace_files = {}
