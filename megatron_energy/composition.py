"""``--energy-mode all``: optimisers run in a fixed order, each refining the plan of the one before.

The first optimiser plans from scratch (``base=None``). Each later one receives the previous plan as
``base``: it keeps the base plan's points (deadlines, target choice, the clock actions it does not own)
and may add actions it owns (collective launch points and budgets, phase clocks) or replace those, but a
point it returns must not predict an iteration slower than the base point's deadline. The profile request
of a composition is the union of its parts' requests, so one profiling pass serves every part.

With today's released optimisers ``all`` is Perseus, then Kareus, then phase clocks: Perseus picks the
clock of every instruction (its frontier points); Kareus keeps each point's clocks, shifts those of the
instructions a collective overlaps where that helps, adds the collective actions (launch point and CTA budget
per collective) and prices the point under the switch latency (``kareus.pricing``), keeping the Perseus
point where it predicts no less; the phase optimiser adds clocks per phase of kernels.

**Composition never loses.** Refining can still cost: a later part prices with its own model, and the
switch latency can take back what an instant-switch model found. So ``all`` also plans each part alone and
keeps, for the target, the candidate whose target point predicts the least energy within what the target
allows (:func:`choose`): the composed plan, a prefix of the composition (Perseus alone, Perseus then Kareus)
or a later part alone. Every candidate's prediction is its plan file's: latency-aware and against the same
stock iteration (``kareus.pricing`` makes Kareus's so). The plan kept says which candidate it is and why
(``Plan.choice``, printed with the plan line).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.config import EnergyTarget
from megatron_energy.errors import EnergyValueError
from megatron_energy.optimiser import Optimiser, PlanningJob, ProfileRequest
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan
from megatron_energy.registry import UnknownModeError


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
        """Run every part on the previous part's plan, and each later part alone: :func:`choose` keeps one."""
        candidates = self.candidates(profile, job, base)
        return choose(candidates, job.target, candidates[1] if len(candidates) > 1 else candidates[0])

    def candidates(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> list[Plan]:
        """The composed plan, then its prefixes (the first part's plan first), then each later part alone.

        A part that cannot plan alone (Kareus without a collective workload, or with a power target) is no
        candidate alone.
        """
        prefixes: list[Plan] = []
        plan = base
        for part in self.parts:
            plan = part.plan(profile, job, plan)
            prefixes.append(plan)
        alone = []
        for part in self.parts[1:]:
            try:
                alone.append(part.plan(profile, job, base))
            except EnergyValueError:
                continue
        return [prefixes[-1], *prefixes[:-1], *alone]


def candidate_name(plan: Plan) -> str:
    """How a candidate is named in a plan's choice: its optimisers joined by ``+``, or ``stock clocks``."""
    return "+".join(plan.optimisers) or "stock clocks"


def allowed_time_s(plan: Plan, target: EnergyTarget, first: Plan) -> float:
    """The longest target-point iteration the target allows a candidate (modelled, switch latency included).

    The target's deadline on the stock iteration; for a power budget, the first part's target point (the
    fastest point of the clock frontier within the budget), as no later part may slow the job down.
    """
    if target.kind == "power":
        return first.target_point.iteration_time_s
    return target.deadline_s(plan.baseline.iteration_time_s)


def fits(plan: Plan, target: EnergyTarget, first: Plan) -> bool:
    """Whether the plan's target point is within :func:`allowed_time_s` (and a power budget)."""
    point = plan.target_point
    if point.iteration_time_s > allowed_time_s(plan, target, first) * (1 + 1e-9):
        return False
    if target.kind == "power" and target.power_w is not None:
        average_w = point.energy_j / (len(point.ranks) * point.iteration_time_s)
        return average_w <= target.power_w * (1 + 1e-9)
    return True


def choose(candidates: Sequence[Plan], target: EnergyTarget, first: Plan) -> Plan:
    """The candidate whose target point predicts the least energy within what the target allows.

    Args:
        candidates: The composed plan first (it wins a tie), then the others.
        target: The job's target.
        first: The first part's plan alone (a power budget's time reference).

    Returns:
        The chosen candidate, its ``choice`` saying which it is and each candidate's prediction; where no
        candidate fits the target, the fastest.
    """
    fitting = [plan for plan in candidates if fits(plan, target, first)]
    if fitting:
        best = min(fitting, key=lambda plan: plan.target_point.energy_j)
        why = "the least modelled energy within the target"
    else:
        best = min(candidates, key=lambda plan: plan.target_point.iteration_time_s)
        why = "no candidate fits the target; the fastest"
    limit_s = allowed_time_s(best, target, first)
    within = "no time limit" if math.isinf(limit_s) else f"deadline {1e3 * limit_s:.1f} ms"
    listed = "; ".join(_described(plan, fits(plan, target, first)) for plan in _unique(candidates))
    kept = "the composed plan" if best is candidates[0] else f"{candidate_name(best)}'s plan"
    choice = f"--energy-mode all kept {kept} ({why}, {within}; latency-aware, modelled): {listed}"
    return dataclasses.replace(best, choice=choice)


def _described(plan: Plan, fitting: bool) -> str:
    point = plan.target_point
    late = "" if fitting else " (does not fit)"
    return f"{candidate_name(plan)} {point.energy_j:.1f} J at {1e3 * point.iteration_time_s:.1f} ms{late}"


def _unique(candidates: Sequence[Plan]) -> list[Plan]:
    """Candidates by name, the first of each (a part that changed nothing repeats its base's name)."""
    seen: dict[str, Plan] = {}
    for plan in candidates:
        seen.setdefault(candidate_name(plan), plan)
    return list(seen.values())
