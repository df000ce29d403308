"""``PhaseSwitcher``: clocks of phases inside an instruction, anchored to the instruction's start on the GPU.

A phase inside an instruction has no host hook (``runtime.running.plan_runner``), so its clock is requested
by time. At an instruction's start hook the session hands the switcher the instruction's start marker (the
CUDA event the timer recorded on the current stream: the GPU's arrival at the instruction) and the
instruction's requests (``PlanRunner.inside_requests``: offsets from that start). One background thread per
rank, a daemon started at the first instruction with phase clocks, takes the instructions in order: it waits
until the start event has completed (``event.synchronize()``, which releases the GIL; on a GPU the switcher
records its own anchor beside the timer's, a blocking-sync CUDA event (``anchor_event``), so the thread
sleeps in the driver instead of spinning a core or polling for the GIL while the host runs ahead), takes that
moment as the anchor, then for each request sleeps until ``anchor + offset`` in one wait and asks the
session's ``FrequencyController`` for the clock (``request_inside``: the controller applies it, or records it
in a dry run, under the same lock as every other clock change).

**Few wake-ups.** The thread wakes once per instruction start and once per request, never in between: it
does not poll, and it asks the instruction's end marker only when a request's time has come. Every torch
operation the training thread launches releases the GIL and takes it back, so a plugin thread's Python
work competes with the launches, and CUDA calls from another thread can contend with them in the driver
(on an H200, a thread recording and querying an event every millisecond beside a launch-bound loop made
its launches 14-21x slower; one querying one event every 5 ms, or sleeping in 1-5 ms steps, changed
nothing measurable; ``runtime.energy_log.host_cost`` counts this thread's CPU time per step). A wait ends
early only when the session cancels or closes the switcher.

Ordering: the session also gives the switcher each instruction's end marker (its end event). A request whose
instruction has ended on the GPU is *stale* and dropped, checked (one event query) under the controller's
lock when the request's time comes, so a phase
clock never lands after the next instruction's boundary clock (that one is applied only once the GPU has
reached the next instruction, after this one's end). The timer reuses its events two steps later; the
thread keeps within milliseconds of the GPU and Megatron keeps the host within a step of it, so an event is
not recorded again while the thread still waits on it. Instructions queue up to ``max_pending``; beyond, the
oldest is dropped. :meth:`PhaseSwitcher.cancel` drops every pending one (the session calls it before it
reverts to stock clocks). An error in the thread (the controller's, or the events') stops phase switching
and is kept for the session (:meth:`PhaseSwitcher.take_error`), which logs it and carries on at the
instruction clocks; so does a controller that turned monitor-only.

Limits: a request goes out after the anchor by its offset plus the driver's wake-up after the anchor event
(tens of µs), the host's sleep overshoot (~0.1 ms on Linux) and the wait for the GIL, which the training
thread hands over every ``sys.getswitchinterval()`` (5 ms by default) at worst; then the NVML call takes its
own time (~1 ms) before the GPU's switch latency starts. An instruction that ends before its last request's
time holds the thread until that time (the request is then found stale), so the next instruction's first
requests can go out late by as much as the instruction ended early. The offsets themselves are the
plan's: phase starts from a modelled per-class split or a measured kernel timeline at the planned clocks,
not observed at run time. The plan requests a switch up one switch latency early, so lateness of a few ms
shifts where a switch lands within its window rather than making a phase slower than planned, as long as it
is well below that latency.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from megatron_energy.dvfs.controller import BoundaryEvent
from megatron_energy.pipeline.instruction import Step
from megatron_energy.plugin_threads import register_current_thread
from megatron_energy.runtime.parts import InsideController, SwitchCounts, inactive_reason
from megatron_energy.runtime.running.plan_runner import InsideRequest


@dataclass
class _Job:
    """One instruction's requests, with its start marker and (once it ended on the host) its end marker."""

    anchor: BoundaryEvent
    requests: Sequence[InsideRequest]
    generation: int
    end: BoundaryEvent | None = field(default=None)


class PhaseSwitcher:
    """Requests the clocks of phases inside instructions from a background thread (see the module docstring).

    :meth:`begin` and :meth:`end` are called from the training thread; the rest is thread-safe.

    Args:
        controller: The session's frequency controller.
        max_pending: Instructions queued at most; the oldest is dropped beyond.
        anchor_event: Records a fresh marker on the current stream at an instruction's start (a blocking-sync
            CUDA event); ``None``: the marker the session gives is waited on.
        clock: The host clock (seconds).
    """

    def __init__(
        self,
        controller: InsideController,
        *,
        max_pending: int = 64,
        anchor_event: Callable[[], BoundaryEvent] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.controller = controller
        self.counts = SwitchCounts()
        self._max_pending = max_pending
        self._anchor_event = anchor_event
        self._clock = clock
        self._jobs: collections.deque[_Job] = collections.deque()
        self._open: dict[Step, _Job] = {}
        self._changed = threading.Condition()
        self._interrupted = threading.Condition()  # wakes a wait for a request's time: cancel or close
        self._generation = 0
        self._stopping = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def begin(self, instruction: Step, anchor: BoundaryEvent, requests: Sequence[InsideRequest]) -> None:
        """Queue an instruction's requests, anchored to its start marker (a CUDA event) or the switcher's own.

        Called right after the instruction's boundary request, so the next boundary request is never
        deduplicated away (``FrequencyController.allow_repeat``).
        """
        if self._error is not None or self._stopping or not requests:
            return
        self.controller.allow_repeat()
        with self._changed:
            own = self._anchor_event
            job = _Job(anchor if own is None else own(), tuple(requests), self._generation)
            if len(self._jobs) >= self._max_pending:
                self.counts.dropped += len(self._jobs.popleft().requests)
            self._jobs.append(job)
            self._open[instruction] = job
            self.counts.scheduled += len(job.requests)
            self._changed.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="PhaseSwitcher", daemon=True)
            self._thread.start()

    def end(self, instruction: Step, marker: BoundaryEvent | None) -> None:
        """Note an instruction's end marker: its requests not made once the GPU passes it are dropped."""
        job = self._open.pop(instruction, None)
        if job is not None:
            job.end = marker

    def cancel(self) -> None:
        """Drop every queued or running instruction's requests not made yet (before a revert to stock)."""
        with self._changed:
            self._generation += 1
            self._open.clear()
            self.counts.dropped += sum(len(job.requests) for job in self._jobs)
            self._jobs.clear()
        with self._interrupted:
            self._interrupted.notify_all()

    def take_error(self) -> BaseException | None:
        """The error that stopped phase switching (once; ``None`` if none)."""
        error, self._error = self._error, None
        return error

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the thread (pending requests are dropped); idempotent."""
        self.cancel()
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        with self._interrupted:
            self._interrupted.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ------------------------------------------------------------------------------------------ the thread

    def _stale(self, job: _Job) -> bool:
        """Whether the job's moment has passed: cancelled, stopping, or its instruction ended on the GPU."""
        if self._cancelled(job):
            return True
        end = job.end
        return end is not None and end.query()

    def _next_job(self) -> _Job | None:
        with self._changed:
            self._changed.wait_for(lambda: self._jobs or self._stopping)
            return None if self._stopping else self._jobs.popleft()

    def _run(self) -> None:
        register_current_thread("phase switcher")
        try:
            while (job := self._next_job()) is not None:
                self._switch(job)
        except Exception as error:  # kept for the session, which logs it and stops phase switching
            self._error = error
            self._stopping = True

    def _wait_until(self, at_s: float, job: _Job) -> None:
        """Sleep until ``at_s`` (host clock) in one wait, unless the job is cancelled or the switcher ends."""
        with self._interrupted:
            while (left_s := at_s - self._clock()) > 0 and not self._cancelled(job):
                self._interrupted.wait(left_s)

    def _cancelled(self, job: _Job) -> bool:
        return job.generation != self._generation or self._stopping

    def _switch(self, job: _Job) -> None:
        """Wait for the instruction's start, then make each of its requests at its offset."""
        job.anchor.synchronize()
        anchor_s = self._clock()
        for done, request in enumerate(job.requests):
            due_s = anchor_s + request.offset_s
            self._wait_until(due_s, job)
            applied = self.controller.request_inside(request.clock_mhz, lambda: self._stale(job))
            if not self.controller.active:
                raise RuntimeError(f"the frequency controller stopped: {inactive_reason(self.controller)}")
            if not applied:
                self.counts.stale += len(job.requests) - done
                return
            self.counts.applied += 1
            self.counts.note_lateness(self._clock() - due_s)
