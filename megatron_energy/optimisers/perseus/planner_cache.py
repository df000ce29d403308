"""Perseus's planners of one job kept across targets: the frontier sweep does not depend on the target.

A :class:`~megatron_energy.optimisers.perseus.target_point.Planner` sweeps the job's frontier once
(``Planner.frontier``) and picks each target's point from it; planning the same job for several targets
(``megatron-energy estimate``) with one :class:`PlannerCache` sweeps once. A planner is kept per job
fingerprint, frontier size, switch latency, post-pass budget and profile, so a plan made through the cache is
the plan made without it.
"""

from __future__ import annotations

from collections.abc import Callable

from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.pipeline.profile import Profile

PlannerKey = tuple[str, int, float, int, int]
"""Job fingerprint, frontier points, switch latency, the post-pass's budget, and the profile's identity."""


class PlannerCache:
    """Planners by job and profile (module docstring)."""

    def __init__(self) -> None:
        self._planners: dict[PlannerKey, tuple[Profile, Planner]] = {}

    def planner(self, profile: Profile, job: PlanningJob, build: Callable[[], Planner]) -> Planner:
        """The planner of ``job`` on ``profile``: the kept one, or ``build()``'s, kept.

        Args:
            profile: The profile the caller plans from (kept with the planner, so its identity stays its own).
            job: The job; its target plays no part.
            build: Makes the planner when none is kept.
        """
        key = (
            job.fingerprint, job.frontier_points, job.switch_latency_s, job.switch_evaluations, id(profile)
        )  # fmt: skip
        kept = self._planners.get(key)
        if kept is None:
            kept = self._planners[key] = (profile, build())
        return kept[1]
