"""``ScheduleHooks``: the one gate between Megatron's execution and a ``ScheduleListener``.

Both of ``megatron.hooks``' paths feed one gate, which decides what reaches the listener: events only flow
during *training* schedules (a schedule run with ``forward_only=True`` or under ``torch.no_grad()``, i.e.
evaluation, fires nothing), and it numbers the training schedules of this process as steps 0, 1, 2...
(a Megatron iteration that the rerun state machine repeats counts twice). The patch set calls it as
``config.instruction_hooks``, and names its P2P operations through ``ScheduleHooks.p2p_op_name``.

Hooks fire on the CPU when Megatron *launches* the work; nothing here synchronises the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from megatron_energy.events import CapturedStep, GraphStepListener, OutsidePhaseListener, ScheduleListener


def p2p_op_name(tensor_send_next: Any, tensor_send_prev: Any, recv_prev: bool, recv_next: bool) -> str:
    """Name one ``P2PCommunicator._communicate`` call, e.g. ``"send_next+recv_next"``.

    Args:
        tensor_send_next: The tensor sent to the next stage, or ``None``.
        tensor_send_prev: The tensor sent to the previous stage, or ``None``.
        recv_prev: Whether a tensor is received from the previous stage.
        recv_next: Whether a tensor is received from the next stage.

    Returns:
        The directions joined by ``+`` in the order send_next, send_prev, recv_prev, recv_next.
    """
    parts = []
    if tensor_send_next is not None:
        parts.append("send_next")
    if tensor_send_prev is not None:
        parts.append("send_prev")
    if recv_prev:
        parts.append("recv_prev")
    if recv_next:
        parts.append("recv_next")
    return "+".join(parts) or "none"


class ScheduleHooks:
    """The one gate between Megatron and a listener; the patch set calls it as ``config.instruction_hooks``.

    Attributes:
        listener: Receives the events.
        step: The number of the next (or current) training schedule.
        in_training_schedule: True between the begin and end of a training (not evaluation) schedule.
        after_training_schedule: True from the end of a training schedule to the next schedule's begin (the
            optimizer step of a training iteration lies there).
    """

    p2p_op_name = staticmethod(p2p_op_name)

    def __init__(self, listener: ScheduleListener):
        """Create the gate.

        Args:
            listener: Receives the events of training schedules.
        """
        self.listener = listener
        self.step = 0
        self.in_training_schedule = False
        self.after_training_schedule = False

    def on_schedule_begin(self, forward_only: bool) -> None:
        """A schedule starts; it is a training step unless ``forward_only`` or gradients are disabled."""
        self.after_training_schedule = False
        self.in_training_schedule = not forward_only and torch.is_grad_enabled()
        if self.in_training_schedule:
            self.listener.on_step_begin(self.step)

    def on_schedule_end(self) -> None:
        """The schedule that began last returned."""
        if self.in_training_schedule:
            self.in_training_schedule = False
            self.after_training_schedule = True
            self.listener.on_step_end(self.step)
            self.step += 1

    def capture_graph(self, recorder: ScheduleListener, run: Callable[[], Any]) -> Any:
        """Run a step that captures the training step as a CUDA graph, its events going to ``recorder``.

        The step counts (its number is taken); afterwards the listener hears ``on_unmeasured_step`` with it,
        if it follows replayed graphs (``events.GraphStepListener``).

        Args:
            recorder: Receives the schedule's events during the capture (``full_iteration.CaptureRecorder``).
            run: Megatron's call that captures (and replays once).
        """
        listener, self.listener = self.listener, recorder
        step = self.step
        try:
            result = run()
        finally:
            self.listener = listener
        if self.step > step and isinstance(listener, GraphStepListener):
            listener.on_unmeasured_step(step)
        return result

    def replay_graph(self, captured: CapturedStep, run: Callable[[], Any]) -> Any:
        """Run a step that replays the captured training step: a training schedule without instruction hooks.

        Args:
            captured: The markers the graph records, handed to the listener before the replay.
            run: Megatron's call that replays the graph.
        """
        self.on_schedule_begin(forward_only=False)
        if self.in_training_schedule and isinstance(self.listener, GraphStepListener):
            self.listener.on_graph_replay(captured)
        try:
            return run()
        finally:
            self.on_schedule_end()

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Forward ``on_instruction_begin`` during a training schedule."""
        if self.in_training_schedule:
            self.listener.on_instruction_begin(kind, microbatch, chunk)

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Forward ``on_instruction_end`` during a training schedule."""
        if self.in_training_schedule:
            self.listener.on_instruction_end(kind, microbatch, chunk)

    def on_p2p_begin(self, op: str) -> None:
        """Forward ``on_p2p_begin`` during a training schedule."""
        if self.in_training_schedule:
            self.listener.on_p2p_begin(op)

    def on_p2p_end(self, op: str) -> None:
        """Forward ``on_p2p_end`` during a training schedule."""
        if self.in_training_schedule:
            self.listener.on_p2p_end(op)

    def on_outside_begin(self, name: str) -> None:
        """Forward ``on_outside_begin`` during or after a training schedule, to a listener that takes it."""
        if (self.in_training_schedule or self.after_training_schedule) and isinstance(
            self.listener, OutsidePhaseListener
        ):
            self.listener.on_outside_begin(name)

    def on_outside_end(self, name: str) -> None:
        """Forward ``on_outside_end`` like ``on_outside_begin``."""
        if (self.in_training_schedule or self.after_training_schedule) and isinstance(
            self.listener, OutsidePhaseListener
        ):
            self.listener.on_outside_end(name)
