"""A job too short to profile says so at start: how many iterations profiling needs, and what to do."""

from __future__ import annotations

from megatron_energy.runtime.profiling.baseline_length import pilot_steps
from megatron_energy.runtime.profiling.collector import ProfileCollector
from megatron_energy.runtime.profiling.job_length import too_short_line


def _collector(clocks: tuple[int, ...], profile_iters: int) -> ProfileCollector:
    return ProfileCollector(
        clocks_mhz=clocks,
        steps_per_clock=profile_iters,
        blocked_power_w=100.0,
        idle_power_w=60.0,
        stock_iters=pilot_steps(profile_iters),
    )


def test_the_line_names_what_profiling_needs_and_what_to_give() -> None:
    collector = _collector(
        (1980, 1500), 1
    )  # baseline pilot 4, then (settling + 1) x 2 clocks = 8, + 1 planned
    line = too_short_line(collector, iterations_left=5, train_iters=5)
    assert line is not None and "\\n" not in line
    assert (
        "take at least 9 iterations (4 stock-clock baseline steps, then 2 settling and profile steps at each"
        in line
    )
    assert "the job has 5 left (--train-iters 5)" in line and "keep no profile" in line
    assert "give --train-iters 9 or more" in line
    resumed = too_short_line(collector, iterations_left=3, train_iters=100)  # 97 done before this process
    assert resumed is not None and "give --train-iters 106 or more" in resumed


def test_a_job_long_enough_gets_no_line() -> None:
    collector = _collector((1980, 1500), 1)
    assert too_short_line(collector, iterations_left=9, train_iters=9) is None
    assert too_short_line(collector, iterations_left=8, train_iters=8) is not None


def test_a_job_that_finishes_some_clocks_says_which_it_keeps_in_a_partial_profile() -> None:
    collector = _collector((1980, 1500, 1005), 1)  # stock: settling + 4 baseline + 1 profile; then 2 a clock
    stock_only = too_short_line(collector, iterations_left=7, train_iters=7)
    assert stock_only is not None and "keep no profile" not in stock_only
    assert (
        "keep the rows of the clocks it finishes (at most 1 of 3: 1980 MHz, the stock clock first)"
        in stock_only
    )
    assert "profile.partial.rank<r>.csv under --energy-dir, which no later run reuses" in stock_only
    two = too_short_line(collector, iterations_left=8, train_iters=8)
    assert two is not None and "(at most 2 of 3: 1980, 1500 MHz, the stock clock first)" in two
    late = too_short_line(collector, iterations_left=10, train_iters=10)  # profiling ends, no step for a plan
    assert late is not None and "finish profiling too late to run a plan" in late
