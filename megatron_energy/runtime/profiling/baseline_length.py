"""How many stock-clock iterations the session measures: long enough to resolve a saving, bounded.

Every measured saving (the energy log, the demo summary, TensorBoard/W&B scalars) is the relative change of
per-iteration figures under the plan against those at stock clocks (``stats.relative_change``), so the stock
side must hold enough iterations for the interval to be narrow. The session profiles the stock clock first:
one settling step, then the baseline steps, timed as the run phase times its steps (lagged, no device sync;
``runtime.profiling.collector``), then ``--energy-profile-iters`` synchronous profile steps. The baseline
starts with a pilot of ``pilot_steps`` steps; at the pilot's last step's end (when, under the lag, the
figures of all its steps but the last have come) each rank takes, from the pilot steps recorded so far,

* the mean iteration time (whole iterations),
* the observed spread: the larger coefficient of variation of its per-iteration energy and time (counter
  quantisation and noise included, since they were observed through the same counter),
* the energy counter's period (``GpuSpec.energy_counter_period_s``; 0 when the timer knows energies exactly,
  on simulated GPUs): a sample must span at least two counter periods,

and :func:`megatron_energy.stats.baseline_steps` answers how many iterations bring the interval's half-width
down to ``TARGET_HALFWIDTH`` when the planned window is as long and as noisy (so a saving of twice that is
resolved). The answer is bounded: never below the pilot, and the stock clock's measured iterations (the
baseline and the synchronous profile steps together) never above ``MAX_STOCK_STEPS`` nor above
``MAX_STOCK_S`` seconds (profiling stays short; a noisier job then gets a wider interval, which the log
states). Every rank takes the largest answer (one all-reduce), so all profile the same steps.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from megatron_energy.runtime.control_plane.comms import RankComms
from megatron_energy.runtime.control_plane.group_chain import reduce_everywhere
from megatron_energy.runtime.profiling.collector import ProfileCollector, StepRecord
from megatron_energy.stats import MIN_SAMPLES_TO_RESOLVE, baseline_steps

MIN_STOCK_STEPS = MIN_SAMPLES_TO_RESOLVE + 1
"""Fewest baseline iterations: a spread needs a few, and under the lag the pilot's last step's figures
come only after the decision, so the pilot holds one more."""

TARGET_HALFWIDTH = 0.01
"""The interval half-width (1 %) the stock baseline is sized for: savings of 2 % and more are resolved."""

MAX_STOCK_STEPS = 20
"""Most measured stock-clock iterations (baseline and synchronous profile steps), whatever the noise."""

MAX_STOCK_S = 60.0
"""Most seconds of measured stock-clock iterations."""


def pilot_steps(profile_iters: int) -> int:
    """Baseline steps before the baseline's length is decided."""
    return max(profile_iters, MIN_STOCK_STEPS)


def stock_steps_needed(
    pilot: Sequence[StepRecord], counter_period_s: float, synchronous_steps: int = 0, begun: int = 0
) -> int:
    """The baseline iterations this rank asks for, from its pilot (see the module docstring).

    Args:
        pilot: This rank's baseline steps recorded so far (at least two).
        counter_period_s: The energy counter's period; 0 when the energies are exact.
        synchronous_steps: The stock clock's synchronous profile steps, which count towards the bounds.
        begun: Baseline steps already begun (the pilot, some not recorded yet under the lag).

    Returns:
        At least ``max(len(pilot), begun)``; otherwise at most the bounds less ``synchronous_steps``.
    """
    floor = max(len(pilot), begun)
    times = [record.iteration_s for record in pilot]
    energies = [record.energy_j for record in pilot]
    iteration_s = statistics.fmean(times)
    if len(pilot) < 2 or not (iteration_s > 0 and all(map(math.isfinite, energies))):
        return floor
    spread = max(_variation(times), _variation(energies))
    wanted = baseline_steps(iteration_s, TARGET_HALFWIDTH, spread, counter_period_s)
    ceiling = min(MAX_STOCK_STEPS, math.floor(MAX_STOCK_S / iteration_s)) - synchronous_steps
    return max(floor, min(wanted, ceiling))


def _variation(values: Sequence[float]) -> float:
    """Coefficient of variation (sample standard deviation over the mean); 0 for a non-positive mean."""
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else 0.0


def agree_stock_steps(collector: ProfileCollector, comms: RankComms, period_s: float) -> None:
    """At the pilot's last step's end, every rank agrees on how many baseline steps to measure (the max).

    Under the lag the pilot's last step is not recorded yet: the decision uses the steps that are.
    ``period_s`` is the energy counter's period (0 where energies are exact). A rank that cannot tell keeps
    the pilot; the others decide.
    """
    try:
        mine = stock_steps_needed(
            collector.baseline_steps(), period_s, collector.steps_per_clock, collector.stock_begun
        )
    except Exception:  # a rank that cannot tell keeps the pilot; the others decide
        mine = collector.stock_iters
    (agreed,) = reduce_everywhere(comms, [float(mine)])
    collector.set_stock_steps(int(agreed))
