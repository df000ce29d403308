"""Joint search of (clock offset, CTA budget, launch point) per collective class and stage, with Optuna.

The search minimises two objectives, iteration time and energy, with Optuna's multi-objective TPE sampler
(MOTPE: ``optuna.samplers.TPESampler`` with two directions; ``sampler="nsga2"`` picks NSGA-II instead) under
the constraint ``time <= deadline``, and returns the least-energy trial that meets the deadline (the fastest
trial when none does). Every trial is priced by a :data:`Measure`:

* the model (:class:`~megatron_energy.optimisers.kareus.choices.KareusModel`, *modelled*), which is cheap,
  seeds the search: the optimiser searches stage by stage (coordinate-wise: one study per stage with the
  other stages at their best so far), and enqueues megatron-core's defaults and a few model-derived points
  first;
* a measurement (the runtime times and meters real training steps under the trial's choices and returns
  *measured* figures) refines it: :func:`search` again with ``seeds`` = the model's best choices, within
  :class:`SearchBudget`'s training time.

:func:`refine` does the second step. Results are cached by fingerprint
(:mod:`megatron_energy.optimisers.kareus.search_cache`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from megatron_energy.errors import EnergyValueError
from megatron_energy.optimisers.kareus.choices import ChoiceKey, ClassChoice
from megatron_energy.plan import Provenance

if TYPE_CHECKING:
    import optuna

CTA_DEFAULT = 0
"""The value of a CTA-budget parameter that stands for NCCL's default (``max_ctas=None``)."""


@dataclass(frozen=True)
class Measurement:
    """Time and energy of one iteration under a trial's choices."""

    time_s: float
    """Iteration time."""
    energy_j: float
    """Energy of the iteration (the GPUs the search covers)."""
    source: Provenance = "modelled"
    """``measured`` (CUDA events and the energy counter over real steps) or ``modelled``."""


Choices = dict[ChoiceKey, ClassChoice]
Measure = Callable[[Mapping[ChoiceKey, ClassChoice]], Measurement]
"""A trial's choices -> its iteration time and energy: the model, or the runtime's measurement callback."""


@dataclass(frozen=True)
class ClassSpace:
    """The values the search may give one collective class on one stage.

    Attributes:
        ctas: CTA budgets (:data:`CTA_DEFAULT` for NCCL's default).
        launches: Launch choices (``ClassChoice.launch``).
        clock_steps: Clock offsets (``ClassChoice.clock_steps``).
    """

    ctas: tuple[int, ...]
    launches: tuple[int, ...] = (0,)
    clock_steps: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        if not (self.ctas and self.launches and self.clock_steps):
            raise EnergyValueError("every dimension of a class's search space needs at least one value")

    @property
    def size(self) -> int:
        """Configurations of this class."""
        return len(self.ctas) * len(self.launches) * len(self.clock_steps)


@dataclass(frozen=True)
class SearchBudget:
    """How much the search may try (megatron-core-style config: one docstring per field)."""

    trials: int = 64
    """Trials of one search (model-priced trials are cheap; measured ones cost training steps)."""

    max_training_s: float = 600.0
    """Training time measured trials may take in all (the issue's 10 minutes)."""

    steps_per_trial: int = 4
    """Training steps one measured trial runs (one warm-up, then measured steps over >= 5 s of energy
    counter where the step is short)."""

    seed: int = 0
    """Seed of the sampler (searches are reproducible)."""

    sampler: str = "tpe"
    """``"tpe"`` (Optuna's multi-objective TPE) or ``"nsga2"``."""

    def __post_init__(self) -> None:
        if self.trials < 1 or self.steps_per_trial < 1 or not self.max_training_s > 0:
            raise EnergyValueError(f"a search budget needs positive trials, steps and time: {self}")
        if self.sampler not in ("tpe", "nsga2"):
            raise EnergyValueError(f"sampler must be 'tpe' or 'nsga2', got {self.sampler!r}")

    def measured_trials(self, iteration_time_s: float) -> int:
        """Trials that fit :attr:`max_training_s` when each runs :attr:`steps_per_trial` steps."""
        if not iteration_time_s > 0:
            raise EnergyValueError(f"iteration time must be positive, got {iteration_time_s}")
        return max(
            0, min(self.trials, math.floor(self.max_training_s / (self.steps_per_trial * iteration_time_s)))
        )


@dataclass(frozen=True)
class Trial:
    """One priced trial."""

    choices: Choices
    """What it tried."""
    measurement: Measurement
    """What it cost."""


@dataclass(frozen=True)
class SearchResult:
    """The outcome of one search."""

    best: Trial
    """Least energy meeting the deadline (the fastest trial when none does)."""
    trials: tuple[Trial, ...] = field(repr=False)
    """Every trial, in the order they ran."""
    feasible: bool = True
    """Whether ``best`` meets the deadline."""


def _param(key: ChoiceKey, dimension: str) -> str:
    return f"s{key[0]}.{key[1]}.{dimension}"


def _sampler(budget: SearchBudget, deadline_s: float) -> optuna.samplers.BaseSampler:
    """The multi-objective sampler the budget names, with the deadline as its constraint."""
    import optuna

    def constraints(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
        return [trial.values[0] - deadline_s] if trial.values else [0.0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks multivariate TPE and constraints experimental
        if budget.sampler == "nsga2":
            return optuna.samplers.NSGAIISampler(
                seed=budget.seed,
                population_size=max(4, min(20, budget.trials // 4)),
                constraints_func=constraints,
            )
        return optuna.samplers.TPESampler(
            seed=budget.seed,
            multivariate=True,
            n_startup_trials=max(4, min(12, budget.trials // 4)),
            constraints_func=constraints,
        )


def search(
    space: Mapping[ChoiceKey, ClassSpace],
    measure: Measure,
    deadline_s: float,
    budget: SearchBudget,
    fixed: Mapping[ChoiceKey, ClassChoice] | None = None,
    seeds: Sequence[Mapping[ChoiceKey, ClassChoice]] = (),
    trials: int | None = None,
) -> SearchResult:
    """Search ``space`` for the least energy at ``time <= deadline_s`` (module docstring).

    Args:
        space: The classes searched and their values.
        measure: Prices a trial (the model or a measurement).
        deadline_s: The iteration-time budget.
        budget: Trials and sampler.
        fixed: Choices of classes outside ``space`` every trial keeps.
        seeds: Choices tried first (values outside ``space`` are dropped to the nearest allowed).
        trials: Trials of this search; ``budget.trials`` when ``None``.

    Returns:
        The best trial and all trials.

    Raises:
        EnergyValueError: If the space is empty.
    """
    import optuna

    if not space:
        raise EnergyValueError("nothing to search: the space has no collective class")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(directions=["minimize", "minimize"], sampler=_sampler(budget, deadline_s))
    for seed in seeds:
        study.enqueue_trial(_seed_params(space, seed), skip_if_exists=True)
    history: list[Trial] = []
    base = dict(fixed or {})

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        choices = dict(base)
        for key, values in space.items():
            ctas = trial.suggest_categorical(_param(key, "ctas"), values.ctas)
            launch = trial.suggest_categorical(_param(key, "launch"), values.launches)
            clock = trial.suggest_categorical(_param(key, "clock"), values.clock_steps)
            choices[key] = ClassChoice(None if ctas == CTA_DEFAULT else int(ctas), int(launch), int(clock))
        measurement = measure(choices)
        history.append(Trial(choices, measurement))
        return measurement.time_s, measurement.energy_j

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(objective, n_trials=budget.trials if trials is None else trials)
    return _best(history, deadline_s)


def _best(history: Sequence[Trial], deadline_s: float) -> SearchResult:
    tolerance = deadline_s * 1e-9
    feasible = [t for t in history if t.measurement.time_s <= deadline_s + tolerance]
    if feasible:
        best = min(feasible, key=lambda t: (t.measurement.energy_j, t.measurement.time_s))
        return SearchResult(best, tuple(history), True)
    return SearchResult(min(history, key=lambda t: t.measurement.time_s), tuple(history), False)


def _seed_params(
    space: Mapping[ChoiceKey, ClassSpace], seed: Mapping[ChoiceKey, ClassChoice]
) -> dict[str, int]:
    """Optuna parameters of a seed, each value moved to the nearest allowed one."""
    params: dict[str, int] = {}
    for key, values in space.items():
        choice = seed.get(key) or ClassChoice()
        ctas = CTA_DEFAULT if choice.max_ctas is None else choice.max_ctas
        params[_param(key, "ctas")] = _nearest(values.ctas, ctas)
        params[_param(key, "launch")] = _nearest(values.launches, choice.launch)
        params[_param(key, "clock")] = _nearest(values.clock_steps, choice.clock_steps)
    return params


def _nearest(values: Sequence[int], value: int) -> int:
    return value if value in values else min(values, key=lambda v: (abs(v - value), v))


def refine(
    space: Mapping[ChoiceKey, ClassSpace],
    measure: Measure,
    deadline_s: float,
    budget: SearchBudget,
    modelled: SearchResult,
    iteration_time_s: float,
    fixed: Mapping[ChoiceKey, ClassChoice] | None = None,
    seeds: int = 4,
) -> SearchResult:
    """Refine a model-priced search by measurement, within the budget's training time.

    The ``seeds`` least-energy feasible trials of ``modelled`` are measured first, then the sampler explores
    with measured figures until :meth:`SearchBudget.measured_trials` trials have run (each costs
    ``steps_per_trial`` training steps of about ``iteration_time_s``).

    Args:
        space: The classes searched.
        measure: The runtime's measurement callback (returns *measured* figures).
        deadline_s: The iteration-time budget.
        budget: Trials, training time and steps per trial.
        modelled: The model-priced search to start from.
        iteration_time_s: The job's iteration time (to count trials into the training time).
        fixed: Choices of classes outside ``space``.
        seeds: Model trials measured first.

    Returns:
        The best measured trial (its ``measurement.source`` says measured).

    Raises:
        EnergyValueError: If the training-time budget allows no trial.
    """
    trials = budget.measured_trials(iteration_time_s)
    if trials < 1:
        raise EnergyValueError(
            f"{budget.max_training_s:g} s of training allow no measured trial of "
            f"{budget.steps_per_trial} steps at {iteration_time_s:g} s per iteration; "
            "raise max_training_s or lower steps_per_trial"
        )
    feasible = sorted(
        (t for t in modelled.trials if t.measurement.time_s <= deadline_s),
        key=lambda t: t.measurement.energy_j,
    )
    starts = [t.choices for t in feasible[:seeds]] or [modelled.best.choices]
    return search(space, measure, deadline_s, budget, fixed=fixed, seeds=starts, trials=trials)
