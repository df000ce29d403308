"""``CudaEventTimer``: instruction times from CUDA events, read at once (profiling) or one step later (run).

**Exact (``lagged=False``, profiling).** ``finish_step`` waits for the step's last event, then reads the
events: the step's timing comes back at the end of the same step. Profiling waits for the device anyway
(the session laps the energy counter only once the device is idle), and only for a few steps.

**Lagged (``lagged=True``, the run phase).** ``finish_step`` only *seals* the step: it notes the host time
and keeps the step's events, without waiting for the GPU, so the host stays as far ahead of the GPU as
Megatron lets it (the optimizer's kernels are queued behind the backward pass instead of after an idle
GPU). The step sealed one call earlier is read instead: its events were recorded before this step's,
and Megatron has synchronised since (every iteration ends with host reads of losses and the grad norm),
so the wait on its last event returns at once. The first lagged call therefore returns nothing, each later
one the step before it, and :meth:`CudaEventTimer.flush` (at close) the last step. Two event pools
alternate between steps, so a step's events are not recorded again before they have been read.

**Iteration time** (``StepTiming.cycle_s``) is the host's time between two consecutive schedule ends:
after each wait when exact, at each seal when lagged. Under the lag this is not the device's iteration
but the host's; the two agree on average (the host cannot run ahead of the device by more than it does at
Megatron's per-iteration synchronisation, so host and device complete the same number of iterations over
any stretch), and a single step's host time may differ from its device time by the variation of that
lead (tens of ms). The step's energy is the counter lap the session takes at the same seal, so a step's
time and energy cover the same host window and stay paired.

The instruction samples and the span are always on the device timeline (event to event), exact in both
modes. The span is this stage's own (its last instruction's end); the session takes the replica's, the
maximum over the pipeline, where it needs it: one fixed-size max over the pipeline group per profiling step,
and in the run phase inside the straggler exchange every K steps (``runtime.control_plane.staged_exchange``),
so the timer itself runs no collective.

**Replayed graphs** (``--cuda-graph-impl full_iteration``, ``megatron.full_iteration``): no hook runs inside a
replay, so :meth:`CudaEventTimer.replayed` gives the step the markers captured in the graph (CUDA events with
``external=True``, recorded again by every replay at the instruction boundaries) instead of events recorded
by hooks; the step's start is this timer's own event, recorded just before the replay is launched. As the
same markers are recorded again by the next replay, a replayed step is read before the next one starts: at
:meth:`~CudaEventTimer.finish_step` the timer records one more event after the replay (the host's order
says the whole graph precedes it), and the next :meth:`~CudaEventTimer.step_begin` (before the next replay
is launched) waits for that event, which Megatron's own per-iteration synchronisation has normally passed
already, and reads the step; the lagged call then returns that reading. A replay is launched in
microseconds, so the host's schedule ends run up to a whole step ahead of the GPU's, and a synchronous
step's host cycle would take in the step before it: a replayed step's iteration time is therefore the
device's, from the event after the previous replay to the event after this one (the optimizer step between
them included).

**Outside phases** (gradient sync, optimizer step, parameter all-gather) get a start and an end event from
the same pools; the session reads their durations (:meth:`CudaEventTimer.outside_durations`) only at a
synchronous profiling step's start, when the device is idle; otherwise the next step forgets them unread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from megatron_energy.pipeline.instruction import Step
from megatron_energy.runtime.timing import InstructionSample, StepTiming


@dataclass
class _SealedStep:
    """One step's events, kept until they are read."""

    start: Any
    """The step's start event (``None``: the step was never begun)."""

    marks: list[tuple[Step, Any, Any]] = field(default_factory=list)
    """Each instruction with its start and end events, in execution order."""

    cycle_s: float | None = None
    """The host's time since the previous step's end (``None`` for the first step)."""

    replayed: bool = False
    """The step replayed a captured graph (its marks are the graph's markers)."""

    done: Any = None
    """A replayed step's event recorded after its graph, once sealed (``None`` for a step timed by hooks)."""

    previous_done: Any = None
    """The ``done`` event of the replayed step before it, if that step was one: the two give the cycle."""

    timing: StepTiming | None = None
    """A replayed step's reading, taken before the next replay records its markers again."""


class CudaEventTimer:
    """Times instructions with CUDA events recorded on the current stream (measured).

    See the module docstring for the exact and lagged modes and what the iteration time means under each.
    """

    source: Literal["measured", "modelled"] = "measured"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._pools: tuple[list[Any], list[Any]] = ([], [])
        self._parity = 1  # the first step_begin flips it to pool 0
        self._used = 0
        self._step = _SealedStep(start=None)
        self._open: dict[Step, Any] = {}
        self._sealed: _SealedStep | None = None
        self._last_end_s: float | None = None
        self._last_done: Any = None  # the last replayed step's event after its graph
        self._stream: Any = None
        self._outside_open: dict[str, Any] = {}
        self._outside: list[tuple[str, Any, Any]] = []

    def _event(self) -> Any:
        """Record the next pooled event on the step's stream.

        The stream is looked up once per step: ``Event.record()`` without one asks torch for the current
        stream each time, ~10.6 µs per event against ~1.8 µs with it (measured on an H200, idle GPU).
        The events are blocking-sync: the frequency controller's thread waits on them as boundary markers,
        and a waiter on a default event spins a CPU core in the driver for the whole wait; on a
        blocking-sync event it sleeps.
        """
        pool = self._pools[self._parity]
        if self._used == len(pool):
            pool.append(self._torch.cuda.Event(enable_timing=True, blocking=True))
        event = pool[self._used]
        self._used += 1
        event.record(self._stream)
        return event

    def wait_for_device(self) -> None:
        """Synchronise the current device (profiling only: it costs the overlap of host and device)."""
        self._torch.cuda.synchronize()

    def step_begin(self) -> Any:
        """Record the step's start event (from the pool the previous step did not use) and return it.

        A replayed step still held (lagged) is read first, before the next replay records its markers again.
        """
        held = self._sealed
        if held is not None and held.done is not None and held.timing is None:
            held.timing = self._read(held)
        self._parity ^= 1
        self._used = 0
        self._open.clear()
        self._stream = self._torch.cuda.current_stream()  # the schedule's stream, for the whole step
        self._outside_open.clear()
        self._outside.clear()
        self._step = _SealedStep(start=self._event())
        return self._step.start

    def begin(self, instruction: Step) -> Any:
        """Record the instruction's start event and return it as the boundary marker."""
        event = self._event()
        self._open[instruction] = event
        return event

    def end(self, instruction: Step) -> Any:
        """Record the instruction's end event and return it (``None`` for an instruction never begun)."""
        start = self._open.pop(instruction, None)
        if start is None:
            return None
        event = self._event()
        self._step.marks.append((instruction, start, event))
        return event

    def phase_begin(self, name: str) -> Any:
        """Record an outside phase's start event and return it as the boundary marker."""
        event = self._event()
        self._outside_open[name] = event
        return event

    def phase_end(self, name: str) -> None:
        """Record an outside phase's end event."""
        start = self._outside_open.pop(name, None)
        if start is not None:
            self._outside.append((name, start, self._event()))

    def replayed(
        self, marks: Sequence[tuple[Step, Any, Any]], outside: Sequence[tuple[str, Any, Any]]
    ) -> None:
        """The step replays a captured graph: time it by the markers the graph records.

        Args:
            marks: Each instruction with its start and end markers in the graph, in execution order.
            outside: Each outside phase captured in the graph with its start and end markers.
        """
        self._step.marks = list(marks)
        self._step.replayed = True
        self._outside = list(outside)

    def skip_step(self) -> None:
        """A step ran untimed (it captured a graph): the next step's cycle is unknown, not the two steps'."""
        self._last_end_s = None
        self._last_done = None

    def outside_durations(self) -> dict[str, float]:
        """The outside phases recorded since the last step began (their events have completed)."""
        durations: dict[str, float] = {}
        for name, start, end in self._outside:
            durations[name] = durations.get(name, 0.0) + start.elapsed_time(end) / 1e3
        self._outside.clear()
        return durations

    def finish_step(self, *, lagged: bool = False) -> tuple[StepTiming, ...]:
        """Seal the step; return the steps whose timing is complete, oldest first.

        Args:
            lagged: ``False``: wait for this step's last event and return it (with a step still held from a
                lagged call before it, that one first). ``True``: do not wait for this step; return the
                step sealed by the previous call, if any.

        Returns:
            Zero, one or two steps' timings, each returned exactly once.
        """
        step, self._step = self._step, _SealedStep(start=None)
        if step.replayed:
            step.done = self._event()  # after the replay on the stream, so after every marker of the graph
            step.previous_done = self._last_done
        self._last_done = step.done
        if not lagged and step.marks:
            (step.marks[-1][2] if step.done is None else step.done).synchronize()
        now_s = time.perf_counter()
        step.cycle_s = None if self._last_end_s is None else now_s - self._last_end_s
        self._last_end_s = now_s
        held, self._sealed = self._sealed, step
        ready = [] if held is None else [held]
        if not lagged:
            ready.append(step)
            self._sealed = None
        return tuple(self._read(sealed) for sealed in ready)

    def flush(self) -> tuple[StepTiming, ...]:
        """The step still held by a lagged call (at close or suspension), read now.

        The last step's end is forgotten: steps run without the timer after a suspension, so the next step's
        cycle is unknown (``None``, its iteration time is its span), not the whole pause.
        """
        held, self._sealed = self._sealed, None
        self._last_end_s = None
        self._last_done = None
        return () if held is None else (self._read(held),)

    def _read(self, sealed: _SealedStep) -> StepTiming:
        """Turn a sealed step's events into samples (its last event has completed or is waited for)."""
        if sealed.timing is not None:
            return sealed.timing
        origin = sealed.start
        if origin is None or not sealed.marks:
            return StepTiming(samples=(), intrinsic_s=0.0, source="measured", cycle_s=sealed.cycle_s)
        # done already (sealed before the current step's events); a replayed step waits for its graph's end
        (sealed.marks[-1][2] if sealed.done is None else sealed.done).synchronize()
        samples = tuple(
            InstructionSample(
                instruction=instruction,
                start_s=origin.elapsed_time(start) / 1e3,
                end_s=origin.elapsed_time(end) / 1e3,
            )
            for instruction, start, end in sealed.marks
        )
        cycle_s = sealed.cycle_s
        if sealed.previous_done is not None:  # two replays: the device's iteration, not the host's
            cycle_s = sealed.previous_done.elapsed_time(sealed.done) / 1e3
        return StepTiming(samples, samples[-1].end_s, "measured", cycle_s=cycle_s)
