"""Phase 2 on rank 0: merged profile rows → ``Profile`` → the optimiser(s) → a ``Plan`` file, cached.

Rank 0 plans (or, on a cache hit, loads the cached plan file) and broadcasts a :class:`PlanRelease`: the
plan file's exact text and the stock-clock baseline measured while profiling. Every rank parses the same
text, so what runs is exactly what the file says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from megatron_energy.optimiser import Optimiser, PlanningJob
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.plan import Plan
from megatron_energy.runtime.cache import JobCache
from megatron_energy.runtime.profiling import ProfileRow, StepRecord


@dataclass(frozen=True)
class StockBaseline:
    """The job at stock clocks, as profiling measured it (modelled on simulated GPUs)."""

    iteration_s: float | None = None
    """Iteration time (the slowest rank's), ``None`` if not measured."""

    energy_by_rank: dict[int, float] = field(default_factory=dict)
    """Energy per iteration of each global rank's GPU."""

    def to_json(self) -> str:
        """The baseline as the cache stores it."""
        return json.dumps(
            {"stock_time_s": self.iteration_s, "stock_energy_by_rank": self.energy_by_rank}, indent=2
        )

    @classmethod
    def from_json(cls, text: str) -> StockBaseline:
        """Parse :meth:`to_json`'s text.

        Raises:
            ValueError: The text is not such a baseline.
        """
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the baseline is not a JSON object")
        time_s = data.get("stock_time_s")
        return cls(
            iteration_s=None if time_s is None else float(time_s),
            energy_by_rank={int(k): float(v) for k, v in data.get("stock_energy_by_rank", {}).items()},
        )


@dataclass(frozen=True)
class PlanRelease:
    """What rank 0 broadcasts after planning: the plan file's text and the measured stock baseline."""

    plan_text: str
    baseline: StockBaseline


def profile_from_rows(
    merged: Mapping[Work, Mapping[int, tuple[float, float]]],
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
    optimiser: Optimiser, profile: Profile, job: PlanningJob, cache: JobCache, baseline: StockBaseline
) -> PlanRelease:
    """Plan the job and write the cache; run on global rank 0 only.

    Args:
        optimiser: The optimiser(s) ``--energy-mode`` selected.
        profile: The job's profile (measured, merged over ranks; or modelled).
        job: The job as the optimiser sees it.
        cache: Where the profile, plan and baseline are written.
        baseline: The stock-clock baseline measured while profiling.

    Returns:
        The release to broadcast.
    """
    plan = optimiser.plan(profile, job)
    release = PlanRelease(plan.to_json_text(), baseline)
    cache.folder.mkdir(parents=True, exist_ok=True)
    profile.to_csv(cache.profile_path)
    cache.write("baseline.json", baseline.to_json())
    cache.write("plan.json", release.plan_text)
    cache.remember()
    return release


def load_release(cache: JobCache) -> PlanRelease:
    """The cached plan file's text and baseline (the plan is verified by every rank as it parses it).

    Raises:
        OSError: A cached file cannot be read.
        ValueError: The cached baseline is not one.
    """
    plan_text = cache.plan_path.read_text(encoding="utf-8")
    baseline_path = cache.folder / "baseline.json"
    baseline = StockBaseline.from_json(baseline_path.read_text(encoding="utf-8"))
    return PlanRelease(plan_text, baseline)


def baseline_from_profiling(
    gathered: Sequence[tuple[Sequence[ProfileRow], StepRecord | None]],
) -> StockBaseline:
    """The stock-clock baseline from every rank's profiling records (rank = position)."""
    stock = [(rank, record) for rank, (_, record) in enumerate(gathered) if record is not None]
    return StockBaseline(
        iteration_s=max((record.iteration_s for _, record in stock), default=None),
        energy_by_rank={rank: record.energy_j for rank, record in stock},
    )


def plan_summary(plan: Plan) -> str:
    """A few lines describing the plan, for the log (all figures modelled)."""
    target = plan.target_point
    stock_j = plan.baseline.energy_j
    return (
        f"[energy] plan for {plan.target} ({', '.join(plan.optimisers)}): iteration "
        f"{1e3 * target.iteration_time_s:.1f} ms vs {1e3 * plan.baseline.iteration_time_s:.1f} ms at stock "
        f"clocks; energy {target.energy_j:.1f} J vs {stock_j:.1f} J per pipeline iteration "
        f"({100 * (1 - target.energy_j / stock_j):.1f}% less), modelled from a {plan.provenance} profile on "
        f"{plan.gpu_name}; clock switches take {1e3 * plan.switch_latency_s:g} ms; {len(plan.frontier)} "
        f"frontier points, {100 * target.gap:.2f}% above the relaxed (instant-switch) bound"
    )
