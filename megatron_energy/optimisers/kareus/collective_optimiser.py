"""The Kareus-style optimiser: launch point and CTA budget of every collective class, jointly with the clock.

``--energy-mode kareus`` plans at stock clocks (every instruction at its fastest profiled clock);
``--energy-mode all`` runs it after Perseus and refines each Perseus point: the point's clocks stay, shifted
only for the instructions a class overlaps (``kareus.choices``), and the collective actions are added.

For the target point it searches (``kareus.search``), stage by stage, the choices of every collective class
of the stage (:func:`class_space`) for the least *modelled* energy (``sim.overlap``) whose iteration is no
slower than the deadline: the base point's deadline, or (alone) the stock iteration under megatron-core's
default collective schedule, as the target allows it (``EnergyTarget.deadline_s``; a ``power`` budget needs
the clock frontier, so Kareus alone refuses one). Where the base point's own
choices (megatron-core's defaults) already miss its deadline under the overlap model (a model that prices
collectives the clock planner's DAG does not), the deadline is that default iteration's time, so a Kareus
point is never slower than its base point as this model prices both. The other points get the target's
choices where these keep them within their deadlines, megatron-core's defaults otherwise. (With a live job's
levers, "megatron-core's defaults" means the job's own flags and communicator budgets:
``pipeline.collective_levers``.)

Composed (``all``), Kareus is given the Perseus clocks and moves them jointly with the collectives (the clock
offsets of the instructions a class overlaps), and, as a joint pass, also searches from stock clocks, where
its own joint move of every rank's clocks applies (overlap on every rank shortens the pipeline, then every
rank's clock comes down: :meth:`KareusOptimiser._global_start`); the target point takes whichever the
overlap model prices lower within the deadline (:meth:`KareusOptimiser.joint`).

Each point's prediction (rank energies, busy times, iteration time) is latency-aware, as every plan's is
(``kareus.pricing``): its clocks simulated under the switch latency, plus what its collective choices change
under the overlap model. A point that does not predict less energy than its base point (alone: stock clocks
with megatron-core's defaults) within the base point's deadline is the base point, unchanged; so a Kareus
point never predicts more energy, nor a slower iteration than its deadline allows, than the point it refines.
Its relaxed lower bound is the base point's where that is lower, else the point's own energy (the clock
planner's relaxation does not cover collectives).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.errors import EnergyValueError
from megatron_energy.optimisers.interface import PlanningJob, ProfileRequest
from megatron_energy.optimisers.kareus.choices import ChoiceKey, ClassChoice, KareusModel, default_choice
from megatron_energy.optimisers.kareus.pricing import PricedPoint, price_point
from megatron_energy.optimisers.kareus.search import (
    CTA_DEFAULT,
    ClassSpace,
    Measurement,
    SearchBudget,
    search,
)
from megatron_energy.optimisers.kareus.search_cache import SearchCache
from megatron_energy.pipeline.collective_names import AFTER_OPTIMIZER, END, LaunchPoint
from megatron_energy.pipeline.collectives import CollectiveWorkload, build_collectives
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import (
    Action,
    Baseline,
    Boundary,
    BoundaryPhase,
    ClockAction,
    CollectiveAction,
    Plan,
    PlanPoint,
    RankPlan,
)
from megatron_energy.sim.simulator import Simulator


def class_space(key: str, workload: CollectiveWorkload) -> ClassSpace:
    """The values the search gives one class (module docstring of ``kareus.choices`` for their meaning).

    A live job's levers (``workload.levers``, ``pipeline.collective_levers``) narrow it to what the running
    job can honour.
    """
    levers = workload.levers
    group = key.split(".", 1)[0]
    if key in ("dp.reduce_scatter", "dp.all_reduce"):
        launches = (-1, 0, 1, 2) if levers is None or levers.overlap_grad_reduce else (-1,)
        return ClassSpace(ctas=(CTA_DEFAULT, 2, 4, 8, 16, 32), launches=launches, clock_steps=(-2, -1, 0, 1))
    if levers is not None and (key == "dp.all_gather" or group in ("pp", "tp", "ep")):
        fixed = default_choice(key, levers)
        clocks = _tp_clock_steps(key) if group == "tp" else (0,)
        ctas = CTA_DEFAULT if fixed.max_ctas is None else fixed.max_ctas
        return ClassSpace(ctas=(ctas,), launches=(fixed.launch,), clock_steps=clocks)
    if key == "dp.all_gather":
        return ClassSpace(ctas=(CTA_DEFAULT, 2, 4, 8, 16), launches=(0, 1))
    if key == "pp.send_recv":
        return ClassSpace(ctas=(CTA_DEFAULT, 1, 2, 4, 8))
    if key == "ep.all_to_all":  # inside every MoE layer, where megatron-core issues it: a budget only
        return ClassSpace(ctas=(CTA_DEFAULT, 4, 8, 16, 32))
    overlaps = (0, 1) if workload.sequence_parallel else (0,)
    return ClassSpace(ctas=(CTA_DEFAULT, 4, 8, 16, 32), launches=overlaps, clock_steps=_tp_clock_steps(key))


def _tp_clock_steps(key: str) -> tuple[int, ...]:
    """Clock offsets of a tensor-parallel class (every instruction of the rank runs its collectives)."""
    return (-4, -3, -2, -1, 0, 1) if key in ("tp.all_gather", "tp.all_reduce") else (0,)


@dataclass
class KareusOptimiser:
    """Collective launch points and CTA budgets jointly with the clock (module docstring)."""

    budget: SearchBudget = field(default_factory=lambda: SearchBudget(trials=24))
    """Model-priced trials per stage, seed and sampler."""

    cache_dir: Path | None = None
    """Where search results are cached by fingerprint; no cache when ``None``."""

    _chosen: dict[tuple[str, int], tuple[object, dict[ChoiceKey, ClassChoice]]] = field(
        default_factory=dict, init=False, repr=False
    )
    """Searches this optimiser ran, by their inputs (:meth:`choose`'s key) and the profile's identity (kept
    beside the result, so the identity stays its own): ``all`` and Kareus alone ask for the same search on
    stock clocks where their deadlines agree, and it runs once."""

    name = "kareus"
    request = ProfileRequest(clock_grid=True, collectives=True)

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        """Plan the collectives of ``job`` (alone at stock clocks, or refining ``base``).

        Without the job's collective workload, or where no point of a composition's ``base`` is improved,
        ``base`` is returned as it is (its ``optimisers`` then do not name ``kareus``: nothing of the plan
        came from it), so ``all`` keeps working where the runtime does not yet describe the collectives.

        Raises:
            EnergyValueError: If the job carries no collective workload and there is no base plan, or the GPU
                spec cannot be found.
        """
        if job.collectives is None and base is not None:
            return base  # nothing to schedule: the plan names base's optimisers only
        workload = _workload(job)
        spec = _spec(job, profile)
        dag = job.dag()
        model = KareusModel(
            dag, profile, spec, build_collectives(workload), workload.layers_per_chunk, workload.levers
        )
        defaults = model.choices_default()
        stock = model.evaluate(None, defaults)
        simulator = Simulator(dag, profile, switch_latency_s=job.switch_latency_s)
        stock_priced = price_point(model, simulator, None, defaults)
        if base is None:
            base_clocks: list[Mapping[Instruction, int] | None] = [None]
            deadlines = [job.target.deadline_s(stock.iteration_time_s)]
            lower_bounds = [math.inf]
            labels = [str(job.target)]
            target_index = 0
            point_deadlines = [job.target.deadline_s(stock_priced.iteration_time_s)]  # inf: min-energy
            references = [_point(model, labels[0], defaults, stock_priced, point_deadlines[0], math.inf)]
        else:
            base_clocks = [_clocks(point) for point in base.points]
            deadlines = [point.deadline_s for point in base.points]
            lower_bounds = [point.lower_bound_j for point in base.points]
            labels = [point.label for point in base.points]
            target_index = base.target_index
            references = list(base.points)
            point_deadlines = deadlines
        # how long each point may take: its deadline, which a min-energy target alone does not bound
        limits = [
            max(deadline, reference.iteration_time_s)
            for deadline, reference in zip(point_deadlines, references, strict=True)
        ]
        target_default = model.evaluate(base_clocks[target_index], defaults)
        deadline = max(deadlines[target_index], target_default.iteration_time_s)
        start, best = self.joint(model, workload, base_clocks[target_index], deadline, job.fingerprint)
        base_clocks[target_index] = start
        points = []
        improved = False
        for index, clocks in enumerate(base_clocks):
            reference = references[index]
            priced = price_point(model, simulator, clocks, best)
            limit_s = limits[index]
            if priced.iteration_time_s <= limit_s * (1 + 1e-9) and priced.energy_j < reference.energy_j:
                points.append(
                    _point(model, labels[index], best, priced, point_deadlines[index], lower_bounds[index])
                )
                improved = True
            else:  # nothing beat the base point (or stock clocks): it stays, with the default collectives
                points.append(_with_default_collectives(model, reference, defaults))
        if base is not None and not improved:
            return base  # no point of base improved: the plan is base's, and does not name kareus
        baseline = _baseline(stock_priced)  # this model's stock iteration, which its points are set against
        return job.new_plan(
            profile,
            optimisers=(*(base.optimisers if base is not None else ()), self.name),
            baseline=baseline,
            points=points,
            target_index=target_index,
            frontier=base.frontier if base is not None else (),
            measured_tail=base.measured_tail if base is not None else None,
        )

    def joint(
        self,
        model: KareusModel,
        workload: CollectiveWorkload,
        clocks: Mapping[Instruction, int] | None,
        deadline_s: float,
        fingerprint: str,
    ) -> tuple[Mapping[Instruction, int] | None, dict[ChoiceKey, ClassChoice]]:
        """The clocks to start from and the collective choices, jointly, within the deadline.

        Given a base plan's clocks (``all``: Perseus's), the choices on them (:meth:`choose`) and, as a joint
        pass, the choices on stock clocks, which move every rank's clocks with the collectives themselves
        (the clock offsets and :meth:`_global_start`'s joint move): whichever the model prices lower within
        the deadline. Alone (``clocks`` is ``None``), the choices on stock clocks.

        Returns:
            ``(clocks, choices)``: the base clocks or ``None`` (stock), and the choices on them.
        """
        best = self.choose(model, workload, clocks, deadline_s, fingerprint)
        if clocks is None:
            return None, best
        own = self.choose(model, workload, None, deadline_s, fingerprint)
        refined, joint = model.evaluate(clocks, best), model.evaluate(None, own)
        fits = joint.iteration_time_s <= deadline_s * (1 + 1e-9)
        if fits and joint.total_energy_j < refined.total_energy_j:
            return None, own
        return clocks, best

    def choose(
        self,
        model: KareusModel,
        workload: CollectiveWorkload,
        clocks: Mapping[Instruction, int] | None,
        deadline_s: float,
        fingerprint: str,
    ) -> dict[ChoiceKey, ClassChoice]:
        """Stage by stage, the least-energy choices within the deadline (cached by fingerprint).

        Args:
            model: The job's Kareus model.
            workload: Its collective workload (for the search space).
            clocks: The base clocks (fastest where absent).
            deadline_s: The iteration-time budget.
            fingerprint: The job fingerprint (the cache key, with the other inputs).

        Returns:
            The choice of every class of every rank (megatron-core's defaults where nothing better fits).
        """
        cache = SearchCache(self.cache_dir) if self.cache_dir is not None else None
        key = {
            "fingerprint": fingerprint,
            "deadline_s": deadline_s,
            "clocks": sorted((list(i), c) for i, c in (clocks or {}).items()),
            "budget": [self.budget.trials, self.budget.seed, self.budget.sampler],
        }
        ran = (repr(key), id(model.profile))
        if ran in self._chosen:
            return dict(self._chosen[ran][1])
        if cache is not None:
            hit = cache.load(fingerprint, key)
            if hit is not None:
                return hit
        priced: dict[tuple[tuple[ChoiceKey, ClassChoice], ...], Measurement] = {}

        def measure(choices: Mapping[ChoiceKey, ClassChoice]) -> Measurement:
            trial = tuple(sorted(choices.items()))  # a trial the sampler repeats is priced once
            if trial not in priced:
                result = model.evaluate(clocks, choices)
                priced[trial] = Measurement(result.iteration_time_s, result.total_energy_j, "modelled")
            return priced[trial]

        best = self._global_start(model, workload, measure, deadline_s)
        for stage in sorted(model.class_keys):
            space = {(stage, k): class_space(k, workload) for k in model.class_keys[stage]}
            if all(values.size == 1 for values in space.values()):
                continue  # the job leaves this stage nothing to choose (a live job's levers)
            seeds = [best, *(_overlap_seed(best, space, ctas) for ctas in (4, 8, 16))]
            found = search(space, measure, deadline_s, self.budget, fixed=best, seeds=seeds)
            if found.feasible:
                best = dict(found.best.choices)
        if cache is not None:
            cache.store(fingerprint, key, best)
        self._chosen[ran] = (model.profile, dict(best))
        return best

    @staticmethod
    def _global_start(
        model: KareusModel,
        workload: CollectiveWorkload,
        measure: Callable[[Mapping[ChoiceKey, ClassChoice]], Measurement],
        deadline_s: float,
    ) -> dict[ChoiceKey, ClassChoice]:
        """The start of the stage-by-stage search: the defaults, or a joint move of every rank.

        A joint move (:func:`_joint`) is taken when it fits the deadline with less energy: one stage at a time
        cannot find it (overlap on every rank shortens the pipeline, and only then can every rank's clock come
        down).
        """
        best = model.choices_default()
        best_j = measure(best).energy_j
        for ctas in (4, 8):
            for steps in (0, -1, -2, -3, -4):
                candidate = _joint(model, workload, ctas, steps)
                priced = measure(candidate)
                if priced.time_s <= deadline_s * (1 + 1e-9) and priced.energy_j < best_j:
                    best, best_j = candidate, priced.energy_j
        return best


def _joint(
    model: KareusModel, workload: CollectiveWorkload, ctas: int, clock_steps: int
) -> dict[ChoiceKey, ClassChoice]:
    """Every rank alike: collectives overlapped with ``ctas`` CTAs, overlapped work ``clock_steps`` away."""
    choices = model.choices_default()
    for stage, keys in model.class_keys.items():
        for key in keys:
            space = class_space(key, workload)
            launch = max(space.launches) if key == "dp.all_gather" or key.startswith("tp.") else 0
            steps = clock_steps if clock_steps in space.clock_steps else 0
            allowed = ctas if ctas in space.ctas else space.ctas[0]
            budget = None if allowed == CTA_DEFAULT else allowed
            choices[(stage, key)] = ClassChoice(
                budget, launch if launch in space.launches else space.launches[0], steps
            )
    return choices


def _overlap_seed(
    best: Mapping[ChoiceKey, ClassChoice], space: Mapping[ChoiceKey, ClassSpace], ctas: int
) -> dict[ChoiceKey, ClassChoice]:
    """A model-derived seed: every class of the stage overlapped as early as allowed with ``ctas`` CTAs."""
    seed = dict(best)
    for key, values in space.items():
        launch = max(values.launches) if key[1] in ("dp.all_gather",) or key[1].startswith("tp.") else 0
        seed[key] = ClassChoice(ctas, launch, 0)
    return seed


def _workload(job: PlanningJob) -> CollectiveWorkload:
    if job.collectives is None:
        raise EnergyValueError(
            "--energy-mode kareus/all needs the job's collective workload (model shape, parallelism, links): "
            "this planning job carries none. The launcher's session reads it from Megatron's arguments (a "
            "job context built without them has none); offline, megatron-energy simulate --config JOB "
            "--compare plans it from a job description; or use --energy-mode perseus"
        )
    return job.collectives


def _spec(job: PlanningJob, profile: Profile) -> GpuSpec:
    if job.gpu is not None:
        return job.gpu
    try:
        return load_gpu_spec(profile.gpu_name)
    except ValueError as error:
        raise EnergyValueError(
            f"the collective scheduler needs the GPU spec of {profile.gpu_name!r} (SMs, interconnect): "
            f"{error}"
        ) from None


def _clocks(point: PlanPoint) -> dict[Instruction, int]:
    return {i: c for stage in range(len(point.ranks)) for i, c in point.clock_table(stage).items()}


def _baseline(stock: PricedPoint) -> Baseline:
    return Baseline(stock.iteration_time_s, stock.energy_j, stock.stage_energy_j)


def _point(
    model: KareusModel,
    label: str,
    choices: Mapping[ChoiceKey, ClassChoice],
    priced: PricedPoint,
    deadline_s: float,
    lower_bound_j: float,
) -> PlanPoint:
    ranks = [
        RankPlan(
            actions=_ordered(model, stage, priced.clocks, model.actions(stage, choices)),
            energy_j=energy_j,
            busy_s=busy_s,
        )
        for stage, (energy_j, busy_s) in enumerate(
            zip(priced.stage_energy_j, priced.stage_busy_s, strict=True)
        )
    ]
    return PlanPoint(
        label=label,
        iteration_time_s=priced.iteration_time_s,
        deadline_s=deadline_s if math.isfinite(deadline_s) else priced.iteration_time_s,
        lower_bound_j=min(lower_bound_j, priced.energy_j),
        ranks=tuple(ranks),
    )


def _with_default_collectives(
    model: KareusModel, point: PlanPoint, defaults: Mapping[ChoiceKey, ClassChoice]
) -> PlanPoint:
    """``point`` with megatron-core's default collective actions, so the plan names the job's collectives.

    Its figures stay: the defaults change nothing. A point with other than instruction clocks stays as it is.
    """
    if not all(isinstance(a, ClockAction) and a.at.phase is None for r in point.ranks for a in r.actions):
        return point
    ranks = tuple(
        dataclasses.replace(
            rank,
            actions=_ordered(model, stage, point.clock_table(stage), model.actions(stage, defaults)),
        )
        for stage, rank in enumerate(point.ranks)
    )
    return dataclasses.replace(point, ranks=ranks)


def _ordered(
    model: KareusModel, stage: int, clocks: Mapping[Instruction, int], collectives: list[CollectiveAction]
) -> tuple[Action, ...]:
    """Clock and collective actions of a rank in execution order (a clock before launches at its start)."""
    order = model.dag.stage_order(stage)
    position = {instruction: i for i, instruction in enumerate(order)}
    keyed: list[tuple[tuple[int, int, int], Action]] = [
        ((position[i], 0, 0), ClockAction(Boundary(i), clocks[i])) for i in order
    ]
    for action in collectives:
        phase = action.at.phase
        layer = -1 if phase is None else (10**6 if phase in (END, AFTER_OPTIMIZER) else _layer(phase))
        rank = 2 if phase == AFTER_OPTIMIZER else 1
        keyed.append(((position[action.at.instruction], rank, layer), action))
    keyed.sort(key=lambda item: item[0])
    return tuple(action for _, action in keyed)


def _layer(phase: BoundaryPhase) -> int:
    """The layer a launch point starts (0 for a point without one, e.g. ``gemm_overlap``)."""
    return phase.layer if isinstance(phase, LaunchPoint) and phase.layer is not None else 0
