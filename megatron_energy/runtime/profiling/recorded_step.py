"""What a recorded step cost on the host: its log line, and the line read back from a run's output.

The recorded step (``runtime.profiling.collector``) runs under ``torch.profiler``
(``runtime.profiling.torch_recorder``). Once its trace is written, rank 0 logs one line with what the
recording cost, measured with ``time.perf_counter``: on the training thread, the profiler's start and the
collection toggles around the recorded instances; on the writer thread, the profiler's stop and the trace's
export. ``lab/bench_recorded_step.py`` reads the line back (:func:`logged_recorded_steps`) to find the
recorded iteration in Megatron's log and to print the figures beside its time. Pure text: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LINE_HEAD = "recorded the kernel timelines"
"""What every recorded step's line says (after the rank and the iteration)."""

_LINE = re.compile(
    r"iteration (?P<iteration>\d+) " + LINE_HEAD + r" at (?P<clock_mhz>\d+) MHz \((?P<instances>\d+) "
    r"instances.*?\): on the training thread, profiler start (?P<start_ms>[\d.]+) ms and "
    r"(?P<toggles>\d+) collection toggles (?P<toggles_ms>[\d.]+) ms; on the writer thread, profiler stop "
    r"(?P<stop_ms>[\d.]+) ms and trace export (?P<export_ms>[\d.]+) ms \((?P<trace_mib>[\d.]+) MiB"
    r"(?:; not written: (?P<error>.*))?"
)


@dataclass(frozen=True)
class RecordedStepCost:
    """What one recorded step cost on the host (all figures measured, wall clock)."""

    iteration: int
    """The recorded step's iteration, 1-based as Megatron's log counts them."""
    clock_mhz: int
    """The clock the step ran at."""
    instances: int
    """Instruction instances recorded (one per instruction class of the rank's stage)."""
    start_ms: float
    """Training thread: constructing and starting the profiler (at the first recorded instance)."""
    toggles: int
    """Training thread: how many times operator collection was turned on or off."""
    toggles_ms: float
    """Training thread: those toggles with the instances' ``record_function`` ranges and the hand-off."""
    stop_ms: float
    """Writer thread: stopping the profiler (waiting for the device, Kineto gathering the events)."""
    export_ms: float
    """Writer thread: writing the Chrome trace (Kineto's writer, which holds the GIL)."""
    trace_mib: float
    """The trace file's size (0 when it was not written)."""
    error: str | None = None
    """Why the trace was not written, if it was not."""

    def line(self, rank: int) -> str:
        """The log line (``[energy] rank R: iteration N recorded the kernel timelines ...``)."""
        failed = "" if self.error is None else f"; not written: {self.error}"
        return (
            f"[energy] rank {rank}: iteration {self.iteration} {LINE_HEAD} at {self.clock_mhz} MHz "
            f"({self.instances} instances, one per instruction class): on the training thread, profiler "
            f"start {self.start_ms:.1f} ms and {self.toggles} collection toggles {self.toggles_ms:.1f} ms; "
            f"on the writer thread, profiler stop {self.stop_ms:.1f} ms and trace export "
            f"{self.export_ms:.1f} ms ({self.trace_mib:.1f} MiB{failed}) (measured)"
        )


def logged_recorded_steps(text: str) -> list[RecordedStepCost]:
    """Every recorded step a run's output logged (:meth:`RecordedStepCost.line`), in the order logged."""
    found = []
    for match in _LINE.finditer(text):
        fields = match.groupdict()
        error = fields.pop("error")
        found.append(
            RecordedStepCost(
                iteration=int(fields["iteration"]),
                clock_mhz=int(fields["clock_mhz"]),
                instances=int(fields["instances"]),
                start_ms=float(fields["start_ms"]),
                toggles=int(fields["toggles"]),
                toggles_ms=float(fields["toggles_ms"]),
                stop_ms=float(fields["stop_ms"]),
                export_ms=float(fields["export_ms"]),
                trace_mib=float(fields["trace_mib"]),
                error=None if error is None else error.removesuffix(") (measured)"),
            )
        )
    return found
