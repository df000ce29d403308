"""``RunGuard``: each run-phase step against the plan: follow a straggling replica, revert when slow.

Data-parallel replicas follow a straggler's pace to another point of the same plan, exchanged every K steps
over the pipeline, tensor and data-parallel groups one group a step, asynchronously
(``control_plane.staged_exchange.pace_stages``, K from ``control_plane.exchange_period``); a safety net
reverts to stock clocks if the plan is slow (with several replicas once an exchange says the others are slow
too), and re-arms once stock steps show the slowdown was not the plan's (``running.policies``).
"""

from __future__ import annotations

import functools
import logging

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.controller import RESET
from megatron_energy.log import log_single_rank
from megatron_energy.plan import Plan
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import GROUPS, RankComms
from megatron_energy.runtime.control_plane.exchange_period import HOP_S, exchange_cost_s, exchange_period
from megatron_energy.runtime.control_plane.staged_exchange import PaceVerdict, StagedExchange, pace_stages
from megatron_energy.runtime.parts import Controller
from megatron_energy.runtime.running.plan_runner import PlanRunner
from megatron_energy.runtime.running.policies import SafetyNet, StragglerPolicy
from megatron_energy.runtime.running.power_watch import allowed_power_w
from megatron_energy.runtime.session_phase import SessionPhase
from megatron_energy.runtime.session_state import SessionState
from megatron_energy.runtime.step_figures import StepFigures

logger = logging.getLogger(__name__)


class RunGuard:
    """One rank's run-phase policies over the session's state.

    Args:
        config: The ``--energy-*`` configuration (safety tolerance and steps, the target).
        context: This rank's place in the job.
        state: The session's state: the guard stops, restarts and moves the running plan and sets the phase.
        controller: This rank's clock controller (stock clocks on a trip).
        comms: Collectives over the job's process groups (the exchange of paces).
        can_set_clocks: Whether clocks are really set (the trip's log line says what a trip changes).
    """

    def __init__(
        self,
        config: EnergyConfig,
        context: JobContext,
        *,
        state: SessionState,
        controller: Controller,
        comms: RankComms,
        can_set_clocks: bool,
    ) -> None:
        self.config = config
        self.context = context
        self.state = state
        self.controller = controller
        self.comms = comms
        self.can_set_clocks = can_set_clocks
        self.safety = SafetyNet(config.safety_tolerance, config.safety_steps)
        self.straggler: StragglerPolicy | None = None
        self._paces: StagedExchange[PaceVerdict] | None = None
        """The replicas' exchange of paces, every K run-phase steps (several replicas, once a plan runs)."""

    def start(self, plan: Plan) -> None:
        """The plan is adopted: its straggler policy, and the exchange of paces with several replicas."""
        self.straggler = StragglerPolicy(nominal_time_s=plan.target_point.iteration_time_s)
        self._paces = self._pace_exchange(plan)

    def after_step(self, step: int, figures: StepFigures, phase: str) -> None:
        """A run-phase step's figures (``phase``: the one it ran in): the exchange of paces, then the net.

        Every run-phase rank takes each step of the straggler exchange, the safety-netted ones too: a replica
        that skipped one would leave the others waiting in its collective.
        """
        alone = self._follow_stragglers(step, figures)
        self.check_safety(figures, alone, step, phase)

    def allowed_time_s(self, predicted_s: float) -> float:
        """The measured iteration time a plan point predicted at ``predicted_s`` may take.

        The measured stock time scaled by the point's predicted slowdown over stock clocks; without a
        measured stock time, the prediction itself.
        """
        stock_s, plan = self.state.baseline.iteration_s, self.state.plan
        if stock_s is None or plan is None:
            return predicted_s
        return stock_s * predicted_s / plan.baseline.iteration_time_s

    def _pace_exchange(self, plan: Plan) -> StagedExchange[PaceVerdict] | None:
        """The replicas' exchange of paces every K steps (``control_plane.exchange_period``); none with one.

        K follows from the job's group sizes and the plan's iteration time, the same on every rank; rank 0
        says what it is and what an exchange costs (modelled).
        """
        if self.context.data_parallel_size == 1:
            return None
        sizes = [self.comms.size(group) for group in GROUPS]
        period = exchange_period(sizes, plan.target_point.iteration_time_s)
        cost_s = exchange_cost_s(sizes)
        log_single_rank(
            logger,
            self.context.global_rank,
            f"[energy] the data-parallel replicas exchange their pace every {period} step(s) over their "
            f"pipeline, tensor and data-parallel groups (sizes {'/'.join(map(str, sizes))}): "
            f"{1e3 * cost_s:.2f} ms per exchange at {1e6 * HOP_S:.0f} µs per hop, "
            f"{1e3 * cost_s / period:.3f} ms per step (modelled)",
        )
        return StagedExchange(period)

    def _follow_stragglers(self, step: int, figures: StepFigures) -> tuple[bool, int] | None:
        """A step of the replicas' exchange of paces; when one completes, follow the slowest replica.

        Returns, on the steps an exchange completes, whether this replica alone was slow and at which step
        (the one the exchange compared); ``None`` on the others. A replica that is slow while another replica
        keeps its plan's pace is slowed by something outside the plan (throttling, a slow node): the plan,
        the same on every replica, is not to blame.
        """
        plan, paces, straggler = self.state.plan, self._paces, self.straggler
        if plan is None or paces is None or straggler is None:
            return None
        tail_s = 0.0 if plan.measured_tail is None else plan.measured_tail.time_s
        # this stage's span (its pipeline's maximum is the replica's, which a slower replica does not
        # lengthen on this one), plus the measured tail, against what the point running at this step predicts
        span_s = figures.timing.intrinsic_s + tail_s
        runner = self.state.runner
        predicted_s = plan.baseline.iteration_time_s if runner is None else runner.predicted_time_s
        contribution = functools.partial(straggler.contribution, predicted_s=predicted_s)
        verdict = paces.step(lambda: pace_stages(self.comms, step, span_s, contribution))
        if verdict is None:
            return None
        straggling = verdict.mine_s != straggler.nominal_time_s
        alone = (straggling and verdict.fastest_s == straggler.nominal_time_s, verdict.step)
        runner = self.state.runner  # the point may have changed since: a trip, a re-arm
        if self.safety.tripped or runner is None:
            return alone
        pace_s = straggler.update(verdict.slowest_s, straggling=straggling)
        if pace_s is None:
            return alone
        self.state.select(plan.index_for_time(pace_s))
        following = not runner.on_target
        self.state.phase = SessionPhase.FOLLOWING_STRAGGLER if following else SessionPhase.PLANNED
        logger.info(
            f"[energy] rank {self.context.global_rank}: "
            + (
                f"a data-parallel replica runs at {1e3 * pace_s:.1f} ms/iter; moving to the frontier point "
                f"at {1e3 * runner.predicted_time_s:.1f} ms (modelled)"
                if following
                else "straggler recovered; back to the target plan"
            )
        )
        return alone

    def check_safety(
        self, figures: StepFigures, alone: tuple[bool, int] | None, step: int, phase: str
    ) -> None:
        """Feed the safety net run-phase step ``step`` (``phase``: the one it ran in); revert or re-arm.

        ``alone`` is the replicas' verdict, on the steps an exchange of paces completes: whether this
        replica alone was slow, and at which step. With several replicas a trip waits for a verdict about a
        step of the slow streak that says the other replicas were slow too.
        """
        runner = self.state.runner
        if runner is None:
            if phase == SessionPhase.SAFETY_NET:
                self._rearm_after(figures)
            return
        if alone is not None and alone[0]:
            self.safety.excuse()
            return
        allowed_s = self.allowed_time_s(runner.predicted_time_s)
        allowed_w = allowed_power_w(self.config.target, runner.point, self.context.pipeline_rank)
        power_w = None if allowed_w is None else figures.energy_j / figures.iteration_s
        noise_s = self.state.baseline.iteration_noise_s
        replicas = self.context.data_parallel_size > 1
        observed = self.safety.observe(
            figures.iteration_s, allowed_s, power_w, allowed_w, noise_s, hold=replicas
        )
        if observed or (alone is not None and self.safety.confirm(since=step - alone[1])):
            self._trip(figures, allowed_s, power_w, allowed_w)

    def _trip(
        self, figures: StepFigures, allowed_s: float, power_w: float | None, allowed_w: float | None
    ) -> None:
        """Stock clocks from the next request on, the phase switcher's pending requests dropped; say why."""
        self.state.stop()
        if self.state.phase_switcher is not None:
            self.state.phase_switcher.cancel()  # no phase clock lands after the reset
        self.controller.request(RESET)
        self.controller.set_memory_clock(None)
        self.state.phase = SessionPhase.SAFETY_NET
        broken = (
            f"power {power_w:.1f} W exceeded the allowed {allowed_w:.1f} W (power budget)"
            if self.safety.last_cause == "power" and power_w is not None and allowed_w is not None
            else f"iteration time {1e3 * figures.iteration_s:.1f} ms exceeded the allowed "
            f"{1e3 * allowed_s:.1f} ms"
        )
        outcome = (
            "clocks reverted to stock"
            if self.can_set_clocks
            else "the plan is left (no clock had been set, so the slowdown came from outside the plan)"
        )
        until = (
            ", until stock steps show the slowdown is not the plan's and it has passed"
            if self.safety.last_cause == "time" and self.safety.rearms > 0
            else " for the rest of the run"
        )
        logger.info(
            f"[energy] rank {self.context.global_rank}: {broken} by more "
            f"than {100 * self.config.safety_tolerance:.0f}% for {self.config.safety_steps} consecutive "
            f"steps; {outcome}{until}"
        )

    def _rearm_after(self, figures: StepFigures) -> None:
        """A stock step after a trip: the plan runs again once the net re-arms (``observe_stock``)."""
        baseline, plan = self.state.baseline, self.state.plan
        if baseline.iteration_s is None or plan is None:
            return
        if not self.safety.observe_stock(
            figures.iteration_s, baseline.iteration_s, baseline.iteration_noise_s
        ):
            return
        rank = self.context.pipeline_rank
        self.state.run(PlanRunner(plan, rank, self.context.orders.steps(rank)))
        self.controller.set_memory_clock(plan.memory_clock_for(rank))
        self.straggler = StragglerPolicy(nominal_time_s=plan.target_point.iteration_time_s)
        self.state.phase = SessionPhase.PLANNED
        logger.info(
            f"[energy] rank {self.context.global_rank}: stock steps were as slow as the plan's, then "
            f"recovered (the slowdown came from outside the plan); the plan runs again ({self.safety.rearms} "
            "more re-arm(s) left)"
        )
