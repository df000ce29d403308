"""Phase labels of a plan: what the runtime needs to schedule a phase's clock ahead, as a typed value.

A phase boundary is ``Boundary(instruction, PhaseLabel(...))``: the phase's scope and index, its class and
provenance (``modelled``: from the per-class split; ``measured``: from a kernel timeline), its planned start
from the instruction's start, and how long before that start the clock must be requested (0 for a switch
down, the latency for a switch up). An instruction's restoring request (back to its base clock one latency
before its planned end, so the next instruction starts at the clock the base plan left it) has scope
``p-restore``. Tail phases (after the rank's last instruction) have scope ``tail``; a tail's restoring
request ``tail-restore``. A request issued at a runtime hook names it (:class:`OutsideHook`: an outside
phase of ``events.OUTSIDE_PHASES``, at its start or its end), e.g. the optimizer step's start; a label
without one (phases inside an instruction) has no hook of its own: the runtime requests it at its time from
the instruction's start (``runtime.running.phase_switcher``).

The plan file holds a label as a JSON object of these fields (``plan_file``); the checks on the fields
(annotations) are the file's. ``str(label)`` is for messages only: nothing parses it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Ge, MinLen

PhaseScope = Literal["p", "p-restore", "tail", "tail-restore"]
"""Where a phase request goes: inside an instruction (``p``), or in the iteration tail (``tail``)."""

INSIDE_SCOPES: tuple[PhaseScope, ...] = ("p", "p-restore")
"""Scopes of requests inside an instruction (their ``at_s`` is from the instruction's start)."""

PhaseKind = Literal["compute", "memory", "communication", "mixed", "restore"]
"""A phase's class (``pipeline.phase_timeline.PhaseClass``), or ``restore`` for a restoring request."""

PhaseProvenance = Literal["modelled", "measured"]
"""Where a phase's planned start comes from: the per-class split, or a kernel timeline (or hooks)."""


@dataclass(frozen=True)
class OutsideHook:
    """The runtime hook at which a request goes out: the start or the end of an outside phase."""

    phase: Annotated[str, MinLen(1)]
    """The outside phase (``events.OUTSIDE_PHASES``), e.g. ``optimizer``."""
    at_end: bool = False
    """Whether the request goes out when the phase ends rather than when it begins."""

    def __str__(self) -> str:
        return f"{self.phase}.end" if self.at_end else self.phase


@dataclass(frozen=True)
class PhaseLabel:
    """A phase boundary of a plan: which phase, and when its clock is requested."""

    scope: PhaseScope
    """``p`` or ``p-restore`` (inside the instruction), ``tail`` or ``tail-restore`` (after it)."""
    index: Annotated[int, Ge(0)]
    """The phase's index in its sequence."""
    kind: PhaseKind
    """The phase's class (``compute``, ``memory``, ``communication``, ``mixed``, or ``restore``)."""
    provenance: PhaseProvenance
    """Where the phase's planned start comes from: the per-class split or a kernel timeline."""
    at_s: Annotated[float, Ge(0)]
    """Planned start, seconds from the instruction's start (the tail's: from the last instruction's end)."""
    lead_s: Annotated[float, Ge(0)]
    """How long before ``at_s`` the clock is requested."""
    hook: OutsideHook | None = None
    """The runtime hook at which the request goes out; ``None``: none (requested by time)."""

    @property
    def inside(self) -> bool:
        """Whether the request lies inside an instruction (time-anchored from the instruction's start)."""
        return self.scope in INSIDE_SCOPES

    def __str__(self) -> str:
        hook = "" if self.hook is None else f"@{self.hook}"
        return (
            f"{self.scope}{self.index}{hook} ({self.kind}, {self.provenance}) at {1e3 * self.at_s:.3f} ms, "
            f"lead {1e3 * self.lead_s:.3f} ms"
        )
