"""The interfaces ``EnergySession`` needs from its parts, and the port that tells which plan point runs.

The dvfs layer implements the GPU-side parts; a :class:`PlanFollower` (``megatron.collective_runner``) is
told a :class:`RunningPoint` by the session's state (``runtime.session_state``) whenever that changes.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from megatron_energy.dvfs.controller import BoundaryEvent
from megatron_energy.dvfs.meter import EnergyWindow
from megatron_energy.pipeline.instruction import Instruction, Step, passes
from megatron_energy.plan import Action, Plan

if TYPE_CHECKING:
    from collections.abc import Callable

    from megatron_energy.runtime.running.plan_runner import InsideRequest


class Controller(Protocol):
    """Changes this rank's SM clock at instruction boundaries (``dvfs.controller.FrequencyController``)."""

    def request(self, clock_mhz: float | None, boundary_event: BoundaryEvent | None = None) -> bool:
        """Ask for ``clock_mhz`` (``RESET`` for stock) once ``boundary_event`` completes on the GPU."""
        ...

    def set_memory_clock(self, clock_mhz: int | None) -> None:
        """Run at memory clock ``clock_mhz`` from now on (``None``: the stock one); a plan sets it once."""
        ...

    def close(self) -> None:
        """Stop switching and reset any clock this controller locked."""
        ...


class Meter(Protocol):
    """Measures this rank's GPU energy between laps (``dvfs.meter.EnergyMeter``)."""

    def lap(self, name: str = "iteration") -> EnergyWindow | None:
        """Close the current window and open the next; ``None`` when no counter is readable."""
        ...


class Guard(Protocol):
    """Resets locked clocks however the process ends (``dvfs.guard.ClockGuard``)."""

    def close(self) -> None:
        """Release the guard after a clean reset."""
        ...


class InsideController(Protocol):
    """What a phase switcher needs of the controller (``dvfs.controller.FrequencyController``)."""

    @property
    def active(self) -> bool:
        """False once the controller is closed or monitor-only."""
        ...

    def request_inside(self, clock_mhz: float, stale: Callable[[], bool]) -> bool:
        """Apply ``clock_mhz`` now unless ``stale()`` (checked under the controller's lock)."""
        ...

    def allow_repeat(self) -> None:
        """Let the next request out even if it equals the previous one."""
        ...


def inactive_reason(controller: InsideController) -> str:
    """Why a controller stopped taking requests, as far as it says."""
    return getattr(controller, "monitor_only_reason", None) or "closed"


@dataclass
class SwitchCounts:
    """What a phase switcher did with the requests inside instructions."""

    scheduled: int = 0
    """Requests handed to it."""
    applied: int = 0
    """Requests the controller took (a dry run records them)."""
    stale: int = 0
    """Requests dropped at their time: their instruction had ended on the GPU (or switching was cancelled)."""
    dropped: int = 0
    """Requests dropped unmade: queue full, cancelled (a revert to stock clocks) or at close."""
    late_s: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENESS_KEPT))
    """How long after its offset each of the latest applied requests went out (host clock, measured; the
    last :data:`LATENESS_KEPT`)."""

    def note_lateness(self, late_s: float) -> None:
        """Keep how late an applied request went out."""
        self.late_s.append(late_s)

    def summary(self) -> str:
        """What became of the requests, for the log (counted on this rank's host)."""
        line = (
            f"phase clocks inside instructions: {self.applied} of {self.scheduled} requested at their "
            f"offsets, {self.stale} stale (instruction ended first), {self.dropped} dropped (queue full, "
            "revert or exit)"
        )
        if self.late_s:
            line += (
                f"; after their offsets by median {1e3 * statistics.median(self.late_s):.2f} ms, max "
                f"{1e3 * max(self.late_s):.2f} ms (measured, host clock, last {len(self.late_s)})"
            )
        return line


LATENESS_KEPT = 4096
"""Applied requests whose lateness a :class:`SwitchCounts` keeps."""


class PhaseSwitching(Protocol):
    """Requests clocks inside instructions (``running.phase_switcher``, ``running.simulated_phases``)."""

    counts: SwitchCounts

    def begin(self, instruction: Step, anchor: Any, requests: Sequence[InsideRequest]) -> None:
        """An instruction starts: request each of ``requests`` at its offset from ``anchor`` (its start)."""
        ...

    def end(self, instruction: Step, marker: Any) -> None:
        """An instruction ends (``marker``: its end event, or ``None``)."""
        ...

    def cancel(self) -> None:
        """Drop every request not made yet."""
        ...

    def take_error(self) -> BaseException | None:
        """The error that stopped phase switching, once; ``None`` if none."""
        ...

    def close(self) -> None:
        """Stop; drop what is pending."""
        ...


@dataclass(frozen=True)
class RunningPoint:
    """Which point of the adopted plan this rank runs: what the session tells a :class:`PlanFollower`."""

    plan: Plan
    """The plan every rank adopted."""

    index: int
    """The running point's index in ``plan.points``: the target, or the point a straggler's pace selected."""

    stage: int
    """This rank's pipeline stage."""

    order: tuple[Step, ...]
    """This rank's executed steps (``PipelineOrders.steps``), which the plan's actions name."""

    @property
    def actions(self) -> tuple[Action, ...]:
        """This rank's actions at the running point."""
        return self.plan.points[self.index].ranks[self.stage].actions

    @property
    def passes(self) -> tuple[Instruction, ...]:
        """This rank's passes in execution order (a fused step's forward, then its backward)."""
        return tuple(single for step in self.order for single in passes(step))


class PlanFollower(Protocol):
    """Follows the plan point this rank runs (``megatron.collective_runner.CollectiveRunner``)."""

    def follow(self, running: RunningPoint | None) -> None:
        """``running`` runs from the next step on; ``None``: no plan does (stock clocks, profiling)."""
        ...
