import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from megatron_energy.runtime.energy_log.log_window import compare_to_stock
from megatron_energy.stats import (
    RelativeChange,
    baseline_drift,
    baseline_steps,
    block_means,
    iterations_per_sample,
    mean_interval,
    paired_median_change,
    paired_relative_change,
    relative_change,
)


def noisy_energies(rng: np.random.Generator, mean_j: float, n: int, cv: float = 0.05) -> np.ndarray:
    """Per-iteration energies with Gaussian noise of ``cv``, like the 100 ms counter gives."""
    return rng.normal(mean_j, cv * mean_j, n)


def test_mean_interval_matches_student_t():
    interval = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert interval.mean == pytest.approx(2.5)
    # t(0.975, 3) = 3.1824; s = 1.2910; halfwidth = 3.1824 * 1.2910 / 2
    assert interval.halfwidth == pytest.approx(3.1824 * 1.29099 / 2, rel=1e-3)
    assert interval.low < 2.5 < interval.high


def test_mean_interval_of_one_sample_is_unbounded():
    interval = mean_interval([5.0])
    assert interval.mean == 5.0 and math.isinf(interval.halfwidth)


def test_same_distribution_reads_within_noise():
    rng = np.random.default_rng(1)
    change = relative_change(noisy_energies(rng, 1120.0, 20), noisy_energies(rng, 1120.0, 20))
    assert not change.excludes_zero
    assert change.format().startswith("within noise (±")
    assert change.format().endswith(" %)")


def test_ten_percent_saving_is_resolved_and_contains_truth():
    rng = np.random.default_rng(2)
    change = relative_change(noisy_energies(rng, 1120.0, 20), noisy_energies(rng, 1008.0, 20))
    assert change.excludes_zero
    assert change.low <= -0.10 <= change.high
    text = change.format()
    assert text.startswith("-") and "(measured, 95 % CI, n=20 vs 20)" in text


def test_interval_covers_true_change_in_at_least_90_percent_of_seeds():
    covered = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        change = relative_change(noisy_energies(rng, 1000.0, 15), noisy_energies(rng, 900.0, 25, cv=0.08))
        covered += change.low <= -0.10 <= change.high
    assert covered >= 180


def test_zero_spread_gives_zero_width_and_missing_spread_gives_no_resolution():
    exact = relative_change([100.0, 100.0], [90.0, 90.0])
    assert exact.halfwidth == 0.0 and exact.excludes_zero
    assert exact.format() == "-10.00 % ± 0.00 % (measured, 95 % CI, n=2 vs 2)"
    assert exact.change == pytest.approx(-0.1)
    single = relative_change([100.0], [50.0, 51.0])
    assert math.isinf(single.halfwidth) and not single.excludes_zero
    assert single.format() == "too few samples yet (n=1 vs 2)"
    two = relative_change([1000.0, 1003.0, 998.0, 1001.0], [960.0, 961.0])  # tight, but two samples
    assert two.low < two.high < 0 and not two.excludes_zero
    assert two.format() == "too few samples yet (n=4 vs 2)"
    three = relative_change([1000.0, 1003.0, 998.0, 1001.0], [960.0, 961.0, 959.5])
    assert three.excludes_zero and three.format().startswith("-4.0 % ± ")


def test_scalars_carry_interval_and_resolution():
    change = relative_change([100.0, 101.0, 99.0], [80.0, 81.0, 79.0], source="modelled")
    scalars = change.scalars("energy/saving_vs_stock")
    assert scalars["energy/saving_vs_stock_low"] < scalars["energy/saving_vs_stock"]
    assert scalars["energy/saving_vs_stock_resolved"] == 1.0
    assert "(modelled, 95 % CI, n=3 vs 3)" in change.format()


def test_paired_change_cancels_drift_shared_by_a_pair():
    rng = np.random.default_rng(3)
    drift = rng.normal(1600.0, 80.0, 6)  # each pair of runs sits at its own level (±5 %)
    off = drift * rng.normal(1.0, 0.001, 6)
    on = drift * 1.01 * rng.normal(1.0, 0.001, 6)
    paired = paired_relative_change(off, on)
    assert paired.excludes_zero and paired.low <= 0.01 <= paired.high
    assert paired.halfwidth < 0.005
    assert not relative_change(off, on).excludes_zero  # unpaired, the drift hides the 1 %


def test_paired_change_rejects_unequal_lengths():
    with pytest.raises(ValueError, match="2 baselines vs 3"):
        paired_relative_change([1.0, 2.0], [1.0, 2.0, 3.0])


@pytest.mark.parametrize("bad", [[], [1.0, math.nan]])
def test_bad_samples_are_rejected(bad):
    with pytest.raises(ValueError):
        mean_interval(bad)


def test_bad_confidence_is_rejected():
    with pytest.raises(ValueError, match="confidence"):
        relative_change([1.0, 2.0], [1.0, 2.0], confidence=1.5)


def test_baseline_steps_spans_two_counter_periods_for_short_iterations():
    # 30 ms iterations, no noise: a sample is ceil(0.2 / 0.03) = 7 iterations, at least 3 samples.
    assert baseline_steps(0.03, target_halfwidth=0.01, observed_cv=0.0) == 21


def test_baseline_steps_grows_with_noise_and_resolves_the_target():
    quiet = baseline_steps(1.6, target_halfwidth=0.01, observed_cv=0.01)
    noisy = baseline_steps(1.6, target_halfwidth=0.01, observed_cv=0.05)
    assert quiet < noisy
    # A baseline and a treatment of that many iterations do give a half-width at or below the target.
    rng = np.random.default_rng(4)
    widths = [
        relative_change(noisy_energies(rng, 1000.0, noisy), noisy_energies(rng, 1000.0, noisy)).halfwidth
        for _ in range(50)
    ]
    assert np.median(widths) <= 0.0105


def test_baseline_steps_rejects_nonsense():
    with pytest.raises(ValueError):
        baseline_steps(0.0, target_halfwidth=0.01, observed_cv=0.05)
    with pytest.raises(ValueError):
        baseline_steps(1.0, target_halfwidth=0.0, observed_cv=0.05)


def test_identical_figures_up_to_rounding_are_not_a_change():
    same = relative_change([0.1 + 1e-17, 0.1, 0.1], [0.1, 0.1 - 1e-17, 0.1])
    assert not same.excludes_zero and same.format() == "no change"  # nothing varies: no noise band to quote


def test_exact_energies_need_no_counter_span():
    # simulated GPUs' modelled energies are exact: every iteration is a sample, at least 3 of them
    assert iterations_per_sample(0.03, counter_period_s=0.0) == 1
    assert baseline_steps(0.03, target_halfwidth=0.01, observed_cv=0.0, counter_period_s=0.0) == 3
    with pytest.raises(ValueError):
        iterations_per_sample(0.1, counter_period_s=-0.1)


def test_samples_span_two_counter_periods():
    assert iterations_per_sample(0.125, 0.1) == 2
    assert iterations_per_sample(0.2, 0.1) == 1
    assert iterations_per_sample(1.1, 0.1) == 1


def test_block_means_keep_the_most_recent_iterations():
    assert block_means([9.0, 1.0, 3.0, 5.0, 7.0], 2) == [2.0, 6.0]  # the oldest, 9, fills no block
    assert block_means([4.0], 2) == []
    assert block_means([1.0, 2.0], 1) == [1.0, 2.0]
    with pytest.raises(ValueError):
        block_means([1.0], 0)


def test_a_100_ms_counter_read_every_iteration_resolves_a_ten_percent_saving_and_not_a_null_one():
    """Per-iteration reads of a counter that advances every 100 ms, ~1.1 s iterations (as on the H200)."""
    period_s = 0.1
    rng = np.random.default_rng(5)

    def reads(power_w: float, n: int) -> list[float]:
        ends = np.cumsum(rng.normal(1.1, 0.02, n + 1)) + rng.uniform(0, period_s)
        counter = power_w * period_s * np.floor(ends / period_s)
        return list(np.diff(counter))

    size = iterations_per_sample(1.1, period_s)
    assert size == 1
    stock = block_means(reads(1000.0, 20), size)
    saving = relative_change(stock, block_means(reads(900.0, 20), size))
    assert saving.excludes_zero and saving.low <= -0.10 <= saving.high
    assert not relative_change(stock, block_means(reads(1000.0, 20), size)).excludes_zero


def _drifting_stock(rng: np.random.Generator) -> np.ndarray:
    """20 stock iterations of ~1595 ms (1 % noise) whose last 6 run 5-20 % slower, as on the H200 dry run."""
    stock = 1595.0 * (1.0 + 0.01 * rng.standard_normal(20))
    stock[14:] *= 1.0 + np.array([0.06, 0.12, 0.2, 0.15, 0.08, 0.05])
    return stock


@pytest.mark.parametrize("planned_iters", [3, 4, 5, 10, 20])
def test_a_drift_excursion_in_the_stock_baseline_never_reads_as_a_change_in_a_dry_run(planned_iters):
    rng = np.random.default_rng(planned_iters)
    signed_without_drift = 0
    for _ in range(50):
        stock = _drifting_stock(rng)
        planned = 1595.0 * (1.0 + 0.01 * rng.standard_normal(planned_iters))  # nothing changed
        change = compare_to_stock(list(stock), list(planned), iterations_per_block=1, source="measured")
        assert change is not None and not change.excludes_zero, change.format()
        assert change.format().startswith(("within noise", "too few samples yet"))
        signed_without_drift += _welch_only(change).excludes_zero
    # the same samples taken as independent (no drift term) mostly print a signed saving: the H200's defect
    assert signed_without_drift > 25


def _welch_only(change: RelativeChange) -> RelativeChange:
    """The change's interval without the baseline's drift term (samples taken as independent)."""
    statistical = change.halfwidth - abs(1.0 + change.change) * change.drift
    return dataclasses.replace(change, halfwidth=statistical, drift=0.0)


def test_a_real_ten_percent_change_is_resolved_despite_the_drift_and_its_interval_holds_the_truth():
    rng = np.random.default_rng(7)
    for _ in range(50):
        stock = _drifting_stock(rng)
        planned = 0.9 * float(np.mean(stock)) * (1.0 + 0.01 * rng.standard_normal(10))
        change = compare_to_stock(list(stock), list(planned), iterations_per_block=1, source="measured")
        assert change is not None and change.excludes_zero and change.high < 0, change.format()
        assert change.drift > 0.03  # the excursion widened the interval
        assert change.low <= -0.1 <= change.high  # the planned level is 10 % below the baseline's mean


def test_baseline_drift_is_the_relative_difference_of_the_halves_means():
    assert baseline_drift([100.0, 100.0, 110.0, 110.0]) == pytest.approx(10.0 / 105.0)
    assert baseline_drift([100.0, 100.0, 7.0, 110.0, 110.0]) == pytest.approx(
        10.0 / (427.0 / 5)
    )  # middle out
    assert baseline_drift([100.0, 120.0, 90.0]) == 0.0  # fewer than two samples a half
    flat = relative_change([100.0, 101.0, 100.0, 101.0], [100.0, 101.0, 99.0])
    assert flat.drift == pytest.approx(0.0)


def test_the_paired_median_interval_runs_between_the_sign_test_order_statistics() -> None:
    ratios = np.linspace(-0.01, 0.02, 20)  # sorted already; 20 pairs: the 6th smallest and 6th largest
    change = paired_median_change(np.ones(20), 1.0 + ratios)
    assert change.change == pytest.approx(np.median(ratios))
    low, high = ratios[5], ratios[14]
    assert change.halfwidth == pytest.approx(max(change.change - low, high - change.change))
    assert stats.binom.cdf(5, 20, 0.5) <= 0.025 < stats.binom.cdf(6, 20, 0.5)
    # one pair far off moves the median's interval by no more than an order statistic
    assert paired_median_change(np.ones(20), 1.0 + np.r_[ratios[:-1], 5.0]).halfwidth == change.halfwidth
    assert math.isinf(paired_median_change(np.ones(5), np.full(5, 1.1)).halfwidth)  # no 95 % interval
    assert paired_median_change(np.ones(6), np.full(6, 1.1)).excludes_zero
