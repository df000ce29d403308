"""Phase 2 on rank 0: merged profile rows → ``Profile`` → pipeline DAG → frontier → what every rank runs.

The result is a ``PlanBundle``: a handful of frontier points with each rank's clock table, the index of the
point chosen for ``--energy-target``, and the stock-clock baseline measured during profiling. It is small and
picklable, so rank 0 broadcasts it over the job's own process group; the target plan is also written as a
``Plan`` file, and the profile, frontier and baseline go to the job's cache folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from megatron_energy.config import EnergyConfig
from megatron_energy.megatron.schedule import pipeline_orders
from megatron_energy.perseus.dag import PipelineDag
from megatron_energy.perseus.frontier import Frontier, FrontierPoint
from megatron_energy.perseus.planner import Planner
from megatron_energy.perseus.profile import ClockOption, Profile
from megatron_energy.runtime.cache import JobCache, write_atomically
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.profiling import ProfileRow, StepRecord

FRONTIER_POINTS = 40
"""Deadlines in the session's frontier sweep."""

KEPT_POINTS = 8
"""Frontier points made executable under switch latency and kept for the straggler response."""

ClockTable = dict[tuple[str, int, int], int]
"""(kind, microbatch, chunk) -> SM clock of one stage."""


@dataclass(frozen=True)
class RankSchedule:
    """What one stage runs at one frontier point."""

    clocks: ClockTable
    """Clock per instruction of the stage."""

    predicted_time_s: float
    """The point's iteration time (modelled from the profile)."""

    predicted_energy_j: float
    """The point's energy of this stage's GPU per iteration (modelled from the profile)."""

    def clock(self, kind: str, microbatch: int, chunk: int) -> int:
        """The clock for one instruction."""
        return self.clocks[(kind, microbatch, chunk)]


@dataclass(frozen=True)
class PlanBundle:
    """The frontier as every rank needs it, and the choice for the target."""

    times_s: tuple[float, ...]
    """Iteration time of each kept frontier point, ascending (modelled)."""

    stage_energies_j: tuple[tuple[float, ...], ...]
    """Per point, the energy of each stage's GPU per iteration (modelled)."""

    stage_clocks: tuple[tuple[ClockTable, ...], ...]
    """Per point, per stage, the clock table."""

    target_index: int
    """The point chosen for ``--energy-target``."""

    predicted_stock_time_s: float
    """Modelled iteration time with every instruction at its fastest clock."""

    stock_time_s: float | None
    """Iteration time at stock clocks as profiling measured it (``None`` if unknown)."""

    stock_energy_by_rank: dict[int, float] = field(default_factory=dict)
    """Energy per iteration of each global rank's GPU at stock clocks, as profiling measured it."""

    summary: str = ""
    """A few lines describing the plan, for the log."""

    @property
    def nominal_time_s(self) -> float:
        """The target point's iteration time."""
        return self.times_s[self.target_index]

    def rank_schedule(self, stage: int, index: int) -> RankSchedule:
        """The clock table and predictions of one stage at one point."""
        return RankSchedule(
            clocks=self.stage_clocks[index][stage],
            predicted_time_s=self.times_s[index],
            predicted_energy_j=self.stage_energies_j[index][stage],
        )

    def index_for_time(self, time_s: float) -> int:
        """The least-energy point no slower than ``time_s``; past the minimum-energy point, that point.

        A pace faster than the target's keeps the target point.
        """
        if time_s <= self.nominal_time_s:
            return self.target_index
        feasible = [i for i, t in enumerate(self.times_s) if t <= time_s * (1 + 1e-9)]
        return min(feasible, key=lambda i: (sum(self.stage_energies_j[i]), self.times_s[i]))

    def allowed_time_s(self, predicted_s: float) -> float:
        """The measured iteration time a point predicted at ``predicted_s`` may take.

        The measured stock time scaled by the point's predicted slowdown over stock; without a measured
        stock time, the prediction itself.
        """
        if self.stock_time_s is None:
            return predicted_s
        return self.stock_time_s * predicted_s / self.predicted_stock_time_s

    def stock_energy_j(self, global_rank: int) -> float | None:
        """This rank's measured energy per iteration at stock clocks, if profiling measured it."""
        return self.stock_energy_by_rank.get(global_rank)


def profile_from_rows(
    merged: Mapping[tuple[int, str, int], Mapping[int, tuple[float, float]]],
    gpu_name: str,
    source: str,
    blocked_power_w: float,
    idle_power_w: float,
) -> Profile:
    """Build a ``Profile`` from ``merge_rows`` output."""
    options = {
        key: [ClockOption(clock, time_s, energy_j) for clock, (time_s, energy_j) in by_clock.items()]
        for key, by_clock in merged.items()
    }
    return Profile(
        options, gpu_name=gpu_name, source=source, blocked_power_w=blocked_power_w, idle_power_w=idle_power_w
    )


def plan_on_root(
    profile: Profile,
    context: JobContext,
    config: EnergyConfig,
    cache: JobCache,
    baseline: Mapping[str, Any],
    switch_latency_s: float = 0.0,
) -> PlanBundle:
    """Solve the frontier for the job, pick the target point, write the cache; run on global rank 0 only.

    The target point and up to ``KEPT_POINTS`` others are made executable under the GPU's clock-switch
    latency (``perseus.switching``): fewer, earlier switches, within each point's deadline.

    Args:
        profile: The job's profile (measured, merged over ranks; or modelled on simulated GPUs).
        context: Rank 0's job context (pipeline size, microbatches, chunks).
        config: The ``--energy-*`` configuration (target).
        cache: Where the profile, plan, frontier and baseline are written.
        baseline: ``{"stock_time_s": ..., "stock_energy_by_rank": {rank: J}}`` measured during profiling.
        switch_latency_s: The GPU's clock-switch latency (its spec's).

    Returns:
        The bundle to broadcast.
    """
    orders = pipeline_orders(context.pipeline_size, context.num_microbatches, context.num_chunks)
    dag = PipelineDag.build(orders, num_chunks=context.num_chunks)
    planner = Planner(
        dag,
        profile,
        fingerprint=cache.fingerprint,
        num_points=FRONTIER_POINTS,
        switch_latency_s=switch_latency_s,
    )
    frontier = planner.frontier
    target = planner.point(config.target)
    candidates = _distinct_points([*frontier.points, planner.min_energy_point], target)
    points = _distinct_points([planner.executable(p) for p in _spread(candidates, KEPT_POINTS)], target)
    bundle = PlanBundle(
        times_s=tuple(point.time_s for point in points),
        stage_energies_j=tuple(point.stage_energy_j for point in points),
        stage_clocks=tuple(_stage_tables(point, context.pipeline_size) for point in points),
        target_index=points.index(target),
        predicted_stock_time_s=frontier.min_time_s,
        stock_time_s=baseline.get("stock_time_s"),
        stock_energy_by_rank={int(k): float(v) for k, v in baseline.get("stock_energy_by_rank", {}).items()},
        summary=_summary(frontier, target, profile, config, switch_latency_s),
    )
    cache.folder.mkdir(parents=True, exist_ok=True)
    profile.to_csv(cache.profile_path)
    frontier.to_csv(cache.frontier_path)
    write_atomically(cache.folder / "baseline.json", json.dumps(dict(baseline), indent=2, default=str))
    planner.to_plan(target, str(config.target)).save(cache.plan_path)
    cache.remember()
    return bundle


def baseline_from_profiling(
    gathered: Sequence[tuple[Sequence[ProfileRow], StepRecord | None]],
) -> dict[str, Any]:
    """The stock-clock baseline from every rank's profiling records (rank = position)."""
    stock = [(rank, record) for rank, (_, record) in enumerate(gathered) if record is not None]
    return {
        "stock_time_s": max((record.iteration_s for _, record in stock), default=None),
        "stock_energy_by_rank": {rank: record.energy_j for rank, record in stock},
    }


def load_baseline(cache: JobCache) -> dict[str, Any]:
    """The baseline saved with a cached profile (empty if absent or unreadable)."""
    try:
        return json.loads((cache.folder / "baseline.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


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
    """At most ``count`` points evenly spread over ``points``, the first and the last included."""
    if len(points) <= count:
        return list(points)
    return [points[round(i * (len(points) - 1) / (count - 1))] for i in range(count)]


def _stage_tables(point: FrontierPoint, num_stages: int) -> tuple[ClockTable, ...]:
    tables: list[ClockTable] = [{} for _ in range(num_stages)]
    for (kind, stage, chunk, microbatch), clock in point.clocks.items():
        tables[stage][(kind, microbatch, chunk)] = clock
    return tuple(tables)


def _summary(
    frontier: Frontier, target: FrontierPoint, profile: Profile, config: EnergyConfig, latency_s: float
) -> str:
    stock_j = frontier.baseline.total_energy_j
    return (
        f"[energy] plan for {config.target}: iteration {1e3 * target.time_s:.1f} ms vs "
        f"{1e3 * frontier.min_time_s:.1f} ms at stock clocks; energy {target.energy_j:.1f} J vs "
        f"{stock_j:.1f} J per pipeline iteration ({100 * (1 - target.energy_j / stock_j):.1f}% less), "
        f"modelled from a {profile.source} profile on {profile.gpu_name}; "
        f"clock switches take {1e3 * latency_s:g} ms; {len(frontier.points)} frontier points, "
        f"{100 * target.gap:.2f}% above the relaxed (instant-switch) bound"
    )
