"""The Optuna search over (CTA budget, launch point, clock offset) with fake measurement functions."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import pytest

from megatron_energy.errors import EnergyValueError
from megatron_energy.optimisers.kareus.choices import ChoiceKey, ClassChoice
from megatron_energy.optimisers.kareus.search import ClassSpace, Measurement, SearchBudget, refine, search

KEY: ChoiceKey = (0, "dp.reduce_scatter")
SPACE = {
    KEY: ClassSpace(
        ctas=(0, 1, 2, 4, 8, 16, 32), launches=(-1, 0, 1, 2, 3), clock_steps=(-3, -2, -1, 0, 1, 2)
    )
}
DEADLINE_S = 1.03


def synthetic_partition(choices: Mapping[ChoiceKey, ClassChoice]) -> Measurement:
    """A partition whose time and energy are known functions of the choice (measured by a fake meter).

    Time: more CTAs finish the collective sooner but slow the compute beside it (best at 8); launching late
    (launch -1) exposes the collective; a lower clock stretches the compute. Energy: lower clocks and fewer
    CTAs are cheaper, and the static part grows with time.
    """
    choice = choices[KEY]
    ctas = choice.max_ctas or 16
    time_s = 1.0 + 0.01 * abs(math.log2(ctas / 8)) + (0.03 if choice.launch < 0 else 0.004 * choice.launch)
    time_s -= 0.006 * choice.clock_steps
    energy_j = 100.0 + 0.8 * math.log2(ctas) + 3.0 * choice.clock_steps + 50.0 * time_s
    return Measurement(time_s, energy_j, "measured")


def brute_force() -> tuple[ClassChoice, Measurement]:
    space = SPACE[KEY]
    best = None
    for ctas, launch, clock in itertools.product(space.ctas, space.launches, space.clock_steps):
        choice = ClassChoice(None if ctas == 0 else ctas, launch, clock)
        measured = synthetic_partition({KEY: choice})
        if measured.time_s <= DEADLINE_S and (best is None or measured.energy_j < best[1].energy_j):
            best = (choice, measured)
    assert best is not None
    return best


def test_search_converges_to_the_known_optimum_of_a_synthetic_partition() -> None:
    optimum, measured = brute_force()
    result = search(SPACE, synthetic_partition, DEADLINE_S, SearchBudget(trials=90, seed=1))
    assert result.feasible
    assert result.best.choices[KEY] == optimum, (result.best, optimum, measured)
    assert result.best.measurement.source == "measured"
    assert len(result.trials) == 90


def test_seeds_are_tried_first_and_an_infeasible_search_returns_the_fastest() -> None:
    seed = {KEY: ClassChoice(8, 0, 2)}
    result = search(SPACE, synthetic_partition, 0.5, SearchBudget(trials=5), seeds=[seed])
    assert result.trials[0].choices[KEY] == ClassChoice(8, 0, 2)
    assert not result.feasible
    assert result.best.measurement.time_s == min(t.measurement.time_s for t in result.trials)


def test_budget_counts_measured_trials_in_training_time() -> None:
    budget = SearchBudget(trials=100, max_training_s=600, steps_per_trial=4)
    assert budget.measured_trials(iteration_time_s=5.0) == 30
    assert budget.measured_trials(iteration_time_s=0.1) == 100
    with pytest.raises(EnergyValueError):
        SearchBudget(trials=0)
    with pytest.raises(EnergyValueError):
        search({}, synthetic_partition, 1.0, SearchBudget())


def test_refinement_measures_the_model_best_first_within_the_training_budget() -> None:
    def model(choices: Mapping[ChoiceKey, ClassChoice]) -> Measurement:
        measured = synthetic_partition(choices)
        return Measurement(measured.time_s * 0.98, measured.energy_j, "modelled")  # the model is optimistic

    modelled = search(SPACE, model, DEADLINE_S, SearchBudget(trials=40, seed=2))
    budget = SearchBudget(trials=100, max_training_s=60.0, steps_per_trial=4, seed=2)
    calls: list[Mapping[ChoiceKey, ClassChoice]] = []

    def measure(choices: Mapping[ChoiceKey, ClassChoice]) -> Measurement:
        calls.append(dict(choices))
        return synthetic_partition(choices)

    refined = refine(SPACE, measure, DEADLINE_S, budget, modelled, iteration_time_s=0.5)
    assert len(calls) == 30  # 60 s of training / (4 steps x 0.5 s)
    best_modelled = min(
        (t for t in modelled.trials if t.measurement.time_s <= DEADLINE_S),
        key=lambda t: t.measurement.energy_j,
    )
    assert calls[0] == best_modelled.choices
    assert refined.best.measurement.source == "measured"
    assert refined.best.measurement.time_s <= DEADLINE_S
    with pytest.raises(EnergyValueError, match="no measured trial"):
        refine(SPACE, measure, DEADLINE_S, SearchBudget(max_training_s=1.0), modelled, iteration_time_s=5.0)
