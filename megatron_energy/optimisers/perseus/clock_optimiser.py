"""The Perseus-style optimiser: one SM clock per pipeline instruction, from the time–energy frontier.

It sweeps the frontier of the job's DAG (``FrontierSolver``), picks the point for the target, makes it and
up to ``PlanningJob.kept_points`` other points executable under the GPU's clock-switch latency
(``perseus.switch_latency``) and writes them as a :class:`~megatron_energy.plan.Plan`: a clock action at the
start of every instruction. The other points serve data-parallel replicas that follow a straggler's pace.
With the combined 1F1B schedule the DAG's nodes are its steps, fused forward-backward pairs among them, and
each gets its own clock (``pipeline.fused_profile`` supplies their options where the profile is modelled).
A ``smooth:`` target's point and filler come from ``perseus.smooth_point``; its rank energies include the
filler, and the plan carries the filler windows (``Plan.smoothing``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from megatron_energy.optimisers.interface import PlanningJob, ProfileRequest
from megatron_energy.optimisers.perseus.frontier import FrontierPoint
from megatron_energy.optimisers.perseus.planner_cache import PlannerCache
from megatron_energy.optimisers.perseus.smooth_point import smooth_point
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.pipeline.fused_profile import with_fused_steps
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import (
    Baseline,
    FrontierSample,
    Plan,
    PlanPoint,
    RankPlan,
    clock_actions,
)
from megatron_energy.plan_smoothing import PlanSmoothing


class PerseusOptimiser:
    """Clock per pipeline instruction (see the module docstring).

    Args:
        planners: Planners kept across calls for one job (one frontier sweep for several targets,
            ``perseus.planner_cache``); ``None``: each plan sweeps its own.
    """

    name = "perseus"
    request = ProfileRequest(clock_grid=True)

    def __init__(self, planners: PlannerCache | None = None):
        self.planners = planners

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        """Solve the frontier and return the executable plan for ``job.target``.

        Raises:
            ValueError: If ``base`` is given: this optimiser plans from scratch and comes first.
        """
        if base is not None:
            raise ValueError("the perseus optimiser plans from scratch; it must come first in a composition")
        planner = self.planner(profile, job)
        profile = planner.profile
        frontier = planner.frontier
        smooth = smooth_point(planner, job.target) if job.target.kind == "smooth" else None
        target = planner.point(job.target) if smooth is None else smooth.point
        candidates = _distinct_points([*frontier.points, planner.min_energy_point], target)
        points = _distinct_points(
            [planner.executable(point) for point in _spread(candidates, job.kept_points)], target
        )
        baseline = frontier.baseline
        smoothing = None if smooth is None else smooth.smoothing
        plan = job.new_plan(
            profile,
            optimisers=(self.name,),
            baseline=Baseline(
                baseline.iteration_time_s,
                baseline.total_energy_j,
                tuple(stage.total_energy_j for stage in baseline.stages),
            ),
            points=[
                plan_point(planner, point, f"time:{point.time_s:.6f}")
                if point is not target
                else plan_point(planner, point, str(job.target), smoothing)
                for point in points
            ],
            target_index=points.index(target),
            frontier=[
                FrontierSample(point.time_s, point.energy_j, point.lower_bound_j, _deadline(point))
                for point in frontier.points
            ],
            measured_tail=job.measured_tail,
        )
        return plan if smoothing is None else dataclasses.replace(plan, smoothing=smoothing)

    def planner(self, profile: Profile, job: PlanningJob) -> Planner:
        """The job's planner (its frontier sweep), kept in ``planners`` when given."""
        fused = with_fused_steps(profile, job.orders)

        def build() -> Planner:
            return Planner(
                job.dag(),
                fused,
                num_points=job.frontier_points,
                switch_latency_s=job.switch_latency_s,
                switch_evaluations=job.switch_evaluations,
            )

        return build() if self.planners is None else self.planners.planner(profile, job, build)


def plan_point(
    planner: Planner, point: FrontierPoint, label: str, smoothing: PlanSmoothing | None = None
) -> PlanPoint:
    """A frontier point as a plan point: a clock action at every instruction's start, in rank order.

    With ``smoothing``, each rank's predicted energy includes its filler.
    """
    dag = planner.dag
    return PlanPoint(
        label=label,
        iteration_time_s=point.time_s,
        deadline_s=_deadline(point),
        lower_bound_j=point.lower_bound_j,
        ranks=tuple(
            RankPlan(
                actions=clock_actions(point.clocks, dag.stage_steps(stage)),
                energy_j=point.stage_energy_j[stage]
                + (0.0 if smoothing is None else smoothing.stage_filler_j(stage)),
                busy_s=point.stage_busy_s[stage],
            )
            for stage in range(dag.num_stages)
        ),
    )


def _deadline(point: FrontierPoint) -> float:
    """The point's deadline; its own time when it was solved without one (the unconstrained optimum)."""
    return point.deadline_s if math.isfinite(point.deadline_s) else point.time_s


def _distinct_points(points: Sequence[FrontierPoint], target: FrontierPoint) -> list[FrontierPoint]:
    """The Pareto points (time up, energy down) among ``points``, with the target kept in any case."""
    kept: list[FrontierPoint] = []
    for point in sorted([*points, target], key=lambda p: (p.time_s, p.energy_j, p is not target)):
        if point is target and target in kept:
            continue
        if point is target or not kept or point.energy_j < kept[-1].energy_j:
            kept.append(point)
    return kept


def _spread(points: Sequence[FrontierPoint], count: int) -> list[FrontierPoint]:
    """At most ``count`` points evenly spread over ``points``: the first and the last, or the first alone."""
    if len(points) <= count:
        return list(points)
    step = (len(points) - 1) / max(count - 1, 1)
    return [points[round(i * step)] for i in range(count)]
