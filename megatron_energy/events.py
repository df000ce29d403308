"""What the Megatron hooks report, and two listeners that every run can use.

A ``ScheduleListener`` receives the pipeline schedule of one rank as it executes: step boundaries,
the begin and end of every forward/backward instruction with its microbatch and model chunk, and the
begin and end of every pipeline send/receive. ``megatron_energy.megatron.hooks`` produces these events from
a running Megatron job; ``EnergySession`` and ``TraceWriter`` consume them.

Events arrive on the training thread at CPU launch time (not GPU completion time), only during training
schedules (evaluation fires nothing), and in this order per step::

    on_step_begin(step)
      (on_p2p_begin(op) on_p2p_end(op))*
      on_instruction_begin(kind, microbatch, chunk) ... on_instruction_end(kind, microbatch, chunk)
      ...
    on_step_end(step)

Listeners that also implement :class:`OutsidePhaseListener` get the phases of an iteration outside the
instructions, named by :data:`OUTSIDE_PHASES`: ``grad-sync`` (megatron-core's ``finalize_model_grads``,
between the last instruction and ``on_step_end``), then ``optimizer`` (the optimizer step, after
``on_step_end``) with, nested at its end, ``param-gather`` (the distributed optimizer's parameter all-gather
when it is not overlapped with the next forward)::

    ... on_outside_begin("grad-sync") on_outside_end("grad-sync") on_step_end(step)
    on_outside_begin("optimizer") [on_outside_begin("param-gather") on_outside_end("param-gather")]
    on_outside_end("optimizer")

Listeners that also implement :class:`GraphStepListener` follow a job run with
``--cuda-graph-impl full_iteration`` (``megatron.full_iteration``): Megatron's warm-up steps run eagerly and
fire the events above; the step that captures the graph fires none of them to the listener (its hooks run
while nothing executes) but ``on_unmeasured_step(step)`` after it; every replayed step fires
``on_step_begin(step) on_graph_replay(captured) on_step_end(step)`` and then the outside phases after the
graph (the optimizer step), since no hook runs inside a replay::

    on_step_begin(step) on_graph_replay(captured) on_step_end(step) on_outside_begin("optimizer") ...

Pure Python: no torch, no megatron imports.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO, runtime_checkable


@runtime_checkable
class ScheduleListener(Protocol):
    """Receives the events of one rank's pipeline schedule; see the module docstring for their order."""

    def on_step_begin(self, step: int) -> None:
        """A training schedule starts; ``step`` counts training schedules from 0 in this process."""

    def on_step_end(self, step: int) -> None:
        """The training schedule ``step`` returned (DP grad finalisation done, optimizer step not yet)."""

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """``kind`` (``"forward"`` or ``"backward"``) of ``microbatch`` on model chunk ``chunk`` starts."""

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """The instruction announced by the matching ``on_instruction_begin`` ended."""

    def on_p2p_begin(self, op: str) -> None:
        """A pipeline send/receive starts; ``op`` is e.g. ``"send_next"`` or ``"send_next+recv_next"``."""

    def on_p2p_end(self, op: str) -> None:
        """The send/receive ``op`` returned: done, or only posted with ``--overlap-p2p-communication``."""


OUTSIDE_PHASES: tuple[str, ...] = ("grad-sync", "optimizer", "param-gather")
"""The phases outside instructions that the hooks report, in the order they run in an iteration."""


@runtime_checkable
class OutsidePhaseListener(Protocol):
    """Receives the phases of an iteration outside its instructions (see the module docstring)."""

    def on_outside_begin(self, name: str) -> None:
        """The outside phase ``name`` (one of :data:`OUTSIDE_PHASES`) starts."""

    def on_outside_end(self, name: str) -> None:
        """The outside phase ``name`` ended."""


class GraphMarker(Protocol):
    """A timing marker recorded inside a captured CUDA graph (``torch.cuda.Event(external=True)``)."""

    def query(self) -> bool:
        """Whether the GPU has passed the marker's latest record."""
        ...


@dataclass(frozen=True)
class CapturedSpan:
    """One span the captured graph marks on every replay: an instruction, or an outside phase inside it."""

    kind: str
    """``"forward"``, ``"backward"`` (``"fused"``), or the outside phase's name (``"grad-sync"``)."""
    microbatch: int | None
    """The instruction's microbatch; ``None`` for an outside phase."""
    chunk: int | None
    """The instruction's model chunk; ``None`` for an outside phase."""
    start: GraphMarker
    """Recorded where the span begins in the graph."""
    end: GraphMarker
    """Recorded where the span ends in the graph."""


@dataclass(frozen=True)
class CapturedStep:
    """The boundary markers a captured training step records each time it is replayed."""

    instructions: tuple[CapturedSpan, ...]
    """The instructions in the order the graph runs them."""
    outside: tuple[CapturedSpan, ...]
    """The outside phases captured inside the graph (the gradient sync), in order."""


@runtime_checkable
class GraphStepListener(Protocol):
    """Follows a job whose whole training step is one replayed CUDA graph (see the module docstring)."""

    def on_unmeasured_step(self, step: int) -> None:
        """Step ``step`` captured the graph (and ran it once): nothing of it may be measured."""

    def on_graph_replay(self, captured: CapturedStep) -> None:
        """The step that began is about to replay the graph whose boundary markers ``captured`` holds."""


class ListenerFanout:
    """Forwards every event to several listeners, in the order given."""

    def __init__(self, listeners: Sequence[ScheduleListener]):
        """Create the fanout.

        Args:
            listeners: The listeners that receive each event.
        """
        self.listeners: tuple[ScheduleListener, ...] = tuple(listeners)

    def on_step_begin(self, step: int) -> None:
        """Forward ``on_step_begin``."""
        for listener in self.listeners:
            listener.on_step_begin(step)

    def on_step_end(self, step: int) -> None:
        """Forward ``on_step_end``."""
        for listener in self.listeners:
            listener.on_step_end(step)

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Forward ``on_instruction_begin``."""
        for listener in self.listeners:
            listener.on_instruction_begin(kind, microbatch, chunk)

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Forward ``on_instruction_end``."""
        for listener in self.listeners:
            listener.on_instruction_end(kind, microbatch, chunk)

    def on_p2p_begin(self, op: str) -> None:
        """Forward ``on_p2p_begin``."""
        for listener in self.listeners:
            listener.on_p2p_begin(op)

    def on_p2p_end(self, op: str) -> None:
        """Forward ``on_p2p_end``."""
        for listener in self.listeners:
            listener.on_p2p_end(op)

    def on_outside_begin(self, name: str) -> None:
        """Forward ``on_outside_begin`` to the listeners that take outside phases."""
        for listener in self.listeners:
            if isinstance(listener, OutsidePhaseListener):
                listener.on_outside_begin(name)

    def on_outside_end(self, name: str) -> None:
        """Forward ``on_outside_end`` to the listeners that take outside phases."""
        for listener in self.listeners:
            if isinstance(listener, OutsidePhaseListener):
                listener.on_outside_end(name)

    def on_unmeasured_step(self, step: int) -> None:
        """Forward ``on_unmeasured_step`` to the listeners that follow replayed graphs."""
        for listener in self.listeners:
            if isinstance(listener, GraphStepListener):
                listener.on_unmeasured_step(step)

    def on_graph_replay(self, captured: CapturedStep) -> None:
        """Forward ``on_graph_replay`` to the listeners that follow replayed graphs."""
        for listener in self.listeners:
            if isinstance(listener, GraphStepListener):
                listener.on_graph_replay(captured)


def trace_path_for_rank(path: Path, rank: int, world_size: int) -> Path:
    """The file ``--energy-trace PATH`` names on one rank.

    Args:
        path: The path given on the command line.
        rank: This process's global rank.
        world_size: The number of processes in the job.

    Returns:
        ``path`` itself for a single-process job, else ``path`` with ``.rank{rank}`` appended
        (``trace.jsonl`` -> ``trace.jsonl.rank3``), so ranks never share a file.
    """
    return path if world_size <= 1 else path.with_name(f"{path.name}.rank{rank}")


class TraceWriter:
    """Writes every event as one JSON line: the ``--energy-trace`` listener.

    Each line has ``rank``, ``step``, ``event`` (``step_begin``, ``step_end``, ``instruction_begin``,
    ``instruction_end``, ``p2p_begin``, ``p2p_end``, ``outside_begin``, ``outside_end``), ``kind``,
    ``microbatch`` and ``chunk`` (``null`` where they do not apply), ``op`` for p2p events and the outside
    phase's name for outside events, and ``host_time_s``: measured host wall-clock time
    (``time.time()``) when the hook fired, i.e. CPU launch time, not GPU completion time. The file is
    line-buffered, so a crashed run keeps every event written before the crash. A write error (a full
    disk) ends the trace with one line on stderr; it never reaches the training step.
    """

    def __init__(self, path: Path, rank: int = 0, world_size: int = 1):
        """Open (truncate) this rank's trace file.

        Args:
            path: The ``--energy-trace`` path; see ``trace_path_for_rank`` for the per-rank name.
            rank: This process's global rank.
            world_size: The number of processes in the job.
        """
        self.path = trace_path_for_rank(Path(path), rank, world_size)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._step: int | None = None
        self._file: TextIO | None = self.path.open("w", encoding="utf-8", buffering=1)

    def _write(
        self,
        event: str,
        kind: str | None = None,
        microbatch: int | None = None,
        chunk: int | None = None,
        op: str | None = None,
    ) -> None:
        if self._file is None:
            return
        record = {
            "rank": self.rank,
            "step": self._step,
            "event": event,
            "kind": kind,
            "microbatch": microbatch,
            "chunk": chunk,
            "host_time_s": time.time(),
        }
        if op is not None:
            record["op"] = op
        try:
            self._file.write(json.dumps(record) + "\n")
        except OSError as error:  # a full disk ends the trace, never the training step
            self._stop(error)

    def _stop(self, error: OSError) -> None:
        """Drop the file after a write error and say so once; later events are dropped."""
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):  # the buffered rest cannot be written either
                file.close()
        print(
            f"[energy] rank {self.rank}: stopped writing the trace {self.path} at step {self._step} "
            f"({error}); training continues without it",
            file=sys.stderr,
            flush=True,
        )

    def on_step_begin(self, step: int) -> None:
        """Record ``step_begin``."""
        self._step = step
        self._write("step_begin")

    def on_step_end(self, step: int) -> None:
        """Record ``step_end``."""
        self._step = step
        self._write("step_end")

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Record ``instruction_begin``."""
        self._write("instruction_begin", kind, microbatch, chunk)

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Record ``instruction_end``."""
        self._write("instruction_end", kind, microbatch, chunk)

    def on_p2p_begin(self, op: str) -> None:
        """Record ``p2p_begin``."""
        self._write("p2p_begin", op=op)

    def on_p2p_end(self, op: str) -> None:
        """Record ``p2p_end``."""
        self._write("p2p_end", op=op)

    def on_outside_begin(self, name: str) -> None:
        """Record ``outside_begin``."""
        self._write("outside_begin", op=name)

    def on_outside_end(self, name: str) -> None:
        """Record ``outside_end``."""
        self._write("outside_end", op=name)

    def close(self) -> None:
        """Close the file; later events are dropped. A failing final flush is reported, not raised."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError as error:
                self._stop(error)
            self._file = None


def read_trace(path: Path) -> list[dict]:
    """Read a trace written by ``TraceWriter``.

    Args:
        path: One rank's trace file.

    Returns:
        The events, in the order they were written.
    """
    with Path(path).open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]
