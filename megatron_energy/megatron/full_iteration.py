"""Follow a training step that Megatron captures as one CUDA graph (``--cuda-graph-impl full_iteration``).

megatron-core's ``FullCudaGraphWrapper`` wraps the schedule function: its first
``--cuda-graph-warmup-steps`` training calls run the schedule eagerly, the next one captures the whole
forward-backward step (gradient sync included) into a ``torch.cuda.CUDAGraph`` and replays it once, and every
later call only replays the graph. Python hooks therefore run during the eager steps and during the capture,
when no kernel executes, but never during a replay.

:func:`follow_full_iteration_graphs` wraps the wrapper's ``__call__`` (on the class, so Megatron's own
references to it see the change; nothing in Megatron's files changes):

- *eager warm-up steps* pass through: the timers proxy fires every event as in any other job;
- *the capture*: the schedule's events go to a :class:`CaptureRecorder` instead of the listener. It records
  a timing CUDA event with ``external=True`` at every instruction boundary and around the gradient sync;
  captured that way, each becomes an event-record node of the graph, so every replay records it again where
  the GPU passes that boundary. The listener hears only ``on_unmeasured_step`` afterwards: the capture
  step's time and energy (a capture, two barriers, device syncs, one replay) say nothing about a training
  step;
- *replays*: the listener hears ``on_step_begin``, ``on_graph_replay`` with the captured markers (the
  boundaries of the step it is about to run), then the replay runs and ``on_step_end`` follows. The session
  times the step from the markers and requests its clocks at their offsets from the replay's start
  (``runtime.session``, ``runtime.running.graph_requests``).

An evaluation call (``forward_only``) passes through untouched: the hooks' gate fires nothing for it. A graph
Megatron resets (``reset_cuda_graph``) is captured again after new warm-up steps, and recorded again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from megatron_energy.events import CapturedSpan, CapturedStep, GraphMarker
from megatron_energy.megatron.schedule_hooks import ScheduleHooks

TRAINING = "training"
"""``FullCudaGraphWrapper``'s key for the training graph."""


class CaptureRecorder:
    """The listener while the step is captured: a marker at every boundary, nothing else.

    Args:
        marker: Records one marker on the current (capturing) stream and returns it.
    """

    def __init__(self, marker: Callable[[], GraphMarker]) -> None:
        self._marker = marker
        self._open: dict[tuple[str, int | None, int | None], GraphMarker] = {}
        self._instructions: list[CapturedSpan] = []
        self._outside: list[CapturedSpan] = []

    def captured(self) -> CapturedStep:
        """The spans recorded so far, in the order they ended."""
        return CapturedStep(tuple(self._instructions), tuple(self._outside))

    def _begin(self, key: tuple[str, int | None, int | None]) -> None:
        self._open[key] = self._marker()

    def _end(self, key: tuple[str, int | None, int | None], spans: list[CapturedSpan]) -> None:
        start = self._open.pop(key, None)
        if start is not None:
            spans.append(CapturedSpan(key[0], key[1], key[2], start, self._marker()))

    def on_step_begin(self, step: int) -> None:
        """Nothing: the replay's start is marked outside the graph."""

    def on_step_end(self, step: int) -> None:
        """Nothing: the replay's end is marked outside the graph."""

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Mark the instruction's start."""
        self._begin((kind, microbatch, chunk))

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Mark the instruction's end."""
        self._end((kind, microbatch, chunk), self._instructions)

    def on_p2p_begin(self, op: str) -> None:
        """Nothing: pipeline communication is waiting time between instructions."""

    def on_p2p_end(self, op: str) -> None:
        """Nothing."""

    def on_outside_begin(self, name: str) -> None:
        """Mark the start of an outside phase captured in the graph (the gradient sync)."""
        self._begin((name, None, None))

    def on_outside_end(self, name: str) -> None:
        """Mark its end."""
        self._end((name, None, None), self._outside)


def external_marker() -> GraphMarker:
    """A timing CUDA event recorded on the current stream: an event-record node of the graph in capture."""
    import torch

    event = torch.cuda.Event(enable_timing=True, external=True)
    event.record()
    return event


class FullIterationFollower:
    """Routes one ``FullCudaGraphWrapper`` call to the hooks as an eager step, a capture or a replay.

    Args:
        hooks: The gate the events go through.
        marker: Records a marker inside the graph being captured (:func:`external_marker` on a GPU).
    """

    def __init__(self, hooks: ScheduleHooks, marker: Callable[[], GraphMarker] = external_marker) -> None:
        self.hooks = hooks
        self.marker = marker
        self.captured: CapturedStep | None = None
        """The markers of the training graph captured last (``None`` before the first capture)."""

    def __call__(self, wrapper: Any, run: Callable[[], Any], forward_only: bool) -> Any:
        """Run one call of ``wrapper`` (``run``), telling the hooks what kind of step it is.

        Args:
            wrapper: The ``FullCudaGraphWrapper`` (its class attributes say whether a graph exists).
            run: Megatron's call.
            forward_only: The call's ``forward_only`` (evaluation).
        """
        if forward_only:
            return run()
        if type(wrapper).cuda_graph.get(TRAINING) is not None and self.captured is not None:
            return self.hooks.replay_graph(self.captured, run)
        if wrapper.curr_iter(TRAINING) != wrapper.cuda_graph_warmup_steps:
            return run()
        recorder = CaptureRecorder(self.marker)
        result = self.hooks.capture_graph(recorder, run)
        self.captured = recorder.captured()
        return result


def follow_full_iteration_graphs(
    hooks: ScheduleHooks, marker: Callable[[], GraphMarker] = external_marker
) -> Callable[[], None]:
    """Wrap ``FullCudaGraphWrapper.__call__`` so the hooks follow its eager steps, capture and replays.

    Args:
        hooks: The gate the events go through.
        marker: Records a marker inside the graph being captured.

    Returns:
        A function that puts Megatron's ``__call__`` back.
    """
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper

    original = FullCudaGraphWrapper.__call__
    follower = FullIterationFollower(hooks, marker)

    def followed_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        forward_only = bool(kwargs.get("forward_only", False))
        return follower(self, lambda: original(self, *args, **kwargs), forward_only)

    FullCudaGraphWrapper.__call__ = followed_call

    def restore() -> None:
        FullCudaGraphWrapper.__call__ = original

    return restore
