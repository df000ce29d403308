"""Chrome / Perfetto trace (JSON) of a simulated iteration.

Open the file in https://ui.perfetto.dev or ``chrome://tracing``. Each pipeline stage is a process with one
``compute`` thread holding a slice per forward, backward and tail node and a ``power_w (modelled)``
counter: the stage's power timeline (``sim.power_timeline``), which integrates to its simulated energy. A
compute slice is named after the instruction and the clock **in effect** while it ran (``F3c1 @1980 MHz``);
its ``args`` give ``clock_in_effect_mhz``, ``clock_requested_mhz`` (the plan's clock for the instruction),
its energy and provenance. Under switch latency a requested clock takes effect only
later (``sim.simulator``): an instruction that ran wholly at the previous clock is one slice at that clock,
and one during which the switch took effect is two slices, the first at the previous clock and the second at
the requested one, each with the duration and energy it ran at its own clock. Point-to-point transfers sit on
a separate ``p2p transfers (modelled)`` process, one thread per sending stage and direction. With collectives
(``sim.overlap``), each stage process has a second thread, ``collectives (modelled)``, with one slice per
collective launch (its name, CTA budget and the seconds it ran beside compute in ``args``). Every name and
``args`` entry says the figures are modelled.
"""

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from megatron_energy.pipeline.dag import Transfer
from megatron_energy.pipeline.instruction import FusedInstruction, Instruction
from megatron_energy.sim.overlap import CommSlice
from megatron_energy.sim.power_timeline import stage_power_traces
from megatron_energy.sim.simulator import SimResult, Slice, StagePowers

_MICROSECONDS_PER_S = 1e6
_COMPUTE_THREAD = 0
_COLLECTIVES_THREAD = 1
SWITCH_PENDING = "requested clock not yet in effect (switch latency); time and energy at the clock in effect"
"""What a compute slice run at another clock than requested says in its ``args``."""
_SAME_INSTANT_S = 1e-12
"""A switch this close to a slice's end came after it (rounding of the simulator's sums)."""


class _Part(NamedTuple):
    """A stretch of a compute slice at one clock in effect."""

    start_s: float
    end_s: float
    clock_mhz: int
    energy_j: float


def _compute_parts(piece: Slice) -> list[_Part]:
    """``piece`` split where its requested clock took effect: one part, or two when the switch fell inside.

    A compute slice always has a requested clock (``clock_mhz``).
    """
    requested = piece.clock_mhz
    assert requested is not None
    if piece.stale_clock_mhz is None:
        return [_Part(piece.start_s, piece.end_s, requested, piece.energy_j)]
    switch_s = piece.start_s + piece.stale_s
    if switch_s >= piece.end_s - _SAME_INSTANT_S:
        return [_Part(piece.start_s, piece.end_s, piece.stale_clock_mhz, piece.energy_j)]
    return [
        _Part(piece.start_s, switch_s, piece.stale_clock_mhz, piece.stale_energy_j),
        _Part(switch_s, piece.end_s, requested, piece.energy_j - piece.stale_energy_j),
    ]


def _slice_name(piece: Slice) -> str:
    """``F3c1`` (``F3c1+B1c0`` fused) for compute, ``send F3c1`` for a transfer, ``dp_sync`` for the tail."""
    node = piece.node
    if isinstance(node, Instruction | FusedInstruction):
        return node.label
    if isinstance(node, Transfer):
        return f"send {node.sender.label}"
    return piece.kind


def _process_metadata(pid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": sort_index}},
    ]


def _thread_metadata(pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def _power_counters(result: SimResult, powers: StagePowers) -> Iterator[dict[str, Any]]:
    """Each stage's modelled power as a counter: one sample per step of its power timeline.

    The timeline is :func:`~megatron_energy.sim.power_timeline.stage_power_traces` (busy in each compute
    part, blocked between, the tail's mean over its slices, idle after), so the counter integrates to the
    stage's simulated energy; its last value holds until the iteration's end.
    """
    for stage, trace in enumerate(stage_power_traces(result, powers)):
        for time_s, power_w in zip(trace.edges_s, [*trace.power_w, trace.power_w[-1]], strict=True):
            yield {
                "ph": "C",
                "name": "power_w (modelled)",
                "pid": stage,
                "ts": float(time_s) * _MICROSECONDS_PER_S,
                "args": {"power_w": round(float(power_w), 3)},
            }


def _collective_events(comm: Sequence[CommSlice]) -> Iterator[dict[str, Any]]:
    """A ``collectives (modelled)`` thread per stage with one slice per collective launch."""
    for stage in sorted({piece.stage for piece in comm}):
        yield _thread_metadata(stage, _COLLECTIVES_THREAD, "collectives (modelled)")
    for piece in comm:
        yield {
            "ph": "X",
            "name": piece.name,
            "cat": "collective",
            "pid": piece.stage,
            "tid": _COLLECTIVES_THREAD,
            "ts": piece.start_s * _MICROSECONDS_PER_S,
            "dur": (piece.end_s - piece.start_s) * _MICROSECONDS_PER_S,
            "args": {"source": "modelled", "ctas": piece.ctas, "overlapped_s": piece.overlapped_s},
        }


def trace_events(
    result: SimResult, powers: StagePowers, comm: Sequence[CommSlice] = ()
) -> list[dict[str, Any]]:
    """Chrome trace events for ``result``.

    Args:
        result: A simulated iteration.
        powers: Blocked and idle power used for the power counter (the simulator's ``powers``).
        comm: Collective launches of the iteration (``sim.overlap``), one track per stage; none when empty.

    Returns:
        The ``traceEvents`` list.
    """
    num_stages = len(result.stages)
    comm_pid = num_stages
    events: list[dict[str, Any]] = []
    for stage in range(num_stages):
        events += _process_metadata(stage, f"stage {stage} ({result.gpu_name}, modelled)", stage)
        events.append(_thread_metadata(stage, _COMPUTE_THREAD, "compute"))
    events += _process_metadata(comm_pid, "p2p transfers (modelled)", num_stages)
    comm_threads: dict[tuple[int, str], int] = {}
    for piece in result.timeline:
        args: dict[str, Any] = {"source": "modelled", "stage": piece.stage, "start_s": piece.start_s}
        if piece.clock_mhz is not None and not isinstance(piece.node, Transfer):
            events += [_compute_event(piece, part, args) for part in _compute_parts(piece)]
            continue
        if isinstance(piece.node, Transfer):
            direction = piece.node.sender.kind
            key = (piece.stage, direction)
            if key not in comm_threads:
                comm_threads[key] = len(comm_threads)
                thread = f"stage {piece.stage} {direction} send"
                events.append(_thread_metadata(comm_pid, comm_threads[key], thread))
            pid, tid = comm_pid, comm_threads[key]
        else:
            pid, tid = piece.stage, _COMPUTE_THREAD
        events.append(_event(_slice_name(piece), piece.kind, pid, tid, piece.start_s, piece.end_s, args))
    events.extend(_power_counters(result, powers))
    events.extend(_collective_events(comm))
    return events


def _event(
    name: str, kind: str, pid: int, tid: int, start_s: float, end_s: float, args: dict[str, Any]
) -> dict[str, Any]:
    """One complete ("X") trace event."""
    return {
        "ph": "X",
        "name": name,
        "cat": kind,
        "pid": pid,
        "tid": tid,
        "ts": start_s * _MICROSECONDS_PER_S,
        "dur": (end_s - start_s) * _MICROSECONDS_PER_S,
        "args": args,
    }


def _compute_event(piece: Slice, part: _Part, common: dict[str, Any]) -> dict[str, Any]:
    """One compute part: named after the clock in effect, both clocks and the part's energy in ``args``."""
    args = {
        **common,
        "start_s": part.start_s,
        "instruction": _slice_name(piece),
        "clock_in_effect_mhz": part.clock_mhz,
        "clock_requested_mhz": piece.clock_mhz,
        "energy_j": part.energy_j,
    }
    if part.clock_mhz != piece.clock_mhz:
        args["switch"] = SWITCH_PENDING
    name = f"{_slice_name(piece)} @{part.clock_mhz} MHz"
    return _event(name, piece.kind, piece.stage, _COMPUTE_THREAD, part.start_s, part.end_s, args)


def write_trace(
    result: SimResult, powers: StagePowers, path: str | Path, comm: Sequence[CommSlice] = ()
) -> Path:
    """Write ``result`` as a Chrome / Perfetto JSON trace.

    Args:
        result: A simulated iteration.
        powers: Blocked and idle power (the simulator's ``powers``), for the power counter.
        path: Destination file; parent folders are created.
        comm: Collective launches (``sim.overlap``), shown on a collectives track per stage.

    Returns:
        The path written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "traceEvents": trace_events(result, powers, comm),
        "displayTimeUnit": "ms",
        "otherData": {
            "source": "modelled",
            "gpu": result.gpu_name,
            "profile_source": result.profile_source,
            "iteration_time_s": result.iteration_time_s,
            "total_energy_j": result.total_energy_j,
        },
    }
    target.write_text(json.dumps(document), encoding="utf-8")
    return target
