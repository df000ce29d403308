"""``--energy-mode all``: optimisers run in a fixed order, each refining the plan of the one before.

The first optimiser plans from scratch (``base=None``). Each later one receives the previous plan as
``base``: it keeps the base plan's points (deadlines, target choice, the clock actions it does not own)
and may add actions it owns (collective launch points and budgets, phase clocks) or replace those, but a
point it returns must not predict an iteration slower than the base point's deadline. The profile request
of a composition is the union of its parts' requests, so one profiling pass serves every part.

With today's released optimisers ``all`` is Perseus, then Kareus, then the phase clocks (``kernel``):
Perseus picks the clock of every instruction (its frontier points); Kareus keeps each point's clocks, shifts
those of the instructions a collective overlaps where that helps, adds the collective actions (launch point
and CTA budget per collective), and prices the point under the switch latency (``kareus.pricing``: its clocks
by the pipeline simulator, plus what its collective choices change under the overlap model); the phase
optimiser adds clocks inside instructions and in the iteration tail.

Composition never loses: a part's refinement is kept only if the plan's target point then predicts no
slower an iteration than the target allows (or than the base point's, where that is longer) and no smaller a
saving of energy, each relative to the plan's own stock iteration (an optimiser that prices with another
model prices stock with it too), with the plan's switch latency; a power budget allows no slower an
iteration than the first part's point (the fastest within the budget) and no higher an average power.
Otherwise the base plan goes on unchanged. The result is then set against each part's plan alone (a part
that cannot plan alone is skipped), and the one that saves the most within the target wins. The plan's
``notes`` say what was left out and why, and its ``optimisers`` name only the parts whose work it holds.

A ``smooth:`` target is the first part's alone: its filler is placed on the clock plan's power timeline
(``perseus.smooth_point``), which the later parts' pricing models lack, so they are left out with a note.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from megatron_energy.errors import EnergyValueError, UnknownModeError
from megatron_energy.optimisers.interface import Optimiser, PlanningJob, ProfileRequest
from megatron_energy.optimisers.saving_band import job_saving_band
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan
from megatron_energy.plan_outcome import banded_text, plan_saving
from megatron_energy.target import EnergyTarget

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
        return self.plan_with_parts(profile, job, base)[0]

    def plan_with_parts(
        self,
        profile: Profile,
        job: PlanningJob,
        base: Plan | None = None,
        planned_alone: Mapping[str, Plan] | None = None,
    ) -> tuple[Plan, dict[str, Plan]]:
        """:meth:`plan`, with the plans it weighed of each part alone (what ``simulate --compare`` prints).

        Args:
            profile: The profile.
            job: The job.
            base: A plan to refine; ``None`` plans from scratch.
            planned_alone: Plans of later parts alone for this profile and job, made already (by part name;
                ``megatron-energy estimate`` makes Kareus's beside the frontier sweep): taken as they are.

        Returns:
            The plan, and each part's plan alone by name: without ``base``, the first part's (the start of
            the refinement) and each later part's that can plan alone.
        """
        plan, first, notes = base, base, []
        alone: dict[str, Plan] = {}
        for part in self.parts:
            if plan is not None and job.target.kind == "smooth":
                notes.append(f"{part.name} left out: a smooth target's filler is placed on the clock plan")
                continue
            refined = part.plan(profile, job, plan)
            if plan is None:  # the first part, planning from scratch
                plan = first = alone[part.name] = refined
                continue
            assert first is not None
            loss = _loss(refined, plan, job.target, first)
            if loss is not None:
                notes.append(f"{part.name}'s refinement left out ({loss})")
                continue
            plan = refined
        assert plan is not None and first is not None  # __post_init__ guarantees a part
        composed = plan
        for part in self.parts[1:] if base is None and job.target.kind != "smooth" else ():
            try:
                known = (planned_alone or {}).get(part.name)
                alone[part.name] = known if known is not None else part.plan(profile, job, None)
            except EnergyValueError:  # e.g. no collective to schedule and no base plan: it cannot plan alone
                continue
            candidate = alone[part.name]
            cheaper = _ratios(candidate)[1] < _ratios(plan)[1] * (1 - TOLERANCE)
            if cheaper and _loss(candidate, plan, job.target, first) is None:
                plan = candidate
        if plan is not composed:
            alone_text = banded_text(plan_saving(plan), job_saving_band(plan, profile, job))
            composed_text = banded_text(plan_saving(composed), job_saving_band(composed, profile, job))
            notes.append(
                f"{plan.optimisers[-1]} alone is the plan: its energy against stock {alone_text}, the "
                f"composition's {composed_text}"
            )
        return (dataclasses.replace(plan, notes=(*plan.notes, *notes)) if notes else plan), alone


def _ratios(plan: Plan) -> tuple[float, float]:
    """The target point's iteration time and energy over the plan's own stock iteration's (one model's)."""
    point, stock = plan.target_point, plan.baseline
    return point.iteration_time_s / stock.iteration_time_s, point.energy_j / stock.energy_j


def _loss(candidate: Plan, base: Plan, target: EnergyTarget, first: Plan) -> str | None:
    """Why ``candidate`` loses to ``base`` at ``target``; else None.

    Each plan's prediction is set against its own stock iteration (an optimiser that prices with another
    model prices stock with it too): the candidate loses if its iteration is longer, relative to its stock,
    than the target allows (or than the base's, where that is longer), or if it saves less energy. A power
    budget allows no slower an iteration than ``first``'s (the first part's point: the fastest within the
    budget) and no higher an average power per GPU than the budget.
    """
    time_c, energy_c = _ratios(candidate)
    time_b, energy_b = _ratios(base)
    allowed = _ratios(first)[0] if target.kind == "power" else target.deadline_s(1.0)
    if time_c > max(allowed, time_b) * (1 + TOLERANCE):
        point_s, stock_s = candidate.target_point.iteration_time_s, candidate.baseline.iteration_time_s
        return (
            f"it predicts {1e3 * point_s:.1f} ms against {1e3 * stock_s:.1f} ms at stock clocks, where "
            f"{target} allows {100 * (max(allowed, time_b) - 1):+.2f} % "
            f"(modelled, {1e3 * candidate.switch_latency_s:g} ms clock switches)"
        )
    point = candidate.target_point
    average_w = point.energy_j / (len(point.ranks) * point.iteration_time_s)
    if target.kind == "power" and average_w > target.power_w * (1 + TOLERANCE):
        return f"it predicts {average_w:.1f} W per GPU on average, over {target} (modelled)"
    if energy_c > energy_b * (1 + TOLERANCE):
        return (
            f"it saves {100 * (1 - energy_c):.2f} % of stock energy against {100 * (1 - energy_b):.2f} % "
            "(modelled)"
        )
    return None
