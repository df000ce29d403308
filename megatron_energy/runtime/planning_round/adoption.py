"""Adopting a released plan on every rank, or on none: the one decision the planning round ends with.

Every rank parses the same plan text and builds its runner; one small reduction says whether every rank
could. Only then does each rank run it: the plan, its baseline and runner go into the session's state, the
plan's memory clock is set, and the adoption callback runs (the run guard starts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from megatron_energy.log import log_single_rank
from megatron_energy.plan import Plan
from megatron_energy.plan_file import read_plan
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import RankComms
from megatron_energy.runtime.control_plane.group_chain import reduce_everywhere
from megatron_energy.runtime.parts import Controller
from megatron_energy.runtime.planning_round.planning import PlanRelease, plan_summary
from megatron_energy.runtime.running.plan_runner import PlanRunner
from megatron_energy.runtime.session_phase import SessionPhase
from megatron_energy.runtime.session_state import SessionState

logger = logging.getLogger(__name__)


def adopt_everywhere(
    release: PlanRelease,
    *,
    fingerprint: str,
    context: JobContext,
    comms: RankComms,
    state: SessionState,
    controller: Controller,
    on_adopted: Callable[[Plan], None],
) -> bool:
    """Every rank parses the same plan text; all run it only if every rank could (one small reduction).

    Args:
        release: The plan text and baseline rank 0 released.
        fingerprint: The job's fingerprint; a plan of another job is refused.
        context: This rank's place in the job.
        comms: Collectives over the job's process groups.
        state: The session's state: the plan, baseline and runner go there, and the phase.
        controller: This rank's clock controller (the plan's memory clock is set on it).
        on_adopted: Called with the plan once every rank has adopted it.

    Returns:
        Whether every rank adopted the plan (else none did, and each rank that could not says why).
    """
    try:
        plan = read_plan(release.plan_text, source="the broadcast plan", expected_fingerprint=fingerprint)
        runner = PlanRunner(plan, context.pipeline_rank, context.orders.steps(context.pipeline_rank))
        problem = None
    except Exception as error:  # agreed on below, never raised into the step
        problem = error
        logger.info(f"[energy] rank {context.global_rank}: cannot run the plan: {error}")
    (failed_anywhere,) = reduce_everywhere(comms, [0.0 if problem is None else 1.0])
    if failed_anywhere:
        return False
    log_single_rank(logger, context.global_rank, plan_summary(plan, release.plan_text))
    hooks = runner.hook_report(inside_switched=state.phase_switcher is not None)
    if hooks is not None and context.full_iteration_graph:
        hooks += (
            " (a replayed graph runs no hook inside it: these clocks, but the optimizer step's, go out "
            "by time from the replay's start, the gradient sync's at the last instruction's end)"
        )
    if hooks is not None and context.data_parallel_rank == 0:
        logger.info(f"[energy] rank {context.global_rank}: {hooks}")
    state.plan = plan
    state.baseline = release.baseline
    state.run(runner)
    controller.set_memory_clock(plan.memory_clock_for(context.pipeline_rank))
    state.phase = SessionPhase.PLANNED
    on_adopted(plan)
    return True
