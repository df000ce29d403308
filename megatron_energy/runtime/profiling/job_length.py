"""Whether the job is long enough to profile and run a plan, said once at start.

A job whose ``--train-iters`` end before profiling does would otherwise exit with no plan and no word: the
session says so at its first step instead (rank 0, one line), with how many iterations profiling needs with
this configuration (the collector's steps as planned at start: the stock baseline's pilot, then each clock's
settling and profile steps; the baseline may grow while it is measured, so it is a lower bound), how many the
job has left, and what to do. The energy directory holds a profile only once profiling completes
(``runtime.planning_round.cache``); a run cut short keeps the clocks it finishes in a partial profile per rank
instead (``runtime.profiling.partial_profile``), which no later run reuses: the line says which clocks that
will be.
"""

from __future__ import annotations

from megatron_energy.energy_dir import partial_profile_name
from megatron_energy.runtime.profiling.collector import ProfileCollector

PLAN_STEPS = 1
"""Steps after profiling before a plan runs: at least the one that adopts it (more while it is computed)."""


def too_short_line(collector: ProfileCollector, iterations_left: int, train_iters: int) -> str | None:
    """The line for a job too short to profile and run a plan, or ``None`` for one long enough.

    Args:
        collector: The session's profile collector, before its first step.
        iterations_left: Training iterations from the session's first step to the end, that one included.
        train_iters: Megatron's ``--train-iters``.
    """
    needed = collector.steps_needed + PLAN_STEPS
    if iterations_left >= needed:
        return None
    clocks = len(collector.clocks_mhz)
    per_clock = (collector.steps_needed - collector.stock_iters) // clocks
    return (
        f"[energy] this job is too short to profile: with this configuration profiling and starting a plan "
        f"take at least {needed} iterations ({collector.stock_iters} stock-clock baseline steps, then "
        f"{per_clock} settling and profile steps at each of {clocks} clock(s), then {PLAN_STEPS} with the "
        f"plan), and the job has {iterations_left} left (--train-iters {train_iters}); it will train at "
        f"stock clocks with no plan, and {_kept(collector, iterations_left)}: give --train-iters "
        f"{train_iters + needed - iterations_left} or more (later runs of the same job reuse a complete "
        "profile), or profile less (--energy-profile-iters, --energy-freq-grid)"
    )


def _kept(collector: ProfileCollector, iterations_left: int) -> str:
    """What the job will keep of its profiling: the clocks whose steps it finishes, if any."""
    finished = collector.clocks_complete_after(iterations_left)
    if not finished:
        return "keep no profile (not even the stock clock's steps finish)"
    if len(finished) == len(collector.clocks_mhz):
        return "finish profiling too late to run a plan (its profile is kept only if planning ends first)"
    return (
        f"keep the rows of the clocks it finishes (at most {len(finished)} of {len(collector.clocks_mhz)}: "
        f"{', '.join(str(clock) for clock in finished)} MHz, the stock clock first) in a partial profile "
        f"per rank, {partial_profile_name('<r>')} under --energy-dir, which no later run reuses"
    )
