"""Statistics for measured figures: means with confidence intervals, relative changes, baseline lengths.

One module so that the energy log, the summary, the report, TensorBoard/W&B scalars and the scripts all
state a measured saving the same way: a mean over a window of iterations with a 95 % confidence interval,
and "within noise" when the interval covers zero ("too few samples yet" while a side holds fewer than
``MIN_SAMPLES_TO_RESOLVE``).

* :func:`mean_interval`: Student-t interval of a mean (samples taken as independent).
* :func:`relative_change`: change of the treatment mean relative to the baseline mean, two independent
  samples (e.g. stock iterations vs planned iterations). Welch's unequal-variance setting; the interval of
  the ratio of means comes from the **delta method** (first-order Taylor expansion of ``m_t / m_b``), with
  Welch-Satterthwaite degrees of freedom. It is symmetric and accurate while the baseline mean is known to
  a few percent (its relative standard error below ~10 %), which every window this module sizes satisfies
  (:func:`baseline_steps`); Fieller's exact interval differs from it only by terms of that order squared.
  To that statistical half-width it **adds the drift observed inside the baseline** (:func:`baseline_drift`).

**Why a drift term.** Per-iteration figures on real GPUs are not independent: an H200 dry run (nothing
changed) showed excursions of 5-20 % lasting ~6 consecutive iterations (also without the plugin), and the
Welch interval, which takes samples as independent, then called a difference of levels a saving (-2.6 %
± 2.0 %, -7.4 % ± 5.1 %). Batch means long enough to absorb such an excursion would need blocks of ~6+
iterations, i.e. 60+ iterations of stock baseline for a few blocks: far beyond the profiling bound
(``runtime.profiling.baseline_length.MAX_STOCK_STEPS``). Instead the baseline, measured in consecutive
iterations, is its own witness of how far the level wanders: ``d = |mean(later half) - mean(earlier half)| /
mean`` (halves of the baseline's samples in the order they ran). A window measured later may sit at least
that far from the baseline's level for reasons other than the treatment, so ``|r| · d`` is added linearly (as
a systematic term, not in quadrature) to the Student-t half-width. Without drift the term is of the order of
the noise (``~2 · CV / sqrt(n)``), so a real 10 % change with a few percent of noise stays resolved; a
baseline with an excursion like the H200's widens the interval by the excursion's share, so a dry run reads
"within noise". The samples' grouping by the energy counter (:func:`iterations_per_sample`, blocks of at
least two counter periods) is unchanged; the drift term is computed on those samples.
* :func:`paired_relative_change`: the same for paired samples (run ``i`` without and with a plugin, side by
  side): the per-pair ratios ``t_i / b_i - 1`` and a Student-t interval of their mean, so run-to-run drift
  that hits both members of a pair cancels.
* :func:`paired_median_change`: the median of those ratios with its distribution-free (sign-test) interval,
  for pairs of which a few are hit by disturbances from outside (another tenant of a shared machine).
* :func:`baseline_steps`: how many stock iterations resolve a given effect, from the energy counter's period,
  the iteration time and the observed spread of per-iteration figures.
* :func:`iterations_per_sample` and :func:`block_means`: per-iteration figures read from an energy counter
  that advances every ~100 ms are grouped into samples of consecutive iterations spanning at least two
  counter periods before they enter an interval, as :func:`baseline_steps` assumes.

Pure Python + numpy/scipy: no torch, megatron or NVML imports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import special  # the quantile functions scipy.stats calls, without its seconds of import

Source = Literal["measured", "modelled"]

RESOLVABLE_PERIODS = 2.0
"""A window of iterations must span at least this many energy-counter periods (cf. ``dvfs.meter``)."""

ROUNDING = 1e-9
"""A relative change smaller than this is floating-point rounding (identical simulated figures), never a
resolved change."""

MIN_SAMPLES_TO_RESOLVE = 3
"""Fewest samples on each side of a comparison before a change of estimated spread is called resolved (a
spread needs a few; the stock baseline measures at least as many, ``runtime.profiling.baseline_length``)."""


@dataclass(frozen=True)
class MeanInterval:
    """A sample mean with its two-sided Student-t confidence interval.

    Attributes:
        mean: The sample mean.
        halfwidth: Half the interval's width (``inf`` with fewer than two samples).
        n: Number of samples.
        confidence: Confidence level, e.g. 0.95.
    """

    mean: float
    halfwidth: float
    n: int
    confidence: float

    @property
    def low(self) -> float:
        """Lower end of the interval."""
        return self.mean - self.halfwidth

    @property
    def high(self) -> float:
        """Upper end of the interval."""
        return self.mean + self.halfwidth


@dataclass(frozen=True)
class RelativeChange:
    """Relative change of a treatment mean against a baseline mean, with its confidence interval.

    ``change`` is ``mean_treatment / mean_baseline - 1``: -0.12 means 12 % less than the baseline (a saving
    of 12 % when the figure is energy).

    Attributes:
        change: The point estimate of the relative change.
        halfwidth: Half the interval's width, as a fraction (``inf`` when it cannot be estimated).
        n_baseline: Baseline samples (pairs, for a paired analysis).
        n_treatment: Treatment samples (pairs, for a paired analysis).
        confidence: Confidence level, e.g. 0.95.
        source: ``"measured"`` or ``"modelled"``: where the samples came from.
        method: How the interval was computed, in words.
    """

    change: float
    halfwidth: float
    n_baseline: int
    n_treatment: int
    confidence: float
    source: Source
    method: str
    drift: float = 0.0
    """The baseline's own drift (:func:`baseline_drift`) included in ``halfwidth``, as a fraction."""

    @property
    def low(self) -> float:
        """Lower end of the interval."""
        return self.change - self.halfwidth

    @property
    def high(self) -> float:
        """Upper end of the interval."""
        return self.change + self.halfwidth

    @property
    def too_few(self) -> bool:
        """True when a side holds fewer than ``MIN_SAMPLES_TO_RESOLVE`` samples and the spread is estimated.

        Two samples give a spread with one degree of freedom: an interval from them is too often narrow by
        luck (a dry run's first planned iterations read as a saving), so no change is called resolved on
        so few. Exact figures (zero spread, simulated GPUs) need no spread estimate.
        """
        return self.halfwidth > 0.0 and min(self.n_baseline, self.n_treatment) < MIN_SAMPLES_TO_RESOLVE

    @property
    def excludes_zero(self) -> bool:
        """True when the change is resolved: enough samples, and the interval wholly above or below zero."""
        return not self.too_few and (self.low > ROUNDING or self.high < -ROUNDING)

    def format(self) -> str:
        """The change as a log line states it.

        Returns:
            ``"-12.1 % ± 0.8 % (measured, 95 % CI, n=20 vs 20)"`` when the change is resolved,
            ``"within noise (±1.3 %)"`` when its interval covers zero, ``"no change"`` when nothing varies
            (identical figures, zero spread), ``"too few samples yet (n=2 vs 20)"``
            when a side has fewer than ``MIN_SAMPLES_TO_RESOLVE``; two decimals when the half-width is below
            0.1 %.
        """
        digits = 2 if self.halfwidth < 0.001 else 1
        if self.too_few:
            return f"too few samples yet (n={self.n_baseline} vs {self.n_treatment})"
        if self.halfwidth <= ROUNDING and abs(self.change) <= ROUNDING:
            return "no change"
        if not self.excludes_zero:
            return f"within noise (±{_percent(self.halfwidth, digits)} %)"
        return (
            f"{100 * self.change:+.{digits}f} % ± {_percent(self.halfwidth, digits)} % "
            f"({self.source}, {100 * self.confidence:g} % CI, n={self.n_baseline} vs {self.n_treatment})"
        )

    def scalars(self, prefix: str) -> dict[str, float]:
        """The change as TensorBoard/W&B scalars: ``prefix``, its ``_low``, ``_high`` and ``_resolved``."""
        return {
            prefix: self.change,
            f"{prefix}_low": self.low,
            f"{prefix}_high": self.high,
            f"{prefix}_resolved": float(self.excludes_zero),
        }


def _percent(fraction: float, digits: int) -> str:
    """A fraction as a percentage with ``digits`` decimals, or ``inf``."""
    return f"{100 * fraction:.{digits}f}" if math.isfinite(fraction) else "inf"


def _as_array(samples: Sequence[float], what: str) -> np.ndarray:
    """``samples`` as a float array; ValueError if empty or not finite."""
    values = np.asarray(samples, dtype=float)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{what}: need a non-empty sequence of numbers")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{what}: every sample must be finite")
    return values


def _check_confidence(confidence: float) -> None:
    """ValueError unless ``confidence`` lies in (0, 1)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")


def _t_quantile(confidence: float, dof: float) -> float:
    """Two-sided Student-t quantile for ``confidence`` at ``dof`` degrees of freedom."""
    _check_confidence(confidence)
    return float(special.stdtrit(dof, 0.5 + confidence / 2.0))


def mean_interval(samples: Sequence[float], confidence: float = 0.95) -> MeanInterval:
    """The mean of ``samples`` with its Student-t confidence interval.

    Args:
        samples: Independent samples (e.g. energy per iteration over a window).
        confidence: Two-sided confidence level.

    Returns:
        The mean and the interval's half-width (``inf`` with one sample).

    Raises:
        ValueError: If ``samples`` is empty or holds a non-finite value, or ``confidence`` is not in (0, 1).
    """
    _check_confidence(confidence)
    values = _as_array(samples, "mean_interval")
    n = values.size
    if n < 2:
        return MeanInterval(float(values[0]), math.inf, 1, confidence)
    halfwidth = _t_quantile(confidence, n - 1) * float(np.std(values, ddof=1)) / math.sqrt(n)
    return MeanInterval(float(np.mean(values)), halfwidth, n, confidence)


def relative_change(
    baseline_samples: Sequence[float],
    treatment_samples: Sequence[float],
    confidence: float = 0.95,
    source: Source = "measured",
) -> RelativeChange:
    """Relative change of the treatment mean against the baseline mean, widened by the baseline's drift.

    With ``r = m_t / m_b`` and the relative variances of the means ``a = s_t² / (n_t m_t²)`` and
    ``b = s_b² / (n_b m_b²)``, the delta method gives ``Var(r) ≈ r² (a + b)``; the interval is
    ``r - 1 ± (t_q(ν) · r · sqrt(a + b) + r · d)`` with Welch-Satterthwaite degrees of freedom
    ``ν = (a + b)² / (a²/(n_t-1) + b²/(n_b-1))`` and ``d`` the drift observed inside the baseline
    (:func:`baseline_drift`; see the module docstring).

    Args:
        baseline_samples: E.g. energy per iteration at stock clocks.
        treatment_samples: E.g. energy per iteration under the plan.
        confidence: Two-sided confidence level.
        source: Where the samples came from, carried into :meth:`RelativeChange.format`.

    Returns:
        The change and its interval; ``halfwidth`` is ``inf`` when either side has fewer than two samples.

    Raises:
        ValueError: If a side is empty or not finite, or the baseline mean is not positive.
    """
    _check_confidence(confidence)
    baseline = _as_array(baseline_samples, "relative_change baseline")
    treatment = _as_array(treatment_samples, "relative_change treatment")
    mean_b, mean_t = float(np.mean(baseline)), float(np.mean(treatment))
    if mean_b <= 0.0:
        raise ValueError(f"relative_change: the baseline mean must be positive, got {mean_b!r}")
    ratio = mean_t / mean_b
    method = "Welch, delta method for the ratio of means, plus the baseline's drift between its halves"
    n_b, n_t = baseline.size, treatment.size
    if n_b < 2 or n_t < 2:
        return RelativeChange(ratio - 1.0, math.inf, n_b, n_t, confidence, source, method)
    rel_var_b = float(np.var(baseline, ddof=1)) / (n_b * mean_b**2)
    rel_var_t = float(np.var(treatment, ddof=1)) / (n_t * mean_t**2) if mean_t != 0.0 else 0.0
    total = rel_var_b + rel_var_t
    if total == 0.0:
        return RelativeChange(ratio - 1.0, 0.0, n_b, n_t, confidence, source, method)
    dof = total**2 / (rel_var_t**2 / (n_t - 1) + rel_var_b**2 / (n_b - 1))
    drift = baseline_drift(baseline.tolist())
    halfwidth = _t_quantile(confidence, dof) * abs(ratio) * math.sqrt(total) + abs(ratio) * drift
    return RelativeChange(ratio - 1.0, halfwidth, n_b, n_t, confidence, source, method, drift)


def baseline_drift(samples: Sequence[float]) -> float:
    """How far the level of consecutive samples wandered: the relative difference of their halves' means.

    Args:
        samples: Baseline samples in the order they ran (e.g. stock iterations' block means).

    Returns:
        ``|mean(later half) - mean(earlier half)| / mean`` (the middle sample of an odd count left out);
        0 with fewer than 4 samples (2 a half) or a non-positive mean.

    Raises:
        ValueError: If ``samples`` is empty or holds a non-finite value.
    """
    values = _as_array(samples, "baseline_drift")
    half = values.size // 2
    mean = float(np.mean(values))
    if half < 2 or mean <= 0.0:
        return 0.0
    return abs(float(np.mean(values[-half:])) - float(np.mean(values[:half]))) / mean


def _paired_ratios(
    baseline_samples: Sequence[float], treatment_samples: Sequence[float], what: str
) -> np.ndarray:
    """The per-pair changes ``t_i / b_i - 1``; ValueError on unequal, empty, non-finite or bad sides."""
    baseline = _as_array(baseline_samples, f"{what} baseline")
    treatment = _as_array(treatment_samples, f"{what} treatment")
    if baseline.size != treatment.size:
        raise ValueError(f"{what}: {baseline.size} baselines vs {treatment.size} treatments")
    if np.any(baseline <= 0.0):
        raise ValueError(f"{what}: every baseline must be positive")
    return treatment / baseline - 1.0


def paired_relative_change(
    baseline_samples: Sequence[float],
    treatment_samples: Sequence[float],
    confidence: float = 0.95,
    source: Source = "measured",
) -> RelativeChange:
    """Relative change from paired samples: Student-t interval of the mean of ``t_i / b_i - 1``.

    Args:
        baseline_samples: One figure per pair without the treatment (e.g. a run's median iteration time).
        treatment_samples: The same pairs' figures with the treatment, in the same order.
        confidence: Two-sided confidence level.
        source: Where the samples came from.

    Returns:
        The mean per-pair change and its interval (``n_baseline == n_treatment`` == number of pairs).

    Raises:
        ValueError: If the sides differ in length, are empty or not finite, or a baseline is not positive.
    """
    ratios = _paired_ratios(baseline_samples, treatment_samples, "paired_relative_change")
    interval = mean_interval(ratios.tolist(), confidence)
    n = interval.n
    method = "paired, Student-t over per-pair ratios"
    return RelativeChange(interval.mean, interval.halfwidth, n, n, confidence, source, method)


def paired_median_change(
    baseline_samples: Sequence[float],
    treatment_samples: Sequence[float],
    confidence: float = 0.95,
    source: Source = "measured",
) -> RelativeChange:
    """Relative change from paired samples: the median of ``t_i / b_i - 1`` with its sign-test interval.

    The interval runs between the ``k``-th smallest and the ``k``-th largest ratio, with ``k`` the largest
    order for which a binomial(n, 1/2) count below ``k`` has probability at most ``(1 - confidence) / 2``: it
    holds the median of the ratios' distribution with at least ``confidence``, whatever that distribution
    (distribution-free; no symmetry assumed). A few pairs hit by an outside disturbance move it by at most a
    few order statistics, where they would set a mean's interval. The interval is widened to be symmetric
    about the median (``RelativeChange`` is): never narrower than the exact one.

    Args:
        baseline_samples: One figure per pair without the treatment.
        treatment_samples: The same pairs' figures with the treatment, in the same order.
        confidence: Two-sided confidence level.
        source: Where the samples came from.

    Returns:
        The median per-pair change and its interval (half-width ``inf`` while the pairs are too few for any
        interval at ``confidence``: fewer than 6 at 95 %).

    Raises:
        ValueError: As :func:`paired_relative_change`, or if ``confidence`` is not in (0, 1).
    """
    _check_confidence(confidence)
    ratios = np.sort(_paired_ratios(baseline_samples, treatment_samples, "paired_median_change"))
    n = ratios.size
    median = float(np.median(ratios))
    tail = (1.0 - confidence) / 2.0
    order = 0  # the largest k with P(Binomial(n, 1/2) <= k - 1) <= tail
    while order < n // 2 and special.bdtr(order, n, 0.5) <= tail:
        order += 1
    halfwidth = math.inf
    if order >= 1:
        halfwidth = max(median - float(ratios[order - 1]), float(ratios[n - order]) - median)
    method = "paired, median of per-pair ratios, sign-test interval"
    return RelativeChange(median, halfwidth, n, n, confidence, source, method)


def baseline_steps(
    iteration_s: float,
    target_halfwidth: float,
    observed_cv: float,
    counter_period_s: float = 0.1,
    confidence: float = 0.95,
    min_samples: int = 3,
) -> int:
    """How many stock iterations a baseline needs to resolve a relative change of ``target_halfwidth``.

    Two constraints decide it:

    1. **Counter granularity.** The energy counter advances every ``counter_period_s``, so one energy
       sample must span at least ``RESOLVABLE_PERIODS`` (2) periods: a sample is a window of
       ``w = ceil(2 · counter_period_s / iteration_s)`` iterations (1 when an iteration is long enough).
    2. **Noise.** With per-iteration coefficient of variation ``observed_cv`` (spread / mean, counter
       quantisation included, since it was observed with the same counter), a window of ``w`` iterations
       has CV ``cv_w = observed_cv / sqrt(w)``. Baseline and treatment measured over equally long windows of
       ``n`` samples give a change whose interval half-width is ``t_q(2n - 2) · cv_w · sqrt(2 / n)``
       (:func:`relative_change` with equal spreads), plus the drift term the baseline's own noise gives on
       average (:func:`baseline_drift` of independent samples: ``sqrt(2/π) · 2 · cv_w / sqrt(n)``); ``n``
       is the smallest count that brings the sum to at most ``target_halfwidth``, and never below
       ``min_samples``.

    The answer is ``n · w`` iterations. Choose ``target_halfwidth`` below the saving to be resolved (e.g. half
    of it): a saving of 10 % with a half-width of 5 % still excludes zero.

    Args:
        iteration_s: Measured time of one iteration.
        target_halfwidth: Largest acceptable interval half-width, as a fraction (0.01 = 1 %).
        observed_cv: Coefficient of variation of per-iteration figures (from a first window; 0 if none).
        counter_period_s: The energy counter's update period (``GpuSpec.energy_counter_period_s``); 0 when
            the figures are exact (simulated GPUs' modelled energies), so every iteration is a sample.
        confidence: Two-sided confidence level.
        min_samples: Fewest samples of a window, whatever the noise.

    Returns:
        The number of stock iterations to measure.

    Raises:
        ValueError: If a time, the target or the CV is not positive/finite as required.
    """
    if not (math.isfinite(iteration_s) and iteration_s > 0 and counter_period_s >= 0):
        raise ValueError("baseline_steps: iteration_s must be positive and counter_period_s non-negative")
    if not (math.isfinite(target_halfwidth) and target_halfwidth > 0):
        raise ValueError("baseline_steps: target_halfwidth must be positive")
    if not (math.isfinite(observed_cv) and observed_cv >= 0):
        raise ValueError("baseline_steps: observed_cv must be non-negative")
    _check_confidence(confidence)
    per_sample = iterations_per_sample(iteration_s, counter_period_s)
    window_cv = observed_cv / math.sqrt(per_sample)
    normal_q = float(special.ndtri(0.5 + confidence / 2.0))
    samples = max(2, min_samples, math.ceil(2.0 * (normal_q * window_cv / target_halfwidth) ** 2))
    while _expected_halfwidth(samples, window_cv, confidence) > target_halfwidth:
        samples += 1
    return samples * per_sample


def _expected_halfwidth(samples: int, window_cv: float, confidence: float) -> float:
    """:func:`relative_change`'s half-width: two sides of ``samples`` independent samples of CV ``window_cv``.

    The Student-t part with equal spreads, plus the mean absolute halves difference such noise gives
    (the drift term of independent samples).
    """
    statistical = _t_quantile(confidence, 2 * samples - 2) * window_cv * math.sqrt(2.0 / samples)
    drift = math.sqrt(2.0 / math.pi) * 2.0 * window_cv / math.sqrt(samples) if samples >= 4 else 0.0
    return statistical + drift


def iterations_per_sample(iteration_s: float, counter_period_s: float) -> int:
    """Consecutive iterations one energy sample must span: at least ``RESOLVABLE_PERIODS`` counter periods.

    Args:
        iteration_s: Mean time of one iteration.
        counter_period_s: The energy counter's update period; 0 for exact energies (then 1).

    Returns:
        ``ceil(2 · counter_period_s / iteration_s)``, at least 1.

    Raises:
        ValueError: If ``iteration_s`` is not positive or the period is negative.
    """
    if not (math.isfinite(iteration_s) and iteration_s > 0 and counter_period_s >= 0):
        raise ValueError("iterations_per_sample: iteration_s must be positive, counter_period_s non-negative")
    return max(1, math.ceil(RESOLVABLE_PERIODS * counter_period_s / iteration_s - 1e-9))


def block_means(samples: Sequence[float], size: int) -> list[float]:
    """Means of consecutive blocks of ``size`` samples; the oldest samples that fill no block are left out.

    A window of iterations read from an energy counter is grouped this way (``size`` from
    :func:`iterations_per_sample`), so each sample spans enough counter periods and the most recent
    iterations always count.

    Args:
        samples: Per-iteration figures in the order they ran.
        size: Iterations per block (at least 1).

    Returns:
        One mean per full block, oldest first (empty when fewer than ``size`` samples).

    Raises:
        ValueError: If ``size`` is below 1.
    """
    if size < 1:
        raise ValueError(f"block_means: size must be at least 1, got {size}")
    values = list(samples)
    start = len(values) % size
    return [sum(values[i : i + size]) / size for i in range(start, len(values), size)]
