"""What the Kareus search keeps between trials gives the figures it would compute afresh.

The model keeps each stage's part of a schedule and of the clocks by that stage's choices, the optimiser keeps
each search it ran and each trial it priced: every kept value must be the one a fresh model or optimiser
computes, and a search asked for again must not run again.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from megatron_energy.job import JobConfig
from megatron_energy.optimisers.kareus.choices import ChoiceKey, ClassChoice, KareusModel
from megatron_energy.optimisers.kareus.collective_optimiser import KareusOptimiser
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.pipeline.collectives import build_collectives
from megatron_energy.pipeline.instruction import Instruction
from tests.kareus_jobs import EXAMPLE_7B, workload_of

JOB = JobConfig.load(EXAMPLE_7B)
SPEC = JOB.spec()
PROFILE = JOB.synthetic_profile(SPEC)
WORKLOAD = workload_of(JOB)


def fresh_model() -> KareusModel:
    return KareusModel(
        JOB.build_dag(spec=SPEC), PROFILE, SPEC, build_collectives(WORKLOAD), WORKLOAD.layers_per_chunk
    )


def moved(model: KareusModel, stage: int, **change: int | None) -> dict[ChoiceKey, ClassChoice]:
    """The defaults with every class of ``stage`` given ``change`` (CTAs, launch, clock steps)."""
    choices = model.choices_default()
    for key in model.class_keys[stage]:
        old = choices[(stage, key)]
        choices[(stage, key)] = ClassChoice(
            change.get("max_ctas", old.max_ctas),
            int(change.get("launch", old.launch) or 0),
            int(change.get("clock_steps", old.clock_steps) or 0),
        )
    return choices


def slower_by_one_grid_step(model: KareusModel) -> dict[Instruction, int]:
    """Base clocks one profiled clock below each instruction's fastest."""
    clocks = {}
    for stage in range(model.dag.num_stages):
        for instruction in model.dag.stage_order(stage):
            grid = sorted(option.clock_mhz for option in PROFILE.options(instruction.work))
            clocks[instruction] = grid[-2]
    return clocks


@pytest.mark.slow
def test_a_model_that_priced_other_choices_first_prices_each_as_a_fresh_model() -> None:
    model = fresh_model()
    slow = slower_by_one_grid_step(model)
    sequence: list[tuple[Mapping[Instruction, int] | None, dict[ChoiceKey, ClassChoice]]] = [
        (None, model.choices_default()),
        (None, moved(model, 1, max_ctas=4, launch=0, clock_steps=-2)),
        (slow, moved(model, 1, max_ctas=4, launch=0, clock_steps=-2)),
        (None, model.choices_default()),
        (slow, moved(model, 0, clock_steps=-1)),
        (dict(slow), moved(model, 2, max_ctas=8, launch=1)),
        (None, moved(model, 1, max_ctas=4, launch=0, clock_steps=-2)),
    ]
    for base, choices in sequence:
        afresh = fresh_model()
        assert model.clocks(base, choices) == afresh.clocks(base, choices)
        assert model.schedule(choices) == afresh.schedule(choices)
        kept, computed = model.evaluate(base, choices), afresh.evaluate(base, choices)
        assert (kept.iteration_time_s, kept.total_energy_j) == (
            computed.iteration_time_s,
            computed.total_energy_j,
        )


def test_base_clocks_changed_in_place_are_not_taken_for_the_kept_ones() -> None:
    model = fresh_model()
    base = slower_by_one_grid_step(model)
    choices = moved(model, 0, clock_steps=-1)
    before = model.clocks(base, choices)
    first = model.dag.stage_order(0)[0]
    base[first] = min(option.clock_mhz for option in PROFILE.options(first.work))
    after = model.clocks(base, choices)
    assert after == fresh_model().clocks(base, choices)
    assert after[first] != before[first]


class CountingModel(KareusModel):
    """A model that counts its simulations."""

    runs = 0

    def evaluate(self, base, choices):  # type: ignore[no-untyped-def]
        self.runs += 1
        return super().evaluate(base, choices)


@pytest.mark.slow
def test_a_search_asked_for_again_runs_once() -> None:
    model = CountingModel(
        JOB.build_dag(spec=SPEC), PROFILE, SPEC, build_collectives(WORKLOAD), WORKLOAD.layers_per_chunk
    )
    optimiser = KareusOptimiser(budget=SearchBudget(trials=6))
    deadline_s = model.evaluate(None, model.choices_default()).iteration_time_s
    model.runs = 0
    first = optimiser.choose(model, WORKLOAD, None, deadline_s, JOB.fingerprint())
    searched = model.runs
    trials = 1 + 10 + 6 * len(model.class_keys)  # the defaults, the joint moves, every stage's trials
    assert 0 < searched <= trials
    again = optimiser.choose(model, WORKLOAD, None, deadline_s, JOB.fingerprint())
    assert again == first and model.runs == searched
    assert (
        KareusOptimiser(budget=SearchBudget(trials=6)).choose(
            fresh_model(), WORKLOAD, None, deadline_s, JOB.fingerprint()
        )
        == first
    )
