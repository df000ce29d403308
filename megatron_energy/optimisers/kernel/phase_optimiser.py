"""The ``kernel`` optimiser: clocks per phase inside instructions and in the iteration tail.

It refines a base plan (the previous optimiser's in ``--energy-mode all``; alone, every instruction at its
fastest clock): each plan point keeps its iteration time, deadline and instruction-level clock actions, and
gains phase actions. Per instruction class and base clock, the instruction's work (fitted to its profile
rows, :func:`~megatron_energy.dvfs.model.fit_work_profile`, priced with its kernel classes: its measured
timeline's compute classes where one was recorded, else the workload model's, ``PlanningJob.compute_mixes``)
is split into phases (measured timelines when the job carries them, each phase with its own kernels' classes,
else the *modelled* per-class split of :mod:`.modelled`), planned within its time at
the base clock (:mod:`.planner`), and written as ``ClockAction`` s at phase boundaries named by
:mod:`.labels`. The iteration tail (gradient sync, optimizer step, parameter all-gather:
measured by the profiling steps' outside-phase hooks, or a job description's modelled tail) gets its own
phase clocks within its time at the fastest clock, requested at those hooks; its energy change is counted
against the tail running at the last instruction's clock, as it does without phase actions (the simulator's
own convention charges a modelled tail at idle power, which no clock changes). Each rank's predicted energy
changes by what its phases save under the model (finishing early is charged at the blocked power until the
base plan's end of the instruction); a sequence whose phases would not save energy once its switches are
priced keeps the base clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from megatron_energy.dvfs.kernel_classes import ClassMix
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile, fit_work_profile
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.interface import PlanningJob, ProfileRequest
from megatron_energy.optimisers.kernel.sequence_plan import SequencePlan, plan_sequence
from megatron_energy.optimisers.kernel.stock import stock_plan
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.modelled_phases import coalesce, modelled_phases, tail_phases
from megatron_energy.pipeline.phase_labels import OutsideHook, PhaseLabel, PhaseProvenance
from megatron_energy.pipeline.phase_timeline import Phase, PhaseClass
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Action, Boundary, ClockAction, Plan, PlanPoint, RankPlan


@dataclasses.dataclass(frozen=True)
class _Refined:
    """One instruction's phase actions and its energy change (modelled)."""

    actions: tuple[ClockAction, ...]
    delta_j: float


class PhaseOptimiser:
    """Clocks per phase of kernels (see the module docstring)."""

    name = "kernel"
    request = ProfileRequest(clock_grid=True, phases=True)

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        """Refine ``base`` (stock clocks when ``None``) with phase clocks.

        Returns:
            The plan with the same points, phase actions added and predicted energies updated.
        """
        if base is None:
            base = stock_plan(profile, job)
        spec = load_gpu_spec(profile.gpu_name)
        context = _Context(GpuPowerModel(spec), profile, job)
        points = tuple(context.refine(point) for point in base.points)
        return dataclasses.replace(base, optimisers=(*base.optimisers, self.name), points=points)


class _Context:
    """What refining the points of one plan shares: the model, the fitted work, the planned sequences."""

    def __init__(self, model: GpuPowerModel, profile: Profile, job: PlanningJob):
        self.model = model
        self.profile = profile
        self.job = job
        self.clocks = sorted({option.clock_mhz for key in profile for option in profile.options(key)})
        self.measured_inside = bool(job.phase_timelines)
        self._works = {key: self._fit(key) for key in profile}
        self._plans: dict[tuple[Work, int], tuple[SequencePlan, float]] = {}

    def _fit(self, key: Work) -> WorkProfile:
        points = [(o.clock_mhz, o.time_s, o.energy_j) for o in self.profile.options(key)]
        return fit_work_profile(self.model.spec, points, self.compute_mix(key)).work

    def compute_mix(self, key: Work) -> ClassMix | None:
        """The kernel classes of the instruction class's compute time.

        Its measured timeline's where one was recorded, else the workload model's; ``None``: neither knows
        them (bf16 GEMMs).
        """
        timelines = self.job.phase_timelines
        if timelines and key in timelines:
            recorded = sum((work for _, work in timelines[key]), WorkProfile(0.0, 0.0))
            if recorded.compute_s > 0 and recorded.compute_mix is not None:
                return recorded.compute_mix
        return (self.job.compute_mixes or {}).get(key)

    def phases_of(self, key: Work) -> list[Phase]:
        """The instruction class's phases: measured when the job has them, else modelled.

        Measured phases keep their shares of the kernel timeline, scaled to the instruction's profiled time
        at the fastest clock (a timeline leaves out what ran between its kernels at its ends).
        """
        timelines = self.job.phase_timelines
        work = self._works[key]
        if timelines and key in timelines:
            phases = coalesce([Phase(_kind(kind), 0.0, phase) for kind, phase in timelines[key]])
            total_s = sum(phase.duration_s for phase in phases)
            target_s = self.model.time_s(work, max(self.clocks))
            scale = target_s / total_s if total_s > 0 else 1.0
            return coalesce([Phase(p.kind, 0.0, p.work.scaled(scale), p.kernels) for p in phases])
        return modelled_phases(work, self.job.layers_per_chunk or 1, self.job.layer_pattern)

    def refine(self, point: PlanPoint) -> PlanPoint:
        """``point`` with phase actions after each instruction's clock action and in the tail."""
        ranks = []
        for rank in point.ranks:
            actions: list[Action] = []
            delta_j = 0.0
            clocks = [a for a in rank.actions if isinstance(a, ClockAction) and a.at.phase is None]
            for action in rank.actions:
                actions.append(action)
                if isinstance(action, ClockAction) and action.at.phase is None:
                    refined = self.instruction(action.at.instruction, action.clock_mhz)
                    actions.extend(refined.actions)
                    delta_j += refined.delta_j
            tail = self.tail(clocks)
            actions.extend(tail.actions)
            delta_j += tail.delta_j
            ranks.append(RankPlan(tuple(actions), rank.energy_j + delta_j, rank.busy_s))
        return dataclasses.replace(point, ranks=tuple(ranks))

    def instruction(self, instruction: Instruction, base_mhz: int) -> _Refined:
        """The phase actions of one instruction at its base clock (the plan shared by equal instructions)."""
        key = (instruction.work, base_mhz)
        planned = self._plans.get(key)
        if planned is None:
            work = self._works[instruction.work]
            budget_s = self.model.time_s(work, base_mhz)  # the instruction-level plan's time
            phases = self.phases_of(instruction.work)
            # the reference is the same phases at the base clock: a measured split prices the instruction
            # otherwise than its fitted work does, and that difference is no saving of the phase clocks
            base_s = sum(self.model.time_s(phase.work, base_mhz) for phase in phases)
            base_j = sum(self.model.energy_j(phase.work, base_mhz) for phase in phases)
            base_j += self.profile.blocked_power_w * max(0.0, budget_s - base_s)
            plan = plan_sequence(
                self.model,
                phases,
                budget_s,
                self.clocks,
                base_mhz,
                self.job.switch_latency_s,
                base_mhz=base_mhz,
                outgoing_mhz=base_mhz,
            )
            delta_j = (
                plan.energy_j + self.profile.blocked_power_w * max(0.0, budget_s - plan.planned_s) - base_j
            )
            planned = self._plans[key] = (plan, delta_j)
        plan, delta_j = planned
        return _kept_if_better(self._actions(instruction, plan, "p"), delta_j)

    def tail(self, clocks: Sequence[ClockAction]) -> _Refined:
        """The tail's phase actions after the rank's last instruction (none without tail phases).

        The tail's phases are the outside phases the profiling measured (``PlanningJob.tail_phases``), else a
        modelled tail's gradient sync and optimizer step; a measured tail without them has none. Their
        requests go out at the outside phases' hooks (``hooked``), each label naming its hook: a phase's
        start (``OutsideHook("optimizer")``) or, for the restoring request, the tail's end (``at_end``).
        """
        durations = self._tail_durations()
        if not clocks or not durations:
            return _Refined((), 0.0)
        phases, hooks = tail_phases(durations)
        last, first = clocks[-1], clocks[0]
        budget_s = sum(self.model.time_s(phase.work, max(self.clocks)) for phase in phases)
        unplanned_j = sum(self.model.energy_j(phase.work, last.clock_mhz) for phase in phases)
        plan = plan_sequence(
            self.model,
            phases,
            budget_s,
            self.clocks,
            last.clock_mhz,
            self.job.switch_latency_s,
            outgoing_mhz=first.clock_mhz,
            hooked=True,
            gap_after_s=self._gap_after_tail(durations),
        )
        delta_j = (
            plan.energy_j + self.profile.blocked_power_w * max(0.0, budget_s - plan.planned_s) - unplanned_j
        )
        hook_at = {phase.start_s: hook for phase, hook in zip(phases, hooks, strict=True)}
        names = [OutsideHook(hook_at[phase.start_s]) for phase in plan.phases]
        names.append(OutsideHook(_last_to_end(durations), at_end=True))
        return _kept_if_better(self._actions(last.at.instruction, plan, "tail", names), delta_j)

    def _provenance(self, scope: str) -> PhaseProvenance:
        """``measured`` when the scope's phase durations were measured (timelines, hooks), else modelled."""
        measured = bool(self.job.tail_phases) if scope == "tail" else self.measured_inside
        return "measured" if measured else "modelled"

    def _gap_after_tail(self, durations: Sequence[tuple[str, float]]) -> float:
        """The measured iteration tail's time outside its hooked phases (host work: the GPU idles)."""
        tail = self.job.tail
        if tail is None or not tail.is_measured:
            return 0.0
        return max(0.0, tail.outside_s - sum(seconds for _, seconds in durations))

    def _tail_durations(self) -> tuple[tuple[str, float], ...]:
        """The tail's outside phases and their durations: measured, else a modelled tail's, else none."""
        if self.job.tail_phases:
            return tuple(self.job.tail_phases)
        tail = self.job.tail
        if tail is None or tail.is_measured:
            return ()
        return (("grad-sync", tail.dp_sync_s), ("optimizer", tail.optimizer_s))

    def _actions(
        self,
        instruction: Instruction,
        plan: SequencePlan,
        scope: Literal["p", "tail"],
        hooks: Sequence[OutsideHook] = (),
    ) -> tuple[ClockAction, ...]:
        """A clock action per request of ``plan``, named by its phase label (and hook, when hooked)."""
        actions = []
        for request in plan.requests:
            restore = request.phase >= len(plan.phases)
            label = PhaseLabel(
                ("p-restore" if scope == "p" else "tail-restore") if restore else scope,
                request.phase,
                "restore" if restore else plan.phases[request.phase].kind,
                self._provenance(scope),
                request.planned_start_s,
                request.lead_s,
                None if request.hook is None else hooks[request.hook],
            )
            actions.append(ClockAction(Boundary(instruction, label), request.clock_mhz))
        return tuple(actions)


def _kept_if_better(actions: tuple[ClockAction, ...], delta_j: float) -> _Refined:
    """The phase actions when they save energy; none (the base plan's clock throughout) when they do not.

    The allocation prices phases without the cost of switching between them, which the latency-aware
    energy includes; a sequence whose switches cost more than its phases save keeps the base clock.
    """
    return _Refined(actions, delta_j) if actions and delta_j < 0 else _Refined((), 0.0)


def _last_to_end(durations: Sequence[tuple[str, float]]) -> str:
    """The outside phase ending the tail: the optimizer step (it nests the all-gather), else the last."""
    names = [name for name, _ in durations]
    return "optimizer" if "optimizer" in names else names[-1]


def _kind(name: str) -> PhaseClass:
    """A measured phase's class name as a :data:`PhaseClass` (unknown names are ``mixed``)."""
    return name if name in ("compute", "memory", "communication") else "mixed"  # type: ignore[return-value]
