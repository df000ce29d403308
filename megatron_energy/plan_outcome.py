"""Why a plan saves nothing: the one sentence its plan line, the summary and the report give.

A mode can rightly find nothing. Kareus has no collective to schedule, or none whose schedule the overlap
model prices below megatron-core's defaults; the phase planner (``kernel``) finds no phase that gains from a
clock of its own once the switch latency is paid; Perseus finds no instruction with slack at the target.
:func:`why_nothing_found` reads this from the plan itself (its actions and figures), so a cached plan says
it as the fresh one did.
"""

from __future__ import annotations

from megatron_energy.pipeline.collectives import parse_collective_name
from megatron_energy.plan import ClockAction, CollectiveAction, Plan
from megatron_energy.plan_band import energy_change

SAVING_FLOOR = 1e-6
"""A target point whose modelled energy is within this fraction of stock saves nothing."""


def plan_saving(plan: Plan) -> float:
    """:func:`energy_change` of the plan's target point against its stock baseline (modelled)."""
    return energy_change(plan.baseline.energy_j, plan.target_point.energy_j)


def change_text(change: float) -> str:
    """A predicted relative change as every table and line prints it: ``-11.76 %``, or ``no change``."""
    return "no change" if abs(change) <= SAVING_FLOOR else f"{100 * change:+.2f} %"


def why_nothing_found(plan: Plan) -> str | None:
    """Why the plan's target point saves no energy over stock clocks; ``None`` when it saves some.

    Args:
        plan: The plan (every figure in it modelled).

    Returns:
        ``"nothing found: <optimiser>: <why>; ..."`` per optimiser of the plan, or ``None``.
    """
    if plan_saving(plan) < -SAVING_FLOOR:
        return None
    target = plan.target_point
    actions = [action for rank in target.ranks for action in rank.actions]
    reasons = []
    if "perseus" in plan.optimisers:
        reasons.append("perseus: no instruction has slack to run slower at the target")
    if "kareus" in plan.optimisers:
        classes = sorted(
            {
                parse_collective_name(a.collective).class_key
                for a in actions
                if isinstance(a, CollectiveAction)
            }
        )
        if classes:
            reasons.append(
                f"kareus: no schedule of the job's collectives ({', '.join(classes)}) that the overlap model "
                "prices below megatron-core's defaults"
            )
        else:
            reasons.append("kareus: the job has no collective to schedule")
    if "kernel" in plan.optimisers and not any(
        isinstance(action, ClockAction) and action.at.phase is not None for action in actions
    ):
        reasons.append(
            "kernel: no phase gains from a clock of its own once a "
            f"{1e3 * plan.switch_latency_s:g} ms clock switch is paid (its phases are shorter than the "
            "switch latency)"
        )
    return "nothing found: " + "; ".join(reasons or ["no optimiser changed the stock clocks"])
