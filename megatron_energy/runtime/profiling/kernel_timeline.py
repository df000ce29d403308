"""Kernel timelines of the instructions in the recorded steps, grouped into phases (``kernel`` mode).

On CUDA, ``runtime.profiling.torch_recorder.TorchKernelTimeline`` records them with ``torch.profiler`` in the
recorded step that ends each profiled clock's block (``runtime.profiling.collector``; the stock clock's alone
when clocks are not set: a dry run), never in the run phase: one instance of each instruction class of the
rank's stage, each a ``record_function`` range named by :func:`annotation`; that module says what it records,
why so little, and what runs on which thread. :func:`phase_timelines` (pure, tested on recorded and synthetic
traces) turns the Chrome traces into phases per instruction class: the kernels of each range
(``pipeline.kineto_trace.kernels_by_annotation``), classified against the GPU spec's roofline and grouped
(``pipeline.phase_timeline.group_phases``), each compute phase with the kernel classes its kernels' names
say (``pipeline.kernel_classification``; a matrix product whose name names no dtype, and a compute-bound
kernel of a name no rule knows, in the job's GEMM class from the workload model); of an instruction class's
instances (one per recorded step), the one of median length speaks for it. Times are measured (kernel start
and duration at the stock clock); whether a kernel is compute- or memory-bound rests on FLOPs and bytes
estimated from its operator's input shapes (``pipeline.kineto_trace``). Each class's response to the
clock is *measured* where timelines at two or more clocks were recorded (the same kernels paired across
clocks, ``pipeline.clock_response``), else the GPU spec's model (all compute-bound, all memory-bound or
fixed); what the phase planner does with them is modelled. On simulated GPUs there is no kernel timeline:
the session keeps the modelled per-class split (``pipeline.modelled_phases``). The recorded step runs
slower than the others (the profiler's work), so its instruction times and energy feed the phase timelines
only, never the profile rows or the stock baseline (``runtime.profiling.collector``).

Off the training thread: reading the traces and turning them into phases (:class:`TimelineReading`) runs in
a child process at lower CPU priority (``runtime.child_process``), started at the end of profiling once the
traces are written (:meth:`KernelTimeline.read`), which the session polls while training goes on at stock
clocks.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from megatron_energy.dvfs.kernel_classes import ClassMix, KernelClass
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.clock_response import class_response, fit_class_split
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.kineto_trace import kernels_by_annotation
from megatron_energy.pipeline.phase_timeline import KernelRecord, Phase, PhaseClass, compute_mix, group_phases
from megatron_energy.runtime.profiling.recorded_step import RecordedStepCost

PREFIX = "energy:"
"""The start of every range name the session records."""

Timelines = dict[Work, list[tuple[str, WorkProfile]]]
"""Per instruction class, its phases in order: (class, work at the stock clock)."""


def annotation(instruction: Instruction) -> str:
    """The ``record_function`` name of an instruction, e.g. ``energy:1:0:3:backward``."""
    return f"{PREFIX}{instruction.stage}:{instruction.chunk}:{instruction.microbatch}:{instruction.kind}"


def parse_annotation(name: str) -> Instruction:
    """The instruction an :func:`annotation` names.

    Raises:
        ValueError: If ``name`` is not one.
    """
    try:
        stage, chunk, microbatch, kind = name.removeprefix(PREFIX).split(":")
        return Instruction(int(stage), int(chunk), int(microbatch), kind)
    except ValueError:
        raise ValueError(f"{name!r} is not an instruction range (e.g. {PREFIX}0:0:1:forward)") from None


def phase_timelines(
    traces: Sequence[Mapping[str, Any]],
    spec: GpuSpec,
    split: Mapping[PhaseClass, WorkProfile] | None = None,
    gemm_class: KernelClass = KernelClass.GEMM_BF16,
) -> Timelines:
    """Phases per instruction class from Chrome traces of annotated instructions (see the module docstring).

    Args:
        traces: The parsed JSON of ``torch.profiler``'s ``export_chrome_trace``, one per profiled step (each
            trace's correlation ids are its own).
        spec: The GPU whose roofline classifies the kernels.
        split: Per class, the work one second of it is, where its clock response was measured
            (``pipeline.clock_response``).
        gemm_class: The job's GEMM class, for kernels whose names do not say their compute class.

    Returns:
        Per instruction class with kernels in the traces, the phases of its median-length instance.
    """
    instances: dict[Work, list[list[Phase]]] = {}
    for trace in traces:
        for name, kernels in kernels_by_annotation(trace, PREFIX).items():
            phases = group_phases(kernels, spec, split, gemm_class)
            if phases:
                instances.setdefault(parse_annotation(name).work, []).append(phases)
    return {work: [(p.kind, p.work) for p in _median(found)] for work, found in instances.items()}


def timelines_at_clocks(
    traces: Mapping[int, Sequence[Mapping[str, Any]]],
    spec: GpuSpec,
    gemm_class: KernelClass = KernelClass.GEMM_BF16,
) -> Timelines:
    """The phases per instruction class at the reference clock (median instance), from traces per clock.

    Args:
        traces: Per clock (MHz), the parsed Chrome traces recorded at it; the first clock is the reference
            (the stock clock).
        spec: The GPU whose roofline classifies the kernels.
        gemm_class: The job's GEMM class, for kernels whose names do not say their compute class.

    Returns:
        The phases per instruction class; with traces at other clocks too, each class's work is split by its
        measured clock response.
    """
    if not traces:
        return {}
    reference_mhz, *others = traces
    split = None
    if others:
        ranges = {
            clock: [kernels_by_annotation(trace, PREFIX) for trace in found]
            for clock, found in traces.items()
        }
        response = class_response(ranges[reference_mhz], {c: ranges[c] for c in others}, reference_mhz, spec)
        model = GpuPowerModel(spec)
        mix = _reference_mix(ranges[reference_mhz], spec, gemm_class)
        split = {
            kind: fit_class_split(r, reference_mhz, model, mix if kind == "compute" else None)
            for kind, r in response.items()
        }
    return phase_timelines(traces[reference_mhz], spec, split, gemm_class)


def _reference_mix(
    steps: Sequence[Mapping[str, Sequence[KernelRecord]]], spec: GpuSpec, gemm_class: KernelClass
) -> ClassMix | None:
    """The kernel classes of every compute-bound kernel the reference clock's steps recorded."""
    kernels = [kernel for ranges in steps for found in ranges.values() for kernel in found]
    return compute_mix(kernels, spec, gemm_class)


def _median(instances: list[list[Phase]]) -> list[Phase]:
    """The instance whose total length is the (lower) median of all."""
    lengths = [sum(phase.duration_s for phase in phases) for phases in instances]
    middle = statistics.median_low(lengths)
    return instances[lengths.index(middle)]


@dataclass(frozen=True)
class TimelinesUnread:
    """The kernel timelines could not be read; the phase planner models the split instead."""

    reason: str
    """Why, for the rank's log line."""


type TimelinesRead = Timelines | TimelinesUnread
"""What reading a rank's kernel timelines comes to."""


@dataclass(frozen=True)
class TimelineReading:
    """Reading recorded Chrome traces into phases, in a child process (a ``child_process.ChildTask``)."""

    spec: GpuSpec
    """The GPU whose roofline classifies the kernels."""

    trace_files: dict[int, list[str]]
    """Per clock (MHz, the reference clock first), the recorded steps' Chrome trace files."""

    gemm_class: KernelClass = KernelClass.GEMM_BF16
    """The job's GEMM class, for kernels whose names do not say their compute class."""

    @property
    def process_name(self) -> str:
        """``kernel-timeline``: what a failure's reason calls the process."""
        return "kernel-timeline"

    def run(self) -> Timelines:
        """Read every trace and group its kernels into phases (:func:`timelines_at_clocks`)."""
        traces = {
            clock: [json.loads(Path(path).read_text(encoding="utf-8")) for path in paths]
            for clock, paths in self.trace_files.items()
        }
        return timelines_at_clocks(traces, self.spec, self.gemm_class)

    def failed(self, reason: str) -> TimelinesUnread:
        """The stage's split is modelled, the log says ``reason``."""
        return TimelinesUnread(reason)

    def accepts(self, outcome: object) -> bool:
        """Whether the child left timelines or why it could not."""
        return isinstance(outcome, dict | TimelinesUnread)


class PendingTimelines(Protocol):
    """Kernel timelines being read (a ``ChildProcess`` of a :class:`TimelineReading`, or ready at once)."""

    def poll(self) -> TimelinesRead | None:
        """The timelines once read; ``None`` at once while they are being read."""
        ...

    def wait(self) -> TimelinesRead:
        """The timelines, once read (waits)."""
        ...

    def terminate(self) -> None:
        """Stop reading (nothing is left behind)."""
        ...


@dataclass(frozen=True)
class ReadTimelines:
    """Kernel timelines there was nothing to read for, or that were read already."""

    outcome: TimelinesRead
    """The timelines."""

    def poll(self) -> TimelinesRead:
        """The timelines."""
        return self.outcome

    def wait(self) -> TimelinesRead:
        """The timelines."""
        return self.outcome

    def terminate(self) -> None:
        """Nothing runs."""


class KernelTimeline(Protocol):
    """What the session needs of a kernel-timeline recorder (:class:`TorchKernelTimeline` on CUDA)."""

    @property
    def recording(self) -> bool:
        """Whether it records now."""
        ...

    def start(self, clock_mhz: int, step: int) -> None:
        """A recorded step (the session's ``step``, a synchronous one at ``clock_mhz``) begins."""
        ...

    def instruction_begin(self, instruction: Instruction) -> None:
        """An instruction starts."""
        ...

    def instruction_end(self, instruction: Instruction) -> None:
        """An instruction ends."""
        ...

    def stop(self) -> None:
        """The recorded step ends (its device work is done)."""
        ...

    def finished(self) -> RecordedStepCost | None:
        """What a recorded step cost on the host, once its trace is written (each once; else ``None``)."""
        ...

    def read(self) -> PendingTimelines:
        """Start reading the phases per instruction class of every recorded step, off the training thread."""
        ...

    @property
    def response_clocks(self) -> int:
        """Clocks the kernel classes' clock response was measured at (0: modelled)."""
        ...

    def close(self) -> None:
        """Remove what was recorded (the session ends)."""
        ...


def merge_timelines(per_rank: Sequence[Timelines]) -> Timelines:
    """Every rank's phases per instruction class as one mapping (the first rank of a stage speaks for it)."""
    merged: Timelines = {}
    for timelines in per_rank:
        for work, phases in timelines.items():
            merged.setdefault(work, phases)
    return merged


def timelines_line(timelines: Timelines, timer_source: str, response_clocks: int = 0) -> str:
    """The log line saying where the phase planner's split of the instructions comes from."""
    if timelines:
        response = (
            f"clock response measured (kernel timelines at {response_clocks} clocks)"
            if response_clocks
            else "clock response modelled"
        )
        recorded = sum((work for phases in timelines.values() for _, work in phases), WorkProfile(0.0, 0.0))
        classes = "none compute-bound" if recorded.compute_mix is None else recorded.compute_mix.describe()
        return (
            "phases inside instructions: measured kernel timelines (torch.profiler, one instance per class "
            f"in the stock clock's recorded step) of {len(timelines)} instruction classes; compute- or "
            "memory-bound from estimated FLOPs/bytes, compute classes from kernel names (measured compute "
            f"time: {classes}; compute-bound kernels whose names say no class priced as the job's GEMM "
            f"class), {response}"
        )
    why = "simulated GPUs have no kernels" if timer_source == "modelled" else "no kernel was recorded"
    return f"phases inside instructions: modelled per-class split ({why})"
