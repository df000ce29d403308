"""``InstructionEvents``: one rank's instruction and outside-phase events, the marks and what hangs on them.

``EnergySession`` hands these events here (it counts their host time). Each instruction event names the step
it marks (a pass, or with kind ``fused`` a fused pair of combined 1F1B) and puts a marker on the timeline
(``runtime.timing``); on that marker hang:

- while profiling, the recorded step's kernel ranges (``runtime.profiling.kernel_timeline``: single passes
  only) and the power-cap watch's clock reads at instruction ends (``runtime.profiling.power_cap_watch``);
- when a plan runs, the instruction's clock at its boundary on the GPU timeline, a tail phase's at its
  outside-phase hook (``runtime.running.plan_runner``), and the clocks of phases inside an instruction,
  handed to the phase switcher anchored on the instruction's start marker
  (``runtime.running.phase_switcher``).

An error inside the phase switcher turns phase switching off with a log line (:meth:`check_switcher`); the
instruction clocks go on.
"""

from __future__ import annotations

import logging

from megatron_energy.dvfs.controller import RESET
from megatron_energy.pipeline.instruction import FUSED, FusedInstruction, Instruction, Step
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.parts import Controller
from megatron_energy.runtime.profiling.kernel_timeline import KernelTimeline
from megatron_energy.runtime.profiling.power_cap_watch import PowerCapWatch
from megatron_energy.runtime.session_state import SessionState
from megatron_energy.runtime.timing import InstructionTimer

logger = logging.getLogger(__name__)


class InstructionEvents:
    """Marks instructions and outside phases on the timeline, and requests the running plan's clocks there.

    Args:
        context: This rank's place in the job.
        timer: The instruction timer that puts the markers.
        controller: Receives the plan's clock requests.
        state: The session's shared state (its runner and phase switcher are read at every event).
        power_cap: Reads the clock at instruction ends of the stock profile steps.
        kernel_timeline: Records the kernel ranges of a recorded step; ``None``: none is recorded.
        switch_phases: Whether the clocks of phases inside instructions go to the phase switcher
            (``--energy-phase-switching`` is not ``off``).
    """

    def __init__(
        self,
        context: JobContext,
        *,
        timer: InstructionTimer,
        controller: Controller,
        state: SessionState,
        power_cap: PowerCapWatch,
        kernel_timeline: KernelTimeline | None,
        switch_phases: bool,
    ) -> None:
        self.context = context
        self.timer = timer
        self.controller = controller
        self.state = state
        self.power_cap = power_cap
        self.kernel_timeline = kernel_timeline
        self.switch_phases = switch_phases
        self._fused_steps = {
            step.forward: step
            for step in context.orders.steps(context.pipeline_rank)
            if isinstance(step, FusedInstruction)
        }

    def step(self, kind: str, microbatch: int, chunk: int) -> Step:
        """The step an instruction event names: a pass, or (kind ``fused``, with the forward's ids) a pair."""
        instruction = Instruction(self.context.pipeline_rank, chunk, microbatch, kind)
        if kind != FUSED:
            return instruction
        return self._fused_steps[instruction._replace(kind="forward")]

    def instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Mark the instruction's boundary and, when a plan runs, ask for its clock at that boundary.

        The clocks of phases inside it go to the phase switcher, anchored to the same boundary marker.
        """
        instruction = self.step(kind, microbatch, chunk)
        # kernel ranges cover single passes only: the kernel optimiser plans no combined 1F1B steps
        timeline = self.kernel_timeline
        if timeline is not None and timeline.recording and isinstance(instruction, Instruction):
            timeline.instruction_begin(instruction)
        boundary = self.timer.begin(instruction)
        runner = self.state.runner
        if runner is None:
            return
        clock = runner.clock_at(instruction)
        if clock is not None:
            self.controller.request(clock, boundary)
        if self.state.phase_switcher is not None and self.switch_phases:
            requests = runner.inside_requests(instruction)
            if requests:
                self.state.phase_switcher.begin(instruction, boundary, requests)

    def instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Mark the instruction's end (the phase switcher drops its requests the GPU passes it by)."""
        instruction = self.step(kind, microbatch, chunk)
        marker = self.timer.end(instruction)
        self.power_cap.instruction_end(instruction)
        if self.state.phase_switcher is not None:
            self.state.phase_switcher.end(instruction, marker)
        timeline = self.kernel_timeline
        if timeline is not None and timeline.recording and isinstance(instruction, Instruction):
            timeline.instruction_end(instruction)

    def outside_begin(self, name: str) -> None:
        """Mark an outside phase's start and, when a plan runs, request the clocks planned at its hook."""
        boundary = self.timer.phase_begin(name)
        if self.state.runner is not None:
            for clock in self.state.runner.outside_clocks(name):
                self.controller.request(clock, boundary)

    def outside_end(self, name: str) -> None:
        """Mark an outside phase's end (a simulated GPU runs its emulated work); request a planned restore."""
        self.timer.phase_end(name)
        if self.state.runner is not None:
            for clock in self.state.runner.outside_clocks(name, end=True):
                self.controller.request(clock)

    def check_switcher(self, replaying: bool) -> None:
        """Turn phase switching off, with a log line, if an error stopped it; the instruction clocks go on.

        Args:
            replaying: Steps replay a full-iteration CUDA graph: every clock of such a step went through the
                switcher, so the clocks return to stock.
        """
        switcher = self.state.phase_switcher
        problem = None if switcher is None else switcher.take_error()
        if switcher is None or problem is None:
            return
        switcher.close()
        self.state.phase_switcher = None
        if replaying:
            self.controller.request(RESET)
        clocks = "stock clocks" if replaying else "the instruction clocks"
        logger.info(
            f"[energy] rank {self.context.global_rank}: phase switching turned off "
            f"({type(problem).__name__}: {problem}); training continues at {clocks}"
        )

    def close_switcher(self) -> None:
        """Stop the phase switcher, if any, and log what became of the requests inside instructions."""
        switcher = self.state.phase_switcher
        if switcher is None:
            return
        switcher.close()
        if switcher.counts.scheduled:
            logger.info(f"[energy] rank {self.context.global_rank}: {switcher.counts.summary()}")
