"""``GraphReplay``: a session's steps replayed from a full-iteration CUDA graph (``megatron.full_iteration``).

No hook runs inside a replay. At each replayed step's start the session hands over the markers captured in
the graph: the timer times the step by them (``runtime.cuda_timer``), and every clock of the running plan
point inside the step goes to the phase switcher, anchored on the step's start marker, at the offsets the
previous replay measured (``running.graph_requests``); before any replay was timed, the step runs at the
clock it starts with. After the capture step (``on_unmeasured_step``) the device finishes it and the next
step's energy lap and iteration time start anew.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from megatron_energy.events import CapturedStep
from megatron_energy.pipeline.instruction import Step
from megatron_energy.runtime.parts import PhaseSwitching
from megatron_energy.runtime.running.graph_requests import graph_requests
from megatron_energy.runtime.running.plan_runner import PlanRunner
from megatron_energy.runtime.timing import GraphReplayTimer, InstructionSample, InstructionTimer, StepTiming


class GraphReplay:
    """What a session keeps of the replayed steps: whether steps replay, and the last one's offsets.

    Args:
        timer: The session's timer (a replayed graph is timed by a :class:`GraphReplayTimer` only).
        inside: Also request the clocks of phases inside instructions (``--energy-phase-switching`` on).
    """

    def __init__(self, timer: InstructionTimer, inside: bool) -> None:
        self.timer = timer
        self.inside = inside
        self.replaying = False
        """Whether steps replay a graph (every clock of a step then goes through the phase switcher)."""
        self.offsets: tuple[InstructionSample, ...] = ()
        """The last replayed step's instructions as measured, in execution order."""

    def _graph_timer(self) -> GraphReplayTimer:
        if not isinstance(self.timer, GraphReplayTimer):
            raise TypeError(f"{type(self.timer).__name__} cannot time a replayed CUDA graph")
        return self.timer

    def begin(
        self,
        captured: CapturedStep,
        step_of: Callable[[str, int, int], Step],
        runner: PlanRunner | None,
        switcher: PhaseSwitching | None,
        boundary: Any,
    ) -> None:
        """The step that began replays the graph: time it by ``captured``, request its clocks by time.

        Args:
            captured: The graph's markers.
            step_of: The session's step for an instruction event's ``(kind, microbatch, chunk)``.
            runner: The running plan, if any.
            switcher: The phase switcher, if any.
            boundary: The step's start marker.
        """
        marks = [
            (step_of(span.kind, span.microbatch or 0, span.chunk or 0), span.start, span.end)
            for span in captured.instructions
        ]
        self._graph_timer().replayed(marks, [(span.kind, span.start, span.end) for span in captured.outside])
        self.replaying = True
        if runner is None or switcher is None or not self.offsets:
            return
        requests = graph_requests(runner, self.offsets, inside=self.inside)
        if requests:
            first = self.offsets[0].instruction
            switcher.begin(first, boundary, requests)
            switcher.end(first, None)

    def captured_in_step(self) -> None:
        """A step captured the graph: wait for the device; the next step's cycle is unknown."""
        self.timer.wait_for_device()
        if isinstance(self.timer, GraphReplayTimer):
            self.timer.skip_step()

    def timed(self, timing: StepTiming) -> None:
        """A step's timing came back: a replayed step's instructions give the next replay's offsets."""
        if self.replaying and timing.samples:
            self.offsets = timing.samples
