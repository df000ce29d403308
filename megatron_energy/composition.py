"""``--energy-mode all``: optimisers run in a fixed order, each refining the plan of the one before.

The first optimiser plans from scratch (``base=None``). Each later one receives the previous plan as
``base``: it keeps the base plan's points (deadlines, target choice, the clock actions it does not own)
and may add actions it owns (collective launch points and budgets, phase clocks) or replace those, but a
point it returns must not predict an iteration slower than the base point's deadline. The profile request
of a composition is the union of its parts' requests, so one profiling pass serves every part.

With today's released optimisers ``all`` is Perseus, then Kareus, then the phase clocks (``kernel``):
Perseus picks the clock of every instruction (its frontier points); Kareus keeps each point's clocks, shifts
those of the instructions a collective overlaps where that helps, adds the collective actions (launch point
and CTA budget per collective), and prices the point with the overlap model (``sim.overlap``); the phase
optimiser adds clocks inside instructions and in the iteration tail.

Composition never loses: a part's refinement is kept only if the plan's target point then predicts no
slower an iteration than the target allows (the point's deadline, or the base point's own time where that is
longer) and no more energy (both modelled, with the plan's switch latency); otherwise the base plan goes on
unchanged. The result is then set against each part's plan alone (a part that cannot plan alone is
skipped), and the one whose target point uses the least modelled energy within the target wins. The plan's
``notes`` say what was left out and why, and its ``optimisers`` name only the parts whose work it holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.errors import EnergyValueError
from megatron_energy.optimiser import Optimiser, PlanningJob, ProfileRequest
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan
from megatron_energy.registry import UnknownModeError

TOLERANCE = 1e-9
"""Relative slack of a comparison of times or energies (one figure priced twice may differ by rounding)."""


@dataclass
class ComposedOptimiser:
    """Optimisers run in order, each refining the previous plan (see the module docstring)."""

    parts: Sequence[Optimiser]
    """The optimisers, first to last."""

    name = "all"

    def __post_init__(self) -> None:
        if not self.parts:
            raise UnknownModeError("--energy-mode all has no released optimiser to compose")

    @property
    def request(self) -> ProfileRequest:
        """The union of the parts' requests."""
        request = self.parts[0].request
        for part in self.parts[1:]:
            request = request.union(part.request)
        return request

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        """Refine part by part, keeping the refinements that do not lose; then the best of that and each part.

        See the module docstring.
        """
        plan, notes = base, []
        for part in self.parts:
            refined = part.plan(profile, job, plan)
            loss = None if plan is None else _loss(refined, plan)
            if loss is not None:
                notes.append(f"{part.name}'s refinement left out ({loss})")
                continue
            plan = refined
        assert plan is not None  # __post_init__ guarantees a part
        composed = plan
        for part in self.parts[1:] if base is None else ():
            try:
                alone = part.plan(profile, job, None)
            except EnergyValueError:  # e.g. no collective to schedule and no base plan: it cannot plan alone
                continue
            if _loss(alone, plan) is None and _energy_j(alone) < _energy_j(plan) * (1 - TOLERANCE):
                plan = alone
        if plan is not composed:
            notes.append(
                f"{plan.optimisers[-1]} alone is the plan: {_energy_j(plan):.1f} J against the composition's "
                f"{_energy_j(composed):.1f} J (modelled)"
            )
        return dataclasses.replace(plan, notes=(*plan.notes, *notes)) if notes else plan


def _energy_j(plan: Plan) -> float:
    """The target point's predicted energy per iteration (modelled)."""
    return plan.target_point.energy_j


def _loss(candidate: Plan, base: Plan) -> str | None:
    """Why ``candidate`` loses to ``base`` at the target (slower than allowed, or costlier); else None."""
    point, reference = candidate.target_point, base.target_point
    allowed_s = max(reference.deadline_s, reference.iteration_time_s)
    if point.iteration_time_s > allowed_s * (1 + TOLERANCE):
        return (
            f"it predicts {1e3 * point.iteration_time_s:.1f} ms where the target allows "
            f"{1e3 * allowed_s:.1f} ms (modelled, {1e3 * base.switch_latency_s:g} ms clock switches)"
        )
    if point.energy_j > reference.energy_j * (1 + TOLERANCE):
        return f"it predicts {point.energy_j:.1f} J against {reference.energy_j:.1f} J (modelled)"
    return None
