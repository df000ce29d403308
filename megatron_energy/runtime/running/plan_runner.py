"""Applies one rank's actions of a :class:`~megatron_energy.plan.Plan` at the schedule's hook events.

The runner indexes the actions of one point of the plan for this rank: the clock to lock at an
instruction's start (or at a phase inside it) and the launch point and SM budget of a collective. It can
switch to another point of the same plan (a straggler's pace) without re-planning. It knows nothing of
how a plan was made, so every optimiser's plan runs through it.

Phase actions (``Boundary(instruction, PhaseLabel(...))``, ``pipeline.phase_labels``) run in two ways:

- **outside instructions** (the iteration tail): a label naming a hook (``OutsideHook("optimizer")``) is
  requested when that outside phase begins (``events.OUTSIDE_PHASES``: megatron-core's ``all-grads-sync``,
  ``optimizer`` and ``params-all-gather`` timers on the launcher path), in plan order; the planner already
  moved each request to a hook early enough for the switch latency
  (``kernel.switch_times.snap_to_phase_starts``). The restoring request (its hook ``at_end``) goes out when
  the optimizer step ends: no hook lies inside it, so the restored clock lands up to one switch latency into
  the next iteration (its first instruction may start at the tail's clock for that long);
- **inside instructions** (scope ``p``, e.g. phase 3, memory-bound, modelled, at 1.234 ms with a 10 ms
  lead, and ``p-restore`` back to the instruction's clock before its end): no host hook marks a phase (a
  module pre-hook fires when kernels are *launched*, backward phases run under autograd), so they are
  *time-anchored*:
  :meth:`PlanRunner.inside_requests` gives each instruction's requests as offsets ``at - lead`` from the
  instruction's start on the GPU, in plan order, and the session hands them with the instruction's start
  marker to a phase switcher (``runtime.running.phase_switcher``: a host thread that waits for the
  instruction's start event, then sleeps to each offset, so a request goes out up to a few ms late (sleep,
  GIL) and then takes the NVML call's time; ``runtime.running.simulated_phases``: the simulated GPU's virtual
  clock). The offsets are as the plan has them: phase starts planned from a *modelled* per-class split or a
  *measured* kernel timeline (the label says which), at the planned clocks, not observed at run time.

:meth:`PlanRunner.hook_report` says where the running point's phase actions go (the session logs it).
"""

from __future__ import annotations

from typing import NamedTuple

from megatron_energy.pipeline.collective_names import CollectiveName
from megatron_energy.pipeline.instruction import Step
from megatron_energy.pipeline.phase_labels import OutsideHook, PhaseLabel
from megatron_energy.plan import (
    Boundary,
    BoundaryPhase,
    ClockAction,
    CollectiveAction,
    Plan,
    PlanError,
    PlanPoint,
    step_boundary,
)


class InsideRequest(NamedTuple):
    """A clock to request inside an instruction, at an offset from its start on the GPU."""

    offset_s: float
    """When to request it: the phase's planned start less its lead (never before the instruction starts)."""
    clock_mhz: int
    """The phase's clock."""


class PlanRunner:
    """One rank's view of a plan.

    Args:
        plan: The plan every rank runs.
        stage: This rank's pipeline stage.
        order: This rank's executed instruction order; every action must name one of its instructions.

    Raises:
        PlanError: The plan does not cover this rank, or names an instruction this rank does not run.
    """

    def __init__(self, plan: Plan, stage: int, order: tuple[Step, ...]) -> None:
        if not 0 <= stage < plan.num_stages:
            raise PlanError(f"the plan covers pipeline ranks 0..{plan.num_stages - 1}, not rank {stage}")
        executed = set(order)
        for point in plan.points:
            for action in point.ranks[stage].actions:
                if action.at.step not in executed:
                    raise PlanError(
                        f"the plan has an action at {action.at.step}, "
                        f"which rank {stage} does not run: it "
                        "was made for another schedule (stages, microbatches, virtual pipeline size or group "
                        "size); rerun planning"
                    )
        self.plan = plan
        self.stage = stage
        self.order = order
        self.index = plan.target_index
        self._clocks: dict[Boundary, int] = {}
        self._outside: dict[OutsideHook, tuple[int, ...]] = {}
        self._inside: dict[Step, tuple[InsideRequest, ...]] = {}
        self._inside_provenance: set[str] = set()
        self._unhooked = 0
        self._collectives: dict[CollectiveName, CollectiveAction] = {}
        self.select(plan.target_index)

    def select(self, index: int) -> None:
        """Run the plan's point ``index`` from now on."""
        actions = self.plan.points[index].ranks[self.stage].actions
        self.index = index
        clocks = [action for action in actions if isinstance(action, ClockAction)]
        self._clocks = {action.at: action.clock_mhz for action in clocks}
        outside: dict[OutsideHook, list[int]] = {}
        inside: dict[Step, list[InsideRequest]] = {}
        self._inside_provenance = set()
        self._unhooked = 0
        for action in clocks:
            label = action.at.phase
            if label is None:
                continue
            if isinstance(label, PhaseLabel) and label.hook is not None:
                outside.setdefault(label.hook, []).append(action.clock_mhz)
            elif isinstance(label, PhaseLabel) and label.inside:
                offset_s = max(0.0, label.at_s - label.lead_s)
                inside.setdefault(action.at.step, []).append(InsideRequest(offset_s, action.clock_mhz))
                self._inside_provenance.add(label.provenance)
            else:
                self._unhooked += 1
        self._outside = {hook: tuple(values) for hook, values in outside.items()}
        self._inside = {instruction: tuple(values) for instruction, values in inside.items()}
        self._collectives = {
            action.collective: action for action in actions if isinstance(action, CollectiveAction)
        }

    @property
    def point(self) -> PlanPoint:
        """The point running now."""
        return self.plan.points[self.index]

    @property
    def on_target(self) -> bool:
        """Whether the target's point is running."""
        return self.index == self.plan.target_index

    @property
    def predicted_time_s(self) -> float:
        """The running point's predicted iteration time (modelled)."""
        return self.point.iteration_time_s

    @property
    def predicted_energy_j(self) -> float:
        """The running point's predicted energy of this rank's GPU per iteration (modelled)."""
        return self.point.ranks[self.stage].energy_j

    def clock_at(self, instruction: Step, phase: BoundaryPhase | None = None) -> int | None:
        """The clock to lock at a step's start (or a phase inside it); ``None``: leave it."""
        return self._clocks.get(step_boundary(instruction, phase))

    def outside_clocks(self, name: str, end: bool = False) -> tuple[int, ...]:
        """The clocks to request, in order, when the outside phase ``name`` begins (or ``end`` s)."""
        return self._outside.get(OutsideHook(name, end), ())

    def inside_requests(self, instruction: Step) -> tuple[InsideRequest, ...]:
        """The clocks to request inside ``instruction``, in plan order (empty when it has none)."""
        return self._inside.get(instruction, ())

    def hook_report(self, inside_switched: bool = True) -> str | None:
        """Where the running point's phase actions go, for the log; ``None`` when it has none.

        Args:
            inside_switched: Whether a phase switcher applies the phases inside instructions (``False``:
                ``--energy-phase-switching off``).
        """
        hooked = sum(len(clocks) for clocks in self._outside.values())
        inside = sum(len(requests) for requests in self._inside.values())
        if not hooked and not inside and not self._unhooked:
            return None
        parts = []
        if hooked:
            hooks = ", ".join(sorted(str(hook) for hook in self._outside))
            parts.append(f"{hooked} requested at outside-phase hooks ({hooks})")
        provenance = "/".join(sorted(self._inside_provenance))
        if inside and inside_switched:
            parts.append(
                f"{inside} inside instructions applied time-anchored, at their planned offsets "
                f"({provenance}) from each instruction's start on the GPU"
            )
        elif inside:
            parts.append(
                f"{inside} inside instructions not applied (--energy-phase-switching off): those "
                f"instructions keep their own clock, so the plan's phase saving there ({provenance}) is not "
                "realised"
            )
        if self._unhooked:
            parts.append(f"{self._unhooked} at a point the runtime does not switch clocks at, not applied")
        return f"phase clocks on pipeline rank {self.stage}: " + "; ".join(parts)

    def collective(self, name: CollectiveName) -> CollectiveAction | None:
        """The launch point and SM budget planned for a collective; ``None``: run it as Megatron does."""
        return self._collectives.get(name)
