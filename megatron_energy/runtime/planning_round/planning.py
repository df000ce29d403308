"""Phase 2 on rank 0: the planning replica's profile rows → ``Profile`` → the optimiser(s) → a ``Plan`` file.

Rank 0 plans from the planning replica's rows (``runtime.profiling.replica_profile``; or, on a cache hit,
loads the cached plan file) and sends every rank a :class:`PlanRelease` down the job's groups
(``runtime.control_plane.group_chain.broadcast_from_root``): the plan file's exact text and the stock-clock
baseline measured while profiling. Every rank parses the same text, so what runs is exactly what the file
says.

The plan is anchored to what profiling measured at stock clocks: the profile's rows there are the measured
instruction times and energies, and the measured iteration tail (:func:`tail_from_profiling`: the time and
energy of an iteration outside the pipeline instructions, per stage) is part of the job the optimiser plans
(``PlanningJob.tail``), so the stock plan's predicted iteration time and energy are the measured ones.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from megatron_energy.energy_dir import REQUIRED_ARTEFACTS, JobArtefacts
from megatron_energy.events import OUTSIDE_PHASES
from megatron_energy.optimisers.interface import Optimiser, PlanningJob, ProfileRequest
from megatron_energy.optimisers.memory_clock import MemoryClockLever
from megatron_energy.optimisers.saving_band import with_saving_band
from megatron_energy.pipeline.dag_nodes import IterationTail
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.plan import Plan
from megatron_energy.plan_file import plan_text
from megatron_energy.plan_outcome import saving_text, why_nothing_found
from megatron_energy.plan_smoothing import filler_note
from megatron_energy.runtime.planning_round.cache import JobCache
from megatron_energy.runtime.profiling.collector import (
    ProfileRow,
    StepRecord,
    baseline_records,
    mean_record,
    synchronised_records,
)
from megatron_energy.runtime.profiling.job_stock import JobStock
from megatron_energy.runtime.profiling.measured_inputs import MeasuredInputs
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline

NOTHING_S = 1e-9
"""A measured tail no longer than this (and using no more than ``NOTHING_J``) is no tail: rounding."""
NOTHING_J = 1e-9


@dataclass(frozen=True)
class PlanRelease:
    """What rank 0 broadcasts after planning (or loading the cache): the plan that runs and its context."""

    plan_text: str
    """The plan file's text, byte for byte what is cached and what every rank parses."""

    baseline: StockBaseline
    """The stock-clock baseline measured while profiling."""

    profile_csv: str
    """The profile the plan was made from (CSV text)."""

    frontier_csv: str = ""
    """The plan's instant-switch frontier curve (CSV text, :func:`frontier_csv_text`); empty when the release
    was loaded from the cache, which already holds it."""

    measured_json: str = ""
    """What profiling measured besides the profile and the baseline (``runtime.profiling.measured_inputs``),
    so the cache can re-plan from it; empty when the release was loaded from the cache, which already holds
    it."""


@dataclass(frozen=True)
class Fallback:
    """Rank 0's decision that every rank runs at stock clocks, and why."""

    reason: str
    """One line for every rank's log."""

    profile_artefacts: dict[str, str] | None = None
    """Set when the target cannot be met from a sound profile (``errors.TargetUnreachableError``): the
    profile, the baseline and the measured inputs, for rank 0 to cache, so that the job with another target
    plans from them without profiling (``runtime.planning_round.replanning``); the reason is then rank 0's to
    say, once."""


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
    optimiser: Optimiser, profile: Profile, job: PlanningJob, baseline: StockBaseline
) -> PlanRelease:
    """Plan the job; run on global rank 0 only.

    Args:
        optimiser: The optimiser(s) ``--energy-mode`` selected; their plan then gets the memory clocks that
            pay (``optimisers.memory_clock``, unless ``job.memory_clock`` is off).
        profile: The job's profile (measured, merged over ranks; or modelled).
        job: The job as the optimiser sees it.
        baseline: The stock-clock baseline measured while profiling.

    Returns:
        The release to broadcast (and to cache with :func:`store_release`).
    """
    plan = with_saving_band(MemoryClockLever(optimiser).plan(profile, job), profile, job)
    measured = MeasuredInputs.of_job(job, optimiser.request)
    return PlanRelease(
        plan_text(plan), baseline, profile.to_csv_text(), frontier_csv_text(plan), measured.to_json()
    )


def profile_artefacts(
    profile: Profile, job: PlanningJob, baseline: StockBaseline, request: ProfileRequest
) -> dict[str, str]:
    """The cache artefacts of a profiled job without a plan: what re-planning it needs (``Replanner``)."""
    return JobArtefacts(
        profile_csv=profile.to_csv_text(),
        baseline_json=baseline.to_json(),
        measured_json=MeasuredInputs.of_job(job, request).to_json(),
    ).files()


def frontier_csv_text(plan: Plan) -> str:
    """The plan's instant-switch frontier curve as ``deadline_s,time_s,energy_j,lower_bound_j,gap_percent``.

    One row per sample, all modelled; the columns of ``megatron-energy plan``'s frontier.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["deadline_s", "time_s", "energy_j", "lower_bound_j", "gap_percent"])
    for sample in plan.frontier:
        gap = sample.energy_j / sample.lower_bound_j - 1.0 if sample.lower_bound_j > 0 else 0.0
        writer.writerow(
            [
                f"{sample.deadline_s:.9g}",
                f"{sample.time_s:.9g}",
                f"{sample.energy_j:.9g}",
                f"{sample.lower_bound_j:.9g}",
                f"{100 * gap:.6f}",
            ]
        )
    return out.getvalue()


def release_artefacts(release: PlanRelease) -> JobArtefacts:
    """The cache artefacts of a release.

    The plan file, the baseline, the profile, and (when the release has them) its frontier and the measured
    planning inputs.
    """
    return JobArtefacts(
        profile_csv=release.profile_csv,
        baseline_json=release.baseline.to_json(),
        plan_json=release.plan_text,
        frontier_csv=release.frontier_csv or None,
        measured_json=release.measured_json or None,
    )


def store_release(cache: JobCache, release: PlanRelease) -> None:
    """Cache the release's artefacts (:func:`release_artefacts`), atomic and verified.

    Raises:
        OSError: The cache cannot be written.
    """
    cache.store(release_artefacts(release).files())


def load_release(cache: JobCache) -> tuple[PlanRelease | Fallback | None, str]:
    """The cached release of this job, verified, and a line for the log saying what was found.

    A cached folder that fails verification is moved aside by ``JobCache.load`` (the line says where). A
    folder holding this job's profile whose plan is out of reach of its target gives the fallback every
    rank takes at once (``CacheLoad.unreachable``): profiling again would end the same way.

    Raises:
        ValueError: The cached baseline is not one (the plan is checked by every rank as it parses it).
    """
    load = cache.load(REQUIRED_ARTEFACTS)
    if load.unreachable is not None:
        reason = (
            f"{load.unreachable} (planned again from the profile cached in {load.folder}); run with another "
            "--energy-target to plan from that profile without profiling"
        )
        return Fallback(reason), load.message
    if not load.hit:
        return None, load.message
    artefacts = JobArtefacts.of_files(load.artefacts)
    if artefacts.plan_json is None:
        raise ValueError(f"the cached set of {load.folder} holds no plan")
    release = PlanRelease(
        artefacts.plan_json, StockBaseline.from_json(artefacts.baseline_json), artefacts.profile_csv
    )
    return release, load.message


def baseline_from_profiling(
    replica: Sequence[tuple[Sequence[ProfileRow], Sequence[StepRecord]]],
    ranks: Sequence[int],
    stock: JobStock,
    source: str = "measured",
) -> StockBaseline:
    """The stock-clock baseline: the job's baseline steps, and each planning-replica rank's mean.

    Only the steps timed as the run phase times its steps (lagged, no device sync;
    ``runtime.profiling.collector``) count, so every comparison with the planned windows is between steps
    measured the same way; the synchronous profile steps are left out. The job's figures (per step, the
    slowest rank's time and the energy of every GPU; the slowest rank's mean time) come from the reductions
    over every rank (``runtime.profiling.job_stock``); per rank of the planning replica (``replica`` by
    stage, ``ranks`` their global ranks), the mean energy over its baseline steps and its stage (from its
    profile rows). ``source`` says whether the figures are measured or modelled (simulated GPUs).
    """
    means = {
        rank: mean_record(steps)
        for rank, (_, records) in zip(ranks, replica, strict=True)
        if (steps := baseline_records(records))
    }
    return StockBaseline(
        iteration_s=stock.iteration_s,
        energy_by_rank={rank: record.energy_j for rank, record in means.items()},
        step_iteration_s=stock.step_iteration_s,
        step_energy_j=stock.step_energy_j,
        stage_by_rank={
            rank: rows[0].work.stage for rank, (rows, _) in zip(ranks, replica, strict=True) if rows
        },
        source=source,
    )


def tail_from_profiling(
    gathered: Sequence[tuple[Sequence[ProfileRow], Sequence[StepRecord]]],
) -> IterationTail | None:
    """The measured iteration tail: what the synchronous stock steps spent outside the pipeline span.

    Only the synchronous profile steps measured that part apart (rank = position).

    Its time is the slowest rank's mean (the ranks' spans end together, at the replica's pipeline end); each
    stage's energy is the mean over the ranks of that stage (peers of a stage are one GPU each, as in
    :func:`~megatron_energy.runtime.profiling.collector.merge_rows`) of their mean energy over it.

    Returns:
        The tail, or ``None`` when no stock step was measured, its energy is unknown (no energy counter), or
        nothing ran outside the pipeline span (simulated GPUs without work between two schedules).
    """
    by_stage: dict[int, list[float]] = defaultdict(list)
    time_s = 0.0
    for rows, records in gathered:
        steps = synchronised_records(records)
        if not rows or not steps:
            return None
        mean = mean_record(steps)
        time_s = max(time_s, mean.outside_s)
        by_stage[rows[0].work.stage].append(mean.outside_j)
    energies = [sum(values) / len(values) for _, values in sorted(by_stage.items())]
    if not energies or not all(map(math.isfinite, energies)) or not math.isfinite(time_s):
        return None
    if time_s <= NOTHING_S and all(energy <= NOTHING_J for energy in energies):
        return None
    return IterationTail.measured(time_s, energies)


def tail_phases_from_profiling(
    gathered: Sequence[tuple[Sequence[ProfileRow], Sequence[StepRecord]]],
) -> tuple[tuple[str, float], ...]:
    """The outside phases' measured durations at the stock clock, in the order they run (none if unseen).

    Each rank's mean over its stock synchronous steps that measured them; over ranks, the longest (the ranks
    of a replica run their tails side by side). The parameter all-gather runs nested at the end of the
    optimizer step, so the optimizer phase is its hook's span less the all-gather.
    """
    longest: dict[str, float] = {}
    for rows, records in gathered:
        stock = [r for r in synchronised_records(records) if r.outside_phases]  # records: the stock steps
        if not rows or not stock:
            continue
        sums: dict[str, float] = defaultdict(float)
        for record in stock:
            for name, seconds in record.outside_phases:
                sums[name] += seconds / len(stock)
        for name, seconds in sums.items():
            longest[name] = max(longest.get(name, 0.0), seconds)
    if "optimizer" in longest:
        longest["optimizer"] = max(0.0, longest["optimizer"] - longest.get("param-gather", 0.0))
    return tuple((name, longest[name]) for name in OUTSIDE_PHASES if longest.get(name, 0.0) > 0)


def plan_digest(plan_text: str) -> str:
    """A short SHA-256 of a plan file's text: the log names the exact bytes that run."""
    return hashlib.sha256(plan_text.encode()).hexdigest()[:16]


def plan_summary(plan: Plan, plan_text: str) -> str:
    """A few lines describing the plan parsed from ``plan_text``, for the log (all figures modelled)."""
    target = plan.target_point
    stock_j = plan.baseline.energy_j
    tail = plan.measured_tail
    outside = (
        ""
        if tail is None
        else f" (with the {1e3 * tail.time_s:.1f} ms and {sum(tail.stage_energy_j):.1f} J per iteration "
        "outside the pipeline instructions, as measured at stock clocks)"
    )
    bound = (
        f"{len(plan.frontier)} frontier points, {100 * target.gap:+.2f}% against the instruction-level "
        "relaxed (instant-switch) bound (below it only where phase clocks go inside instructions)"
        if plan.frontier
        else "no frontier swept (the plan's instruction clocks are stock)"
    )
    why = why_nothing_found(plan)
    saving = f"{saving_text(plan)} vs stock" if why is None else f"no saving: {why}"
    return (
        f"[energy] plan for {plan.target} ({', '.join(plan.optimisers)}): iteration "
        f"{1e3 * target.iteration_time_s:.1f} ms vs {1e3 * plan.baseline.iteration_time_s:.1f} ms at stock "
        f"clocks; energy {target.energy_j:.1f} J vs {stock_j:.1f} J per pipeline iteration "
        f"({saving}){outside}, modelled from a {plan.provenance} "
        "profile on "
        f"{plan.gpu_name}; clock switches take {1e3 * plan.switch_latency_s:g} ms; {bound}; "
        + "".join(f"{note}; " for note in plan.notes)
        + ("" if plan.smoothing is None else f"{filler_note(plan.smoothing)}; ")
        + f"plan sha256 {plan_digest(plan_text)}"
    )
