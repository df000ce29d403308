"""``SimulatedPhaseSwitcher``: clocks inside instructions on simulated GPUs, in virtual time.

The simulated GPU's time does not pass on its own (``dvfs.simulated``), so no thread can wait for it. The
switcher hands each instruction's requests to the :class:`~megatron_energy.runtime.timing.SimulatedTimer`,
which runs the instruction as its phases and calls each request at its offset from the instruction's start
on the virtual clock (the simulated GPU's notion of the start); the call asks the session's controller for
the clock (``FrequencyController.request_inside``, as the thread of ``runtime.running.phase_switcher`` does),
and the simulated GPU switches one switch latency later, mid-instruction, so the instruction's time and
energy take the change in piecewise. A request whose offset lies beyond the instruction's end is stale and
not made. Every figure this produces is modelled.

The offsets are the plan's, as on real GPUs: where the plan's phases take longer or shorter than the
simulated GPU runs them, a clock lands off its phase's start by the difference. One known source: the phase
planner caps each phase's power on its own, the simulated GPU the whole instruction's (as it does for an
instruction run in one piece), so where the power cap binds (compute-bound phases near the top clocks) the
simulated phases run ahead of the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from megatron_energy.pipeline.instruction import Step
from megatron_energy.runtime.parts import InsideController, SwitchCounts, inactive_reason
from megatron_energy.runtime.running.plan_runner import InsideRequest
from megatron_energy.runtime.timing import SimulatedTimer


class SimulatedPhaseSwitcher:
    """Requests clocks inside instructions on the simulated GPU's virtual clock (see the module docstring).

    Args:
        controller: The session's frequency controller (synchronous on simulated GPUs).
        timer: The session's simulated timer, which runs the instructions.
    """

    def __init__(self, controller: InsideController, timer: SimulatedTimer) -> None:
        self.controller = controller
        self.timer = timer
        self.counts = SwitchCounts()
        self._error: BaseException | None = None
        self._stopped = False
        self._pending = 0  # requests of the running instruction
        self._made = 0  # of those, reached on the virtual clock so far

    def begin(self, instruction: Step, anchor: object, requests: Sequence[InsideRequest]) -> None:
        """Have the timer call each request at its offset while the instruction runs."""
        if self._stopped or not requests:
            return
        self.controller.allow_repeat()
        timed = [(request.offset_s, partial(self._request, request.clock_mhz)) for request in requests]
        self.timer.schedule_inside(instruction, timed)
        self.counts.scheduled += len(requests)
        self._made = 0
        self._pending = len(requests)

    def end(self, instruction: Step, marker: object) -> None:
        """The instruction has run: the requests its time never reached were stale."""
        if self._pending:
            self.counts.stale += self._pending - self._made
            self._pending = self._made = 0

    def cancel(self) -> None:
        """Nothing is pending between two instructions: each runs, with its requests, at its end."""

    def take_error(self) -> BaseException | None:
        """The error that stopped phase switching (once; ``None`` if none)."""
        error, self._error = self._error, None
        return error

    def close(self) -> None:
        """Stop making requests."""
        self._stopped = True

    def _request(self, clock_mhz: int) -> None:
        """One request, at its time on the virtual clock; an error stops phase switching (kept)."""
        self._made += 1
        if self._stopped:
            self.counts.dropped += 1
            return
        try:
            self.controller.request_inside(clock_mhz, _never)
            if not self.controller.active:
                raise RuntimeError(f"the frequency controller stopped: {inactive_reason(self.controller)}")
        except Exception as error:  # kept for the session, which logs it and stops phase switching
            self._error, self._stopped = error, True
            return
        self.counts.applied += 1


def _never() -> bool:
    """A request made at its time inside its instruction's run is never stale."""
    return False
