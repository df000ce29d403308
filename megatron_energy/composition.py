"""``--energy-mode all``: optimisers run in a fixed order, each refining the plan of the one before.

The first optimiser plans from scratch (``base=None``). Each later one receives the previous plan as
``base``: it keeps the base plan's points (deadlines, target choice, the clock actions it does not own)
and may add actions it owns (collective launch points and budgets, phase clocks) or replace those, but a
point it returns must not predict an iteration slower than the base point's deadline. The profile request
of a composition is the union of its parts' requests, so one profiling pass serves every part.

With today's released optimisers ``all`` is Perseus then Kareus: Perseus picks the clock of every
instruction (its frontier points); Kareus keeps each point's clocks, shifts those of the instructions a
collective overlaps where that helps, adds the collective actions (launch point and CTA budget per
collective), and prices the point with the overlap model (``sim.overlap``), never slower than the point's
deadline as that model prices the Perseus point itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
        """Run every part on the previous part's plan; return the last plan."""
        plan = base
        for part in self.parts:
            plan = part.plan(profile, job, plan)
        assert plan is not None  # __post_init__ guarantees a part
        return plan
