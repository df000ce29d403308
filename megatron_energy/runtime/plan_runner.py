"""Applies one rank's actions of a :class:`~megatron_energy.plan.Plan` at the schedule's hook events.

The runner indexes the actions of one point of the plan for this rank: the clock to lock at an
instruction's start (or at a phase inside it) and the launch point and SM budget of a collective. It can
switch to another point of the same plan (a straggler's pace) without re-planning. It knows nothing of
how a plan was made, so every optimiser's plan runs through it.
"""

from __future__ import annotations

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
        self._collectives: dict[str, CollectiveAction] = {}
        self.select(plan.target_index)

    def select(self, index: int) -> None:
        """Run the plan's point ``index`` from now on."""
        actions = self.plan.points[index].ranks[self.stage].actions
        self.index = index
        self._clocks = {action.at: action.clock_mhz for action in actions if isinstance(action, ClockAction)}
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

    def collective(self, name: str) -> CollectiveAction | None:
        """The launch point and SM budget planned for a collective; ``None``: run it as Megatron does."""
        return self._collectives.get(name)
