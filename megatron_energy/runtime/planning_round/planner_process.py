"""The planner's task for a process of its own (``runtime.child_process``), so planning never stalls training.

Rank 0 starts it at the end of profiling (``EnergySession._plan``). Its input is :class:`PlannerInput`: the
profile, the ``PlanningJob``, the stock baseline and what builds the optimiser: ``--energy-mode`` and this
process's registrations, resolved through ``megatron_energy.optimisers.registry`` as ``runtime.assembly``
resolved the session's, so an optimiser a plugin declares as an entry point resolves in the child as it did
here. The child plans (``planning.plan_on_root``) and leaves the ``PlanRelease``, or a ``Fallback`` saying
why the optimiser failed; a child that left neither is a ``Fallback`` too (``ChildProcess``).

Only the standard library is imported at the top of this module: the child imports it before it renices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron_energy.optimisers.interface import PlanningJob
    from megatron_energy.optimisers.registry import Factory
    from megatron_energy.pipeline.profile import Profile
    from megatron_energy.runtime.planning_round.planning import Fallback, PlanRelease
    from megatron_energy.runtime.profiling.stock_baseline import StockBaseline


@dataclass(frozen=True)
class PlannerInput:
    """What the planner process plans from (pickled into its folder); a ``ChildTask``."""

    mode: str
    """``--energy-mode``, resolved in the child through ``megatron_energy.optimisers.registry``."""

    registered: dict[str, Factory]
    """This process's registered optimisers (``registry.registered``), registered again in the child."""

    profile: Profile
    """The job's profile, merged over the ranks."""

    job: PlanningJob
    """The job as the optimiser sees it."""

    baseline: StockBaseline
    """The stock-clock baseline measured while profiling."""

    @property
    def process_name(self) -> str:
        """``planner``: what a failure's reason calls the process."""
        return "planner"

    def run(self) -> PlanRelease | Fallback:
        """Build the optimiser from ``mode`` and plan (in the child).

        A target no plan meets is a fallback that carries the profile's artefacts, for rank 0 to cache.
        """
        from megatron_energy.errors import TargetUnreachableError
        from megatron_energy.optimisers import registry
        from megatron_energy.runtime.planning_round.planning import Fallback, plan_on_root, profile_artefacts

        for name, factory in self.registered.items():
            registry.register(name, factory)
        optimiser = registry.resolve(self.mode)
        try:
            return plan_on_root(optimiser, self.profile, self.job, self.baseline)
        except TargetUnreachableError as problem:
            artefacts = profile_artefacts(self.profile, self.job, self.baseline, optimiser.request)
            return Fallback(f"the target cannot be met: {problem}", artefacts)

    def failed(self, reason: str) -> Fallback:
        """Every rank falls back to stock clocks, saying ``planning failed:`` and why."""
        from megatron_energy.runtime.planning_round.planning import Fallback

        return Fallback(f"planning failed: {reason}")

    def accepts(self, outcome: object) -> bool:
        """Whether the child left a release or a fallback."""
        from megatron_energy.runtime.planning_round.planning import Fallback, PlanRelease

        return isinstance(outcome, PlanRelease | Fallback)
