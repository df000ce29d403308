"""Run-phase policies: follow a straggling data-parallel replica, and fall back to stock clocks when slow.

Both are pure bookkeeping over per-step iteration times; the session feeds them and acts on their answers.
With several data-parallel replicas the safety net holds a trip until the next exchange of the replicas'
paces says whether the other replicas are slow too (``SafetyNet.observe``'s ``hold``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

STRAGGLER_TOLERANCE = 0.03
"""Relative excess of a replica's measured time over its plan's that marks it a straggler (3 %)."""


@dataclass
class StragglerPolicy:
    """Decides the pace the data-parallel replicas should plan for.

    Every replica contributes one number to each exchange of paces (every K steps,
    ``runtime.control_plane.staged_exchange.pace_stages``), a max over the data-parallel group: its measured
    intrinsic iteration time when it runs more than ``tolerance`` slower than its current plan predicts (an
    extrinsic slowdown: throttling, a slow node), else the nominal plan time. The maximum is the pace of the
    slowest replica; the others move to the frontier point at that pace, and back once it recovers.

    Args:
        nominal_time_s: The iteration time of the plan chosen for the target (predicted).
        tolerance: Relative excess that counts as straggling, and the hysteresis for moving.
    """

    nominal_time_s: float
    tolerance: float = STRAGGLER_TOLERANCE
    pace_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.pace_s = self.nominal_time_s

    def contribution(self, measured_s: float, predicted_s: float) -> float:
        """What this replica puts into the all-reduce this step.

        Args:
            measured_s: This replica's intrinsic iteration time this step.
            predicted_s: What its current plan predicts for it.

        Returns:
            The measured time when straggling, else the nominal plan time.
        """
        if measured_s > predicted_s * (1.0 + self.tolerance):
            return measured_s
        return self.nominal_time_s

    def update(self, slowest_s: float, straggling: bool) -> float | None:
        """Take the all-reduced maximum; return a new pace to plan for, or ``None`` to keep the current one.

        Args:
            slowest_s: The maximum of every replica's contribution.
            straggling: Whether this replica is itself the straggler (it keeps its own plan).

        Returns:
            The new pace in seconds (the nominal time when the straggler recovered), or ``None``.
        """
        recovered = slowest_s <= self.nominal_time_s * (1.0 + self.tolerance)
        wanted = self.nominal_time_s if straggling or recovered else slowest_s
        if wanted == self.pace_s:
            return None
        following = self.pace_s != self.nominal_time_s and wanted != self.nominal_time_s
        if following and abs(wanted - self.pace_s) <= self.tolerance * self.pace_s:
            return None
        self.pace_s = wanted
        return wanted


NOISE_SIGMAS = 2.0
"""Standard deviations of the stock steps' iteration times a step must also exceed its target by to count
as slow (about the 98th percentile of one noisy step)."""


SAFETY_REARMS = 2
"""Times a run's safety net re-arms after trips that the stock steps showed came from outside the plan."""


@dataclass
class SafetyNet:
    """Reverts to stock clocks when the plan is slower than its target for several consecutive steps.

    A step is slow when it exceeds its target by more than ``tolerance`` *and* by more than
    :data:`NOISE_SIGMAS` standard deviations of the stock steps' own iteration times (``noise_s``): on a
    machine whose iterations swing by more than the tolerance with nothing changed, slow steps of that size
    are not the plan's doing (measured on a shared H200: a dry run tripped a 5 %, 3-step net on noise alone).

    Under a power budget a step that draws more than its allowed power (by more than ``tolerance``) is a
    violation too: a sustained overshoot trips the net like a sustained slowdown (``last_cause`` says which).

    After a trip on time, the stock steps that follow tell whose slowdown it was (:meth:`observe_stock`): when
    ``patience`` of them in a row are as slow against the stock baseline, the slowdown came from outside the
    plan (another job on a shared GPU, throttling), and once ``patience`` stock steps in a row are back to
    normal the net re-arms and the plan may run again, at most ``rearms`` times in a run. When ``patience``
    normal stock steps come first, the plan was to blame and the revert stays for the rest of the run.

    Args:
        tolerance: Relative excess over the target that counts as a violation.
        patience: Consecutive violating steps before reverting.
    """

    tolerance: float
    patience: int
    rearms: int = SAFETY_REARMS
    """Re-arms left: times the plan may run again after a trip that stock steps showed was not its own."""
    violations: int = 0
    tripped: bool = False
    last_cause: str | None = None
    """What the last violating step broke: ``"time"`` or ``"power"`` (``None`` before any violation)."""
    excused: bool = False
    """After a trip: stock steps were as slow, so the slowdown came from outside the plan."""
    _stock_slow: int = field(default=0, init=False, repr=False)
    _stock_normal: int = field(default=0, init=False, repr=False)

    def _slow(self, measured_s: float, target_s: float, noise_s: float) -> bool:
        """Whether a step exceeds its target by more than the tolerance and the stock steps' own noise."""
        return (
            measured_s > target_s * (1.0 + self.tolerance) and measured_s - target_s > NOISE_SIGMAS * noise_s
        )

    def excuse(self) -> None:
        """Record a slow step the plan is not to blame for (only this replica is slow): it ends a streak."""
        self.violations = 0

    def observe(
        self,
        measured_s: float,
        target_s: float,
        power_w: float | None = None,
        allowed_w: float | None = None,
        noise_s: float = 0.0,
        *,
        hold: bool = False,
    ) -> bool:
        """Record one step; return ``True`` exactly once, on the step that trips the net.

        Args:
            measured_s: The step's iteration time.
            target_s: The time the plan is allowed to take.
            power_w: The step's average power on this GPU, when a power budget applies (NaN: unknown).
            allowed_w: The power this GPU may draw under the budget (``runtime.running.power_watch``).
            noise_s: Standard deviation of a stock step's iteration time (0: unknown).
            hold: A streak that reaches the patience does not trip yet: :meth:`confirm` trips it once the
                replicas' exchange says the other replicas are slow too (else :meth:`excuse` ends it).
        """
        if self.tripped:
            return False
        slow = self._slow(measured_s, target_s, noise_s)
        over = power_w is not None and allowed_w is not None and power_w > allowed_w * (1.0 + self.tolerance)
        if slow or over:
            self.last_cause = "time" if slow else "power"
        self.violations = self.violations + 1 if slow or over else 0
        return not hold and self.confirm()

    def confirm(self, since: int = 0) -> bool:
        """Trip the net if a streak of violations has reached the patience; return whether it tripped now.

        Args:
            since: Steps since the step the confirming verdict is about: it confirms the streak only if that
                step lies within it (a verdict about an earlier step says nothing about the streak's steps).
        """
        if self.tripped or self.violations < self.patience or self.violations <= since:
            return False
        self.tripped = True
        return True

    def observe_stock(self, measured_s: float, stock_s: float, noise_s: float = 0.0) -> bool:
        """Record one stock step after a trip; return ``True`` exactly once, on the step that re-arms the net.

        Args:
            measured_s: The stock step's iteration time.
            stock_s: The measured stock baseline's iteration time.
            noise_s: Standard deviation of a stock step's iteration time (0: unknown).
        """
        if not self.tripped or self.last_cause != "time" or self.rearms <= 0:
            return False
        slow = self._slow(measured_s, stock_s, noise_s)
        self._stock_slow = self._stock_slow + 1 if slow else 0
        self._stock_normal = 0 if slow else self._stock_normal + 1
        if not self.excused:
            if self._stock_slow >= self.patience:
                self.excused = True
            elif self._stock_normal >= self.patience:
                self.rearms = 0  # stock clocks run at their pace: the plan was slow
            return False
        if self._stock_normal < self.patience:
            return False
        self.rearms -= 1
        self.violations = self._stock_slow = self._stock_normal = 0
        self.tripped = self.excused = False
        self.last_cause = None
        return True
