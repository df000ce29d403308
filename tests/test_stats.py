import math

import numpy as np
import pytest

from megatron_energy.stats import (
    baseline_steps,
    block_means,
    iterations_per_sample,
    mean_interval,
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
    assert single.format() == "within noise (±inf %)"


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
    assert not same.excludes_zero and same.format() == "within noise (±0.00 %)"


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
