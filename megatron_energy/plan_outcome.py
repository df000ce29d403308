"""Why a plan saves nothing: the one sentence its plan line, the summary and the report give.

A mode can rightly find nothing. Kareus has no collective to schedule, or none whose schedule the overlap
model prices below megatron-core's defaults; the phase planner (``kernel``) finds no phase that gains from a
clock of its own once the switch latency is paid; Perseus finds no instruction with slack at the target.
:func:`why_nothing_found` reads this from the plan itself (its actions and figures), so a cached plan says
it as the fresh one did.
"""

from __future__ import annotations

from megatron_energy.plan import ClockAction, CollectiveAction, Plan
from megatron_energy.plan_band import SavingBand, energy_change

SAVING_FLOOR = 1e-6
"""A target point whose modelled energy is within this fraction of stock saves nothing."""


def plan_saving(plan: Plan) -> float:
    """:func:`energy_change` of the plan's target point against its stock baseline (modelled)."""
    return energy_change(plan.baseline.energy_j, plan.target_point.energy_j)


def change_text(change: float) -> str:
    """A predicted relative change as every table and line prints it: ``-11.76 %``, or ``no change``."""
    return "no change" if abs(change) <= SAVING_FLOOR else f"{100 * change:+.2f} %"


def band_ends(band: SavingBand | None, digits: int = 2) -> str:
    """A modelled change's band as every output prints it after the change: ``(-4.80 to -6.70 %, modelled)``.

    The end nearer zero first (the smaller saving, then the larger); ``(modelled; no band: ...)`` for a plan
    file written before bands. A measured change's statistical interval never takes this notation
    (``stats.RelativeChange.format``: ``± x % (measured, 95 % CI, n=..)``).
    """
    if band is None:
        return "(modelled; no band: the plan file predates saving bands)"
    first, second = (band.high, band.low) if band.low + band.high < 0 else (band.low, band.high)
    return f"({100 * first:+.{digits}f} to {100 * second:+.{digits}f} %, modelled)"


def banded_text(change: float, band: SavingBand | None) -> str:
    """A modelled change with its band: ``-5.98 % (-1.60 to -11.58 %, modelled)``.

    ``no change (modelled)`` when it changes nothing (no saving to give a band to).
    """
    text = change_text(change)
    return f"{text} (modelled)" if abs(change) <= SAVING_FLOOR else f"{text} {band_ends(band)}"


def saving_text(plan: Plan) -> str:
    """The plan's saving with its band (:func:`banded_text`)."""
    return banded_text(plan_saving(plan), plan.saving_band)


def run_band(plan: Plan, change: float) -> SavingBand | None:
    """The plan's band moved to ``change``; ``None`` without a band.

    A figure that prices the plan again (a run on simulated GPUs, ``simulate --plan``) keeps the band's
    extent around its own value.
    """
    band = plan.saving_band
    return None if band is None else band.shifted(change - plan_saving(plan))


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
    filler_j = 0.0 if plan.smoothing is None else plan.smoothing.filler_j
    if filler_j > 0:
        reasons.append(f"smooth: its {filler_j:,.1f} J of filler per iteration outweigh what its clocks save")
    clocks_save = energy_change(plan.baseline.energy_j, target.energy_j - filler_j) < -SAVING_FLOOR
    if "perseus" in plan.optimisers and not clocks_save:
        reasons.append("perseus: no instruction has slack to run slower at the target")
    if "kareus" in plan.optimisers:
        classes = sorted({a.collective.class_key for a in actions if isinstance(a, CollectiveAction)})
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
