"""The expert all-to-all's part of each mode's iteration (``simulate --compare`` on an MoE job; *modelled*).

Per mode, on the pipeline rank whose all-to-alls take longest: every ``ep.all_to_all`` launch of the iteration
(dispatch and combine, forward and backward, every MoE layer and microbatch:
``pipeline.collectives``) at the CTA budget the mode's plan gives the class (NCCL's default where it gives
none), priced by Kareus's contention model (``sim.contention``, ``kareus.choices.comm_load``), against the
mode's predicted iteration time. An all-to-all the schedule overlaps (``Collective.overlapped``) counts 0:
it is off the critical path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.optimisers.kareus.choices import comm_load
from megatron_energy.pipeline.collective_names import CollectiveName
from megatron_energy.pipeline.collectives import Collective
from megatron_energy.plan import CollectiveAction, PlanPoint

ALL_TO_ALL_CLASS = "ep.all_to_all"
"""The class whose share is reported."""


@dataclass(frozen=True)
class AllToAllShare:
    """The expert all-to-all's exposed time in one iteration (modelled)."""

    time_s: float
    """Exposed all-to-all time per iteration on the busiest pipeline rank."""
    iteration_time_s: float
    """The mode's predicted iteration time."""

    @property
    def share(self) -> float:
        """Its part of the iteration (0..1)."""
        return self.time_s / self.iteration_time_s if self.iteration_time_s > 0 else 0.0

    def text(self) -> str:
        """``0.2437 s (8.1 %)``."""
        return f"{self.time_s:.4f} s ({100 * self.share:.1f} %)"


def all_to_all_share(
    collectives: Sequence[Collective], point: PlanPoint | None, iteration_time_s: float, spec: GpuSpec
) -> AllToAllShare | None:
    """The all-to-all's share of an iteration at ``point``'s budgets (module docstring).

    Args:
        collectives: Every collective of the job (``pipeline.collectives.build_collectives``).
        point: The mode's plan point (its collective actions give the budgets); ``None``: NCCL's defaults.
        iteration_time_s: The mode's predicted iteration time.
        spec: The GPU spec (per-CTA bandwidth, latency).

    Returns:
        ``None`` when the job has no expert all-to-all (a dense model, or expert parallelism 1).
    """
    exchanges = [c for c in collectives if c.cls.key == ALL_TO_ALL_CLASS]
    if not exchanges:
        return None
    budgets: dict[tuple[int, CollectiveName], int | None] = {}
    if point is not None:
        for stage, rank in enumerate(point.ranks):
            for action in rank.actions:
                if isinstance(action, CollectiveAction):
                    budgets[(stage, action.collective)] = action.max_ctas
    time_s = max(
        0.0
        if c.overlapped
        else c.launches_per_iteration
        * comm_load(c, budgets.get((c.stage, c.name)), spec).duration_s(c.traffic_bytes)
        for c in exchanges
    )
    return AllToAllShare(time_s, iteration_time_s)
