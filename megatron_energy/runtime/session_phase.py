"""What an energy session is doing: one explicit phase, whose value is how the energy log names it."""

from __future__ import annotations

from enum import StrEnum


class SessionPhase(StrEnum):
    """The session's phase; each step is logged with the phase it ran in (its value is the logged text)."""

    PROFILING = "profiling"
    """Measuring the profiling grid: the stock clock's baseline steps, then the other clocks."""

    PLANNING = "stock (planning)"
    """The plan is computed in the background, at stock clocks; no run-phase policy acts."""

    PLANNED = "planned"
    """The plan runs."""

    FOLLOWING_STRAGGLER = "following straggler"
    """The plan runs at a slower replica's pace (another point of the plan's frontier)."""

    SAFETY_NET = "stock (safety net)"
    """The safety net holds stock clocks after the plan ran too slow."""

    PLANNING_FAILED = "stock (planning failed)"
    """No plan: every rank trains on at stock clocks (the log says why)."""
