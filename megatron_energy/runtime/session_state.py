"""What the session's rooms share while a job runs: its phase, the adopted plan and what runs it."""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron_energy.errors import EnergyRuntimeError
from megatron_energy.plan import Plan
from megatron_energy.runtime.parts import PhaseSwitching, PlanFollower, RunningPoint
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.runtime.running.plan_runner import PlanRunner
from megatron_energy.runtime.session_phase import SessionPhase


@dataclass
class SessionState:
    """A rank's session state: the planning round and the run guard write it, the event handlers read it.

    What runs changes only through :meth:`run`, :meth:`stop` and :meth:`select`, which tell every
    :class:`~megatron_energy.runtime.parts.PlanFollower` (:meth:`follow`) the point that runs from then on.
    """

    phase: SessionPhase = SessionPhase.PROFILING
    """What the session is doing; the energy log names each step by the phase it ran in."""

    plan: Plan | None = None
    """The plan every rank adopted; ``None`` until then, and for good when none was."""

    baseline: StockBaseline = field(default_factory=StockBaseline)
    """The stock baseline every measured change is set against: the adopted release's (empty before)."""

    phase_switcher: PhaseSwitching | None = None
    """Requests the plan's clocks inside instructions; ``None`` where phase switching is off (turned off
    for the rest of the run after an error)."""

    _runner: PlanRunner | None = field(default=None, init=False, repr=False)
    _followers: list[PlanFollower] = field(default_factory=list, init=False, repr=False)
    _told: RunningPoint | None = field(default=None, init=False, repr=False)

    @property
    def runner(self) -> PlanRunner | None:
        """What applies this rank's actions at its hooks.

        ``None`` while profiling and planning, after a fallback and while the safety net holds stock clocks.
        """
        return self._runner

    @property
    def running(self) -> RunningPoint | None:
        """The plan point this rank runs; ``None`` while no plan's actions run."""
        runner = self._runner
        if runner is None:
            return None
        return RunningPoint(runner.plan, runner.index, runner.stage, runner.order)

    def run(self, runner: PlanRunner) -> None:
        """Run ``runner``'s plan at its point from now on (an adoption, a re-arm); tell the followers."""
        self._runner = runner
        self._tell()

    def stop(self) -> None:
        """Run no plan from now on (a fallback, a safety-net trip); tell the followers."""
        self._runner = None
        self._tell()

    def select(self, index: int) -> None:
        """Run the plan's point ``index`` from now on (a straggler's pace); tell the followers.

        Raises:
            EnergyRuntimeError: No plan runs.
        """
        if self._runner is None:
            raise EnergyRuntimeError(f"no plan runs: its point {index} cannot be selected")
        self._runner.select(index)
        self._tell()

    def follow(self, follower: PlanFollower) -> None:
        """Tell ``follower`` the point that runs now, and again each time another one does."""
        self._followers.append(follower)
        follower.follow(self.running)

    def _tell(self) -> None:
        """Tell the followers the point that runs, when it is not the one they were told last."""
        running = self.running
        if running == self._told:
            return
        self._told = running
        for follower in self._followers:
            follower.follow(running)
