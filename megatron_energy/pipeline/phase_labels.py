"""Names of phase boundaries in a plan: what the runtime needs to schedule a phase's clock ahead.

A phase boundary is ``Boundary(instruction, phase)`` with ``phase`` written by :func:`phase_label`, e.g.
``p3:memory:modelled:at=1.234ms:lead=10.000ms``: the phase's index, class and provenance (``modelled``: from
the per-class split; ``measured``: from a kernel timeline), its planned start from the instruction's start,
and how long before that start the clock must be requested (0 for a switch down, the latency for a switch
up). An instruction's restoring request (back to its base clock one latency before its planned end, so
the next instruction starts at the clock the base plan left it) is ``p-restore``. Tail phases (after the
rank's last instruction) start with ``tail``; a tail's restoring request is ``tail-restore``. A request
issued at a runtime hook names it after ``@`` (``events.OUTSIDE_PHASES``), e.g.
``tail1@optimizer:memory:measured:at=30.000ms:lead=0.000ms`` goes out when the optimizer step begins; a
label without one (phases inside an instruction) has no hook of its own: the runtime requests it at its
time from the instruction's start (``runtime.running.phase_switcher``). :func:`parse_phase_label` reads it
back.
"""

from __future__ import annotations

from dataclasses import dataclass

INSIDE_SCOPES = ("p", "p-restore")
"""Scopes of requests inside an instruction (their ``at`` is from the instruction's start)."""


@dataclass(frozen=True)
class PhaseLabel:
    """A phase boundary's name, parsed."""

    scope: str
    """``p`` or ``p-restore`` (inside the instruction), ``tail`` or ``tail-restore`` (after it)."""
    index: int
    """The phase's index in its sequence."""
    kind: str
    """The phase's class (``compute``, ``memory``, ``communication``, ``mixed``, or ``restore``)."""
    provenance: str
    """``modelled`` or ``measured``."""
    at_s: float
    """Planned start, seconds from the instruction's start (the tail's: from the last instruction's end)."""
    lead_s: float
    """How long before ``at_s`` the clock is requested."""
    hook: str | None = None
    """The runtime hook at which the request goes out (an outside phase's name); ``None``: none."""

    def __str__(self) -> str:
        return phase_label(self)


def phase_label(label: PhaseLabel) -> str:
    """The boundary name of ``label``."""
    hook = "" if label.hook is None else f"@{label.hook}"
    return (
        f"{label.scope}{label.index}{hook}:{label.kind}:{label.provenance}:"
        f"at={1e3 * label.at_s:.3f}ms:lead={1e3 * label.lead_s:.3f}ms"
    )


def parse_phase_label(text: str) -> PhaseLabel:
    """Read a boundary name written by :func:`phase_label`.

    Raises:
        ValueError: If ``text`` is not such a name.
    """
    try:
        head, kind, provenance, at, lead = text.split(":")
        head, _, hook = head.partition("@")
        scope = head.rstrip("0123456789")
        return PhaseLabel(
            scope,
            int(head[len(scope) :]),
            kind,
            provenance,
            float(at.removeprefix("at=").removesuffix("ms")) / 1e3,
            float(lead.removeprefix("lead=").removesuffix("ms")) / 1e3,
            hook or None,
        )
    except ValueError:
        raise ValueError(
            f"{text!r} is not a phase boundary name (e.g. p3:memory:modelled:at=1.2ms:lead=0ms)"
        ) from None
