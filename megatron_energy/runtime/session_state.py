"""What the session's rooms share while a job runs: its phase, the adopted plan and what runs it."""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron_energy.plan import Plan
from megatron_energy.runtime.parts import PhaseSwitching
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.runtime.running.plan_runner import PlanRunner
from megatron_energy.runtime.session_phase import SessionPhase


@dataclass
class SessionState:
    """A rank's session state: the planning round writes it, the run guard and the event handlers read it."""

    phase: SessionPhase = SessionPhase.PROFILING
    """What the session is doing; the energy log names each step by the phase it ran in."""

    plan: Plan | None = None
    """The plan every rank adopted; ``None`` until then, and for good when none was."""

    baseline: StockBaseline = field(default_factory=StockBaseline)
    """The stock baseline every measured change is set against: the adopted release's (empty before)."""

    runner: PlanRunner | None = None
    """Applies this rank's actions at its hooks; ``None`` while profiling and planning, after a fallback and
    while the safety net holds stock clocks."""

    phase_switcher: PhaseSwitching | None = None
    """Requests the plan's clocks inside instructions; ``None`` where phase switching is off (turned off
    for the rest of the run after an error)."""
