"""The band of a plan's modelled saving: the same plan priced again under the spec's declared ranges.

A plan's saving is modelled from one value of every GPU spec figure; the spec declares a range for the ones
it does not pin down (``dvfs.spec_ranges``). :func:`saving_band` prices the plan's target point and its stock
baseline again under variant specs: each ranged figure at its low end and at its high end, one at a time,
then the two corners (every figure at the end that lowered the saving, every one at the end that raised it).
The band is the lowest and the highest saving over those variants and the nominal
(:class:`~megatron_energy.plan_band.SavingBand`); nothing is planned again.

**Pricing under a variant.** The pipeline simulator (``sim.simulator``) runs the plan's instruction clocks
and the stock clocks on the job's DAG with the variant's switch latency (the plan's own latency, scaled as
the spec's value is moved) and the variant's profile:

* a modelled or simulated profile (the model made its figures) is priced by the variant's model: each
  option's time and energy are scaled by the variant's over the nominal model's figure for the instruction's
  work, fitted to its options (``dvfs.model.fit_work_profile``), and the blocked and idle powers by the
  variant's over the nominal spec's;
* a measured profile keeps its figures: only the switch latency is varied (``SavingBand.varied`` says so).

Each variant's prediction is the plan file's plus what the variant changes in the simulator's pricing
(the stock iteration's likewise), so what the simulator does not price, a measured tail, Kareus's collective
choices and the phase clocks' change, is carried at its nominal modelled value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile, fit_work_profile
from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.dvfs.spec_ranges import spec_at
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Step, Work
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.plan import Plan, PlanPoint
from megatron_energy.plan_band import SavingBand, energy_change
from megatron_energy.sim.simulator import Simulator

LATENCY_KEY = "switch_latency_s"
"""The range key the simulator prices; every other key is the time/power model's."""

FIT_POINTS = 12
"""At most this many of an instruction's options, spread over its clocks, fit its work (a full grid of a
modelled profile fits no better than a dozen of its points, at a tenth of the cost)."""


VARIANT_PROFILES_KEPT = 64
"""Variant profiles kept across plans (each plan of a job is priced under the same variants)."""

_VARIANT_PROFILES: dict[tuple[int, str, str], tuple[Profile, Profile]] = {}
"""(profile identity, nominal spec, variant spec) -> (that profile, its variant); the profile is kept with
its variant so that its identity is not reused while the entry lives."""


def with_saving_band(plan: Plan, profile: Profile, job: PlanningJob) -> Plan:
    """``plan`` carrying the band of its saving (:func:`job_saving_band`)."""
    return dataclasses.replace(plan, saving_band=job_saving_band(plan, profile, job))


def job_saving_band(plan: Plan, profile: Profile, job: PlanningJob) -> SavingBand:
    """The band of ``plan``'s saving (:func:`saving_band`) on the job's DAG and GPU spec.

    A plan whose GPU has no spec of its name (a CSV profile without ``--gpu-spec``) gets the band of a spec
    that declares nothing: its saving alone.
    """
    spec = job.gpu
    if spec is None:
        try:
            spec = load_gpu_spec(plan.gpu_name)
        except ValueError:
            spec = None
    return saving_band(plan, job.dag(), profile, spec)


def saving_band(
    plan: Plan, dag: PipelineDag, profile: Profile, spec: GpuSpec | None, against: Plan | None = None
) -> SavingBand:
    """The band of the plan's saving over ``spec``'s ranges (module docstring).

    Args:
        plan: The plan (its target point and stock baseline are priced).
        dag: The job's iteration DAG, as the plan was made on.
        profile: The profile the plan was made from.
        spec: The GPU spec whose ranges are varied; ``None``: none declared.
        against: Another plan of the job whose target point the change is taken against, priced under the
            same variants (``all`` against ``perseus``); the stock baseline when ``None``.

    Returns:
        The band; zero-width, varying nothing, when the spec declares no range the profile responds to.
    """
    nominal = energy_change(_reference_j(plan, against), plan.target_point.energy_j)
    varied = tuple(
        key
        for key in (spec.ranges if spec is not None else ())
        if key == LATENCY_KEY or profile.source != "measured"
    )
    if spec is None or not varied:
        return SavingBand(nominal, nominal, ())
    pricing = _Pricing(plan, against, dag, profile, spec)
    ends = {key: {end: pricing.change({key: end}) for end in spec.ranges[key]} for key in varied}
    lowering = {key: min(by_end, key=by_end.__getitem__) for key, by_end in ends.items()}
    raising = {key: max(by_end, key=by_end.__getitem__) for key, by_end in ends.items()}
    changes = [nominal, *(change for by_end in ends.values() for change in by_end.values())]
    if len(varied) > 1:
        changes += [pricing.change(lowering), pricing.change(raising)]
    return SavingBand(min(changes), max(changes), varied)


class _Pricing:
    """The plan's target point and its reference (stock, or another plan's target), simulated.

    Priced nominal and under variants.
    """

    def __init__(self, plan: Plan, against: Plan | None, dag: PipelineDag, profile: Profile, spec: GpuSpec):
        self.plan, self.dag, self.profile, self.spec = plan, dag, profile, spec
        self.clocks = clocks_the_job_runs(plan.target_point, dag)
        self.reference_clocks = None if against is None else clocks_the_job_runs(against.target_point, dag)
        self.reference_file_j = _reference_j(plan, against)
        self._nominal = Simulator(dag, profile)
        self._works: dict[Work, WorkProfile] | None = None
        self.reference_j, self.planned_j = self._energies(self._nominal, plan.switch_latency_s)

    def change(self, values: Mapping[str, float]) -> float:
        """The plan's saving with the ranged figures at ``values`` (the rest nominal)."""
        variant = spec_at(self.spec, values)
        latency_s = self.plan.switch_latency_s * variant.switch_latency_s / self.spec.switch_latency_s
        model_keys = [key for key in values if key != LATENCY_KEY]
        simulator = Simulator(self.dag, self._profile(variant)) if model_keys else self._nominal
        reference_j, planned_j = self._energies(simulator, latency_s)
        return energy_change(
            self.reference_file_j + reference_j - self.reference_j,
            self.plan.target_point.energy_j + planned_j - self.planned_j,
        )

    def _energies(self, simulator: Simulator, latency_s: float) -> tuple[float, float]:
        """Energy per iteration at the reference's clocks (stock: ``None``) and at the plan's clocks."""
        reference = simulator.run(self.reference_clocks, latency_s).total_energy_j
        return reference, simulator.run(self.clocks, latency_s).total_energy_j

    def _profile(self, variant: GpuSpec) -> Profile:
        """The profile as the variant's model would have made it (module docstring), kept for other plans."""
        key = (id(self.profile), repr(self.spec), repr(variant))
        kept = _VARIANT_PROFILES.get(key)
        if kept is None or kept[0] is not self.profile:
            if len(_VARIANT_PROFILES) >= VARIANT_PROFILES_KEPT:
                del _VARIANT_PROFILES[next(iter(_VARIANT_PROFILES))]
            kept = _VARIANT_PROFILES[key] = (self.profile, self._variant_profile(variant))
        return kept[1]

    def _variant_profile(self, variant: GpuSpec) -> Profile:
        """The profile as the variant's model would have made it."""
        nominal, model = GpuPowerModel(self.spec), GpuPowerModel(variant)
        if self._works is None:
            self._works = {key: self._fitted(key) for key in self.profile}
        options = {
            key: [_rescaled(option, work, nominal, model) for option in self.profile.options(key)]
            for key, work in self._works.items()
        }
        profile = self.profile
        return Profile(
            options,
            profile.gpu_name,
            profile.source,
            profile.blocked_power_w * variant.blocked_power_w / self.spec.blocked_power_w,
            profile.idle_power_w * variant.idle_power_w / self.spec.idle_power_w,
        )

    def _fitted(self, key: Work) -> WorkProfile:
        """The instruction's work, fitted to at most :data:`FIT_POINTS` of its options."""
        options = sorted(self.profile.options(key), key=lambda option: option.clock_mhz)
        stride = -(-len(options) // FIT_POINTS)
        points = [(o.clock_mhz, o.time_s, o.energy_j) for o in options[::stride]]
        return fit_work_profile(self.spec, points).work


def _reference_j(plan: Plan, against: Plan | None) -> float:
    """The plan file's energy the change is taken against: stock, or the other plan's target point."""
    return plan.baseline.energy_j if against is None else against.target_point.energy_j


def clocks_the_job_runs(point: PlanPoint, dag: PipelineDag) -> dict[Step, int]:
    """The instruction-level clock of every step of every rank at ``point`` that ``dag`` runs.

    A clock for a step the job never runs is left out (it prices as nothing, and the memory lever leaves it
    as it is): whether a plan fits the job is the runtime's check on adopting it (``PlanRunner``), which
    names the step; pricing does not pre-empt it.
    """
    return {
        step: clock
        for stage in range(len(point.ranks))
        for step, clock in point.step_clocks(stage).items()
        if step in dag.index
    }


def _rescaled(
    option: ClockOption, work: WorkProfile, nominal: GpuPowerModel, model: GpuPowerModel
) -> ClockOption:
    """``option`` with its time and energy scaled by ``model``'s over ``nominal``'s figure for ``work``."""
    clock = option.clock_mhz
    return ClockOption(
        clock,
        option.time_s * model.time_s(work, clock) / nominal.time_s(work, clock),
        option.energy_j * model.energy_j(work, clock) / nominal.energy_j(work, clock),
    )
