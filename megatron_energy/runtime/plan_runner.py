"""Applies one rank's actions of a :class:`~megatron_energy.plan.Plan` at the schedule's hook events.

The runner indexes the actions of one point of the plan for this rank: the clock to lock at an
instruction's start (or at a phase inside it) and the launch point and SM budget of a collective. It can
switch to another point of the same plan (a straggler's pace) without re-planning. It knows nothing of
how a plan was made, so every optimiser's plan runs through it.

Phase actions (``Boundary(instruction, phase)``, named by ``phases.labels``) run where the runtime has a hook:

- **outside instructions** (the iteration tail): a label naming a hook (``tail1@optimizer:...``) is requested
  when that outside phase begins (``events.OUTSIDE_PHASES``: megatron-core's ``all-grads-sync``,
  ``optimizer`` and ``params-all-gather`` timers on the launcher path), in plan order; the planner already
  moved each request to a hook early enough for the switch latency
  (``phases.switching.snap_to_phase_starts``). The restoring request (``@optimizer.end``) goes out when the
  optimizer step ends: no hook lies inside it, so the restored clock lands up to one switch latency into the
  next iteration (its first instruction may start at the tail's clock for that long);
- **inside instructions**: no hook. Module forward pre-hooks fire on the host when a layer's kernels are
  *launched*, and the phases of a plan are times within the instruction (from a modelled per-class split or a
  kernel timeline), not modules, so a phase start has no module to hang on; backward phases have not even
  that (autograd runs them). Those phases keep the instruction's own clock, and :meth:`PlanRunner.hook_report`
  says how many there are (the session logs it), so the plan's predicted phase saving there is known not to
  be realised.
"""

from __future__ import annotations

from megatron_energy.phases.labels import parse_phase_label
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.plan import Boundary, ClockAction, CollectiveAction, Plan, PlanError, PlanPoint


class PlanRunner:
    """One rank's view of a plan.

    Args:
        plan: The plan every rank runs.
        stage: This rank's pipeline stage.
        order: This rank's executed instruction order; every action must name one of its instructions.

    Raises:
        PlanError: The plan does not cover this rank, or names an instruction this rank does not run.
    """

    def __init__(self, plan: Plan, stage: int, order: tuple[Instruction, ...]) -> None:
        if not 0 <= stage < plan.num_stages:
            raise PlanError(f"the plan covers pipeline ranks 0..{plan.num_stages - 1}, not rank {stage}")
        executed = set(order)
        for point in plan.points:
            for action in point.ranks[stage].actions:
                if action.at.instruction not in executed:
                    raise PlanError(
                        f"the plan has an action at {action.at.instruction}, "
                        f"which rank {stage} does not run: it "
                        "was made for another schedule (stages, microbatches, virtual pipeline size or group "
                        "size); rerun planning"
                    )
        self.plan = plan
        self.stage = stage
        self.index = plan.target_index
        self._clocks: dict[Boundary, int] = {}
        self._outside: dict[str, tuple[int, ...]] = {}
        self._unhooked = 0
        self._collectives: dict[str, CollectiveAction] = {}
        self.select(plan.target_index)

    def select(self, index: int) -> None:
        """Run the plan's point ``index`` from now on."""
        actions = self.plan.points[index].ranks[self.stage].actions
        self.index = index
        clocks = [action for action in actions if isinstance(action, ClockAction)]
        self._clocks = {action.at: action.clock_mhz for action in clocks}
        outside: dict[str, list[int]] = {}
        self._unhooked = 0
        for action in clocks:
            if action.at.phase is None:
                continue
            hook = _hook_of(action.at.phase)
            if hook is None:
                self._unhooked += 1
            else:
                outside.setdefault(hook, []).append(action.clock_mhz)
        self._outside = {hook: tuple(values) for hook, values in outside.items()}
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

    def clock_at(self, instruction: Instruction, phase: str | None = None) -> int | None:
        """The clock to lock at an instruction's start (or a phase inside it); ``None``: leave it."""
        return self._clocks.get(Boundary(instruction, phase))

    def outside_clocks(self, name: str, end: bool = False) -> tuple[int, ...]:
        """The clocks to request, in order, when the outside phase ``name`` begins (or ``end`` s)."""
        return self._outside.get(f"{name}.end" if end else name, ())

    def hook_report(self) -> str | None:
        """Where the running point's phase actions go, for the log; ``None`` when it has none."""
        hooked = sum(len(clocks) for clocks in self._outside.values())
        if not hooked and not self._unhooked:
            return None
        parts = []
        if hooked:
            parts.append(f"{hooked} requested at outside-phase hooks ({', '.join(sorted(self._outside))})")
        if self._unhooked:
            parts.append(
                f"{self._unhooked} inside instructions have no hook (a phase inside an instruction is a "
                "time, not a module): those instructions keep their own clock, so the plan's phase saving "
                "there (modelled) is not realised"
            )
        return f"phase clocks on pipeline rank {self.stage}: " + "; ".join(parts)

    def collective(self, name: str) -> CollectiveAction | None:
        """The launch point and SM budget planned for a collective; ``None``: run it as Megatron does."""
        return self._collectives.get(name)


def _hook_of(phase: str) -> str | None:
    """The runtime hook a phase action's label names; ``None`` for a phase without one (or another name)."""
    try:
        return parse_phase_label(phase).hook
    except ValueError:
        return None
