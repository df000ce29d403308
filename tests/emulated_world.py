"""A job of PP x TP x DP ranks, emulated: one pipeline's real sessions in threads, every collective recorded.

The planning replica's pipeline (global rank 0's replica and tensor-parallel rank, one rank per stage) runs
for real: each of its ``PP`` ranks is a thread with its own ``EnergySession`` built as the launcher builds it
(``runtime.assembly.build_session``: simulated GPUs, the real optimiser in its own planner process), driven
through its stage's executed order step after step. Each rank talks through a :class:`RecordingComms`:

- its **pipeline** group is real: the threads meet in a rendezvous (:class:`Rendezvous`), so a gather, a
  broadcast or a reduction over the pipeline gives what gloo would;
- its **tensor** and **data** groups are emulated: they report the shape's sizes, and every peer sends what
  this rank sends (a max is the rank's own vector, a sum the group size times it, a gather or all-gather
  the object once per peer), as the job's identical replicas and tensor peers would;
- every collective is recorded (:class:`Collective`): its kind, group, group size, the bytes this rank
  sends and receives in it (:func:`moved_bytes`), the step and the phase the step began in, and which of the
  package's modules asked for it (its origin: the module's own name).

A started all-reduce over a group of more than one rank is a message, read no sooner than the next step
(like gloo's), so the session's exchanges take their steps as on a real job. The simulated timer's own
exchange over the pipeline (``runtime.timing.SimulatedTimer``: the simulated GPUs stand in for the pipeline
itself; a real GPU's timer runs none) is recorded with its origin, ``timing``, and is not the session's.
"""

from __future__ import annotations

import pickle
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from log_lines import capture_lines

from megatron_energy.config import EnergyConfig
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import TransformerShape
from megatron_energy.runtime.assembly import build_session
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import Group, ReduceOp

WAIT_S = 300.0
"""Longest wait of a thread for its pipeline peers: a rank that stopped joining fails the run, never hangs."""

PASS_THROUGH = (
    "megatron_energy.runtime.control_plane.comms",
    "megatron_energy.runtime.control_plane.group_chain",
)
"""Modules that only forward a collective: the origin is the module that called them."""


@dataclass(frozen=True)
class Shape:
    """A job's parallel layout."""

    pipeline: int
    tensor: int
    data: int

    @property
    def world(self) -> int:
        """Ranks in the job."""
        return self.pipeline * self.tensor * self.data

    def size(self, group: Group) -> int:
        """Ranks in each group of ``group``'s kind."""
        return {"pipeline": self.pipeline, "tensor": self.tensor, "data": self.data}[group]


@dataclass(frozen=True)
class Collective:
    """One collective one rank took part in."""

    stage: int
    step: int
    phase: str
    """The session's phase when the step began."""
    kind: str
    """``all_reduce``, ``broadcast``, ``gather`` or ``all_gather``."""
    group: Group
    size: int
    """Ranks in the group."""
    bytes: int
    """What this rank sends and receives in it (:func:`moved_bytes`)."""
    origin: str
    """The module that asked for it, without ``megatron_energy.runtime.``."""


def moved_bytes(kind: str, size: int, payload: int, first: bool) -> int:
    """Bytes a rank sends and receives in one collective over ``size`` ranks of a ``payload`` of its own.

    An all-reduce is a ring's reduce-scatter and all-gather: ``2 (n - 1) / n`` of the vector out and as much
    in. A gather or a broadcast moves every rank's (or the first rank's) object through the group's first
    rank, ``n`` times the object there and once elsewhere; an all-gather brings every rank's to each.
    """
    if size == 1:
        return 0
    if kind == "all_reduce":
        return round(4 * (size - 1) / size * payload)
    if kind == "all_gather" or first:
        return size * payload
    return 2 * payload if kind == "broadcast" else payload


class Rendezvous:
    """Where the pipeline's threads meet: the n-th pipeline collective of every member, matched by order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._ready = threading.Condition()
        self._calls = [0] * size
        self._slots: dict[int, dict[int, Any]] = {}
        self._taken: dict[int, int] = {}

    def put(self, member: int, obj: Any) -> int:
        """Contribute ``obj`` to this member's next collective; return its number."""
        with self._ready:
            number = self._calls[member]
            self._calls[member] += 1
            self._slots.setdefault(number, {})[member] = obj
            self._ready.notify_all()
            return number

    def take(self, number: int) -> list[Any]:
        """Every member's contribution to collective ``number``, by member (waits for the last)."""
        with self._ready:
            if not self._ready.wait_for(lambda: len(self._slots[number]) == self.size, WAIT_S):
                raise TimeoutError(f"pipeline collective {number}: a stage never joined")
            slot = self._slots[number]
            values = [slot[member] for member in range(self.size)]
            self._taken[number] = self._taken.get(number, 0) + 1
            if self._taken[number] == self.size:
                del self._slots[number], self._taken[number]
            return values


class _Message:
    """A started all-reduce over a group of more than one rank: read at its ``wait``."""

    local = False

    def __init__(self, read: Any) -> None:
        self._read = read

    def wait(self) -> list[float]:
        return self._read()


def _reduce(vectors: Sequence[Sequence[float]], op: ReduceOp) -> list[float]:
    combine = max if op == "max" else sum
    return [float(combine(values)) for values in zip(*vectors, strict=True)]


@dataclass
class RecordingComms:
    """One rank of the planning replica's pipeline (see the module docstring); implements ``RankComms``."""

    shape: Shape
    stage: int
    pipeline: Rendezvous
    log: list[Collective] = field(default_factory=list)
    step: int = -1
    phase: str = ""

    def size(self, group: Group) -> int:
        """The shape's size of ``group``."""
        return self.shape.size(group)

    def rank(self, group: Group) -> int:
        """The stage in the pipeline; the first rank of the tensor and data-parallel groups."""
        return self.stage if group == "pipeline" else 0

    def _record(self, kind: str, group: Group, payload: int) -> None:
        frame, origin = sys._getframe(2), ""
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if module.startswith("megatron_energy.") and module not in PASS_THROUGH:
                origin = module.rsplit(".", 1)[-1]  # module names are unique in the package
                break
            frame = frame.f_back
        size, first = self.size(group), self.rank(group) == 0
        moved = moved_bytes(kind, size, payload, first)
        self.log.append(Collective(self.stage, self.step, self.phase, kind, group, size, moved, origin))

    def _meet(self, obj: Any) -> list[Any]:
        return self.pipeline.take(self.pipeline.put(self.stage, obj))

    def start_all_reduce(self, values: Sequence[float], op: ReduceOp, group: Group) -> Any:
        """Record; over the pipeline meet the other stages, elsewhere every peer sends the same vector."""
        self._record("all_reduce", group, 8 * len(values))
        mine = list(values)
        if group == "pipeline":
            number = self.pipeline.put(self.stage, mine)
            return _Message(lambda: _reduce(self.pipeline.take(number), op))
        return _Message(lambda: _reduce([mine] * self.size(group), op))

    def broadcast(self, obj: Any, group: Group) -> Any:
        """The first rank's object: the pipeline's stage 0's, elsewhere this rank's (it is the first)."""
        self._record("broadcast", group, len(pickle.dumps(obj)))
        return self._meet(obj)[0] if group == "pipeline" else obj

    def gather(self, obj: Any, group: Group) -> list[Any] | None:
        """Every rank's object on the group's first rank."""
        self._record("gather", group, len(pickle.dumps(obj)))
        if group != "pipeline":
            return [obj] * self.size(group)
        gathered = self._meet(obj)
        return gathered if self.stage == 0 else None

    def all_gather(self, obj: Any, group: Group) -> list[Any]:
        """Every rank's object on every rank."""
        self._record("all_gather", group, len(pickle.dumps(obj)))
        return self._meet(obj) if group == "pipeline" else [obj] * self.size(group)


@dataclass(frozen=True)
class EmulatedRun:
    """What one emulated job did: every collective of its pipeline's ranks, and their log lines."""

    shape: Shape
    collectives: tuple[Collective, ...]
    lines: tuple[tuple[str, ...], ...]
    """Per stage, what its session printed."""
    phases: tuple[str, ...]
    """Stage 0's phase when each step began."""


def run_emulated(
    shape: Shape, steps: int, energy_dir: Path, log_interval: int = 10, microbatches: int | None = None
) -> EmulatedRun:
    """Run the planning replica's pipeline of a ``shape`` job for ``steps`` steps (see the module docstring).

    The model is Llama 7B at the shape's tensor-parallel size, on simulated H100 SXM GPUs with a two-clock
    grid; every figure the sessions print is modelled.
    """
    orders = pipeline_orders(shape.pipeline, microbatches or shape.pipeline)
    model = TransformerShape.from_name("llama-7b", tensor_parallel=shape.tensor)
    config = EnergyConfig(
        optimise=True,
        mode="perseus",
        backend="simulated",
        gpu_spec="h100-sxm",
        dir=energy_dir,
        profile_iters=1,
        freq_grid=(1980, 1005),
    )
    rendezvous = Rendezvous(shape.pipeline)
    comms = [RecordingComms(shape, stage, rendezvous) for stage in range(shape.pipeline)]
    lines: list[list[str]] = [[] for _ in range(shape.pipeline)]
    phases: list[str] = []
    failures: list[BaseException] = []

    def run_stage(stage: int) -> None:
        context = JobContext(
            pipeline_rank=stage,
            orders=orders,
            data_parallel_rank=0,
            data_parallel_size=shape.data,
            tensor_parallel_size=shape.tensor,
            shape=model,
            global_rank=stage * shape.tensor * shape.data,  # Megatron's order: tensor, data, then pipeline
            world_size=shape.world,
            log_interval=log_interval,
        )
        try:
            capture_lines(lines[stage], this_thread_only=True)
            session = build_session(config, context, comms[stage])
            for step in range(steps):
                comms[stage].step, comms[stage].phase = step, session.phase
                if stage == 0:
                    phases.append(session.phase)
                session.on_step_begin(step)
                for instruction in orders.stage(stage):
                    session.on_instruction_begin(instruction.kind, instruction.microbatch, instruction.chunk)
                    session.on_instruction_end(instruction.kind, instruction.microbatch, instruction.chunk)
                session.on_step_end(step)
            session.close()
        except BaseException as problem:  # re-raised in the caller's thread
            failures.append(problem)
            raise

    threads = [threading.Thread(target=run_stage, args=(stage,)) for stage in range(shape.pipeline)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    collectives = tuple(record for rank in comms for record in rank.log)
    return EmulatedRun(shape, collectives, tuple(tuple(stage) for stage in lines), tuple(phases))
