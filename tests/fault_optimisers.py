"""The optimisers the fault-injection worlds register: a planner that raises, and a plan rank 1 cannot run.

They live apart from ``test_fault_injection`` because the planner child registers every registered factory
again, so it imports the module each one comes from: this one imports only the standard library (the
package's modules are imported when a factory runs), not torch or the Megatron harness.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


class RaisingOptimiser:
    """An optimiser whose planning fails (on rank 0, the only rank that plans)."""

    def __init__(self) -> None:
        from megatron_energy.optimisers.interface import ProfileRequest

        self.request = ProfileRequest()

    def plan(self, profile: Any, job: Any, base: Any = None) -> Any:
        """Fail as a solver bug would."""
        raise RuntimeError("injected planner failure")


class RankOneCannotRunOptimiser:
    """Perseus's plan, with rank 1's actions moved to a microbatch rank 1 never runs."""

    def __init__(self) -> None:
        from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser

        self.inner = PerseusOptimiser()
        self.request = self.inner.request

    def plan(self, profile: Any, job: Any, base: Any = None) -> Any:
        """Plan with Perseus, then break rank 1's part."""
        plan = self.inner.plan(profile, job, base)
        points = []
        for point in plan.points:
            rank1 = point.ranks[1]
            moved = tuple(
                dataclasses.replace(
                    action,
                    at=action.at._replace(instruction=action.at.instruction._replace(microbatch=999)),
                )
                for action in rank1.actions
            )
            ranks = (point.ranks[0], dataclasses.replace(rank1, actions=moved), *point.ranks[2:])
            points.append(dataclasses.replace(point, ranks=ranks))
        return dataclasses.replace(plan, points=tuple(points))


TEST_OPTIMISERS: dict[str, Callable[[], Any]] = {
    "fault-raises": RaisingOptimiser,
    "fault-rank1-plan": RankOneCannotRunOptimiser,
}
