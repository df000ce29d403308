"""The executed instruction order of every pipeline rank: what the DAG, the planner and the timer all use.

Megatron decides the order (``pipeline.schedule_orders.pipeline_orders`` replays megatron-core's schedule
tables, with the job's real microbatch group size); it is computed once, travels in the job context, and
every DAG of the job is built from it. With the combined 1F1B schedule
(``--overlap-moe-expert-parallel-comm``) a rank's order holds fused steps
(:class:`~megatron_energy.pipeline.instruction.FusedInstruction`) beside single passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.instruction import KINDS, FusedInstruction, Instruction, Step, passes


@dataclass(frozen=True)
class PipelineOrders:
    """Every pipeline rank's instructions in execution order, and the schedule parameters behind them."""

    ranks: tuple[tuple[Instruction, ...], ...]
    """Per pipeline stage, its passes in the order the schedule runs them (a fused step's forward, then its
    backward)."""

    num_microbatches: int
    """Microbatches per iteration."""

    num_chunks: int = 1
    """Model chunks per stage (virtual pipeline size); 1 without interleaving."""

    microbatch_group_size: int | None = None
    """Megatron's ``microbatch_group_size_per_vp_stage`` (interleaved schedules; ``None`` = pipeline size)."""

    fused_steps: tuple[tuple[Step, ...], ...] | None = None
    """Per stage, the steps of megatron-core's combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``:
    single passes and fused pairs, the DAG's compute nodes); ``None`` for every other schedule."""

    def __post_init__(self) -> None:
        _validate(self)

    @classmethod
    def combined(
        cls,
        steps: tuple[tuple[Step, ...], ...],
        num_microbatches: int,
        num_chunks: int = 1,
        microbatch_group_size: int | None = None,
    ) -> PipelineOrders:
        """The orders of a combined 1F1B schedule, from every stage's steps."""
        ranks = tuple(tuple(p for step in order for p in passes(step)) for order in steps)
        return cls(ranks, num_microbatches, num_chunks, microbatch_group_size, fused_steps=steps)

    @property
    def is_combined(self) -> bool:
        """Whether this is the combined 1F1B schedule (some steps are fused)."""
        return self.fused_steps is not None

    @property
    def num_stages(self) -> int:
        """Pipeline stages."""
        return len(self.ranks)

    def stage(self, stage: int) -> tuple[Instruction, ...]:
        """One stage's passes in execution order."""
        return self.ranks[stage]

    def instructions(self) -> list[Instruction]:
        """Every pass of the iteration, stage by stage in execution order."""
        return [instruction for order in self.ranks for instruction in order]

    def steps(self, stage: int) -> tuple[Step, ...]:
        """One stage's steps, the DAG's compute nodes: its passes, or (combined 1F1B) also fused pairs."""
        return self.ranks[stage] if self.fused_steps is None else self.fused_steps[stage]

    def all_steps(self) -> list[Step]:
        """Every step of the iteration, stage by stage in execution order."""
        return [step for stage in range(self.num_stages) for step in self.steps(stage)]

    def describe(self) -> dict[str, int | bool | None]:
        """The schedule parameters, for fingerprints and messages."""
        return {
            "pipeline_size": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "num_chunks": self.num_chunks,
            "microbatch_group_size": self.microbatch_group_size,
            **({"combined_1f1b": True} if self.is_combined else {}),
        }


def _validate(orders: PipelineOrders) -> None:
    """Every rank runs exactly one forward and one backward per (microbatch, chunk) of its own stage."""
    if not orders.ranks:
        raise EnergyValueError("pipeline orders are empty: need one instruction order per pipeline stage")
    if orders.num_chunks < 1 or orders.num_microbatches < 1:
        raise EnergyValueError(
            f"num_chunks ({orders.num_chunks}) and num_microbatches ({orders.num_microbatches}) must be >= 1"
        )
    for stage, order in enumerate(orders.ranks):
        expected = {
            Instruction(stage, chunk, microbatch, kind)
            for kind in KINDS
            for microbatch in range(orders.num_microbatches)
            for chunk in range(orders.num_chunks)
        }
        _validate_fused(orders, stage)
        seen = set(order)
        if len(seen) != len(order):
            raise EnergyValueError(f"stage {stage} runs an instruction twice")
        if seen != expected:
            wrong = sorted(seen - expected)[:3]
            missing = sorted(expected - seen)[:3]
            raise EnergyValueError(
                f"stage {stage} does not run one forward and one backward per microbatch "
                f"and chunk of its own "
                f"stage (unexpected e.g. {wrong}, missing e.g. {missing})"
            )


def _validate_fused(orders: PipelineOrders, stage: int) -> None:
    """A combined schedule's steps are the stage's passes, with forward-backward pairs of that stage."""
    if orders.fused_steps is None:
        return
    if len(orders.fused_steps) != orders.num_stages:
        raise EnergyValueError(
            f"{len(orders.fused_steps)} stages of fused steps for {orders.num_stages} stages"
        )
    steps = orders.fused_steps[stage]
    for step in steps:
        if isinstance(step, FusedInstruction) and (
            (step.forward.kind, step.backward.kind, step.backward.stage) != ("forward", "backward", stage)
        ):
            raise EnergyValueError(f"stage {stage}: {step} must pair a forward and a backward of that stage")
    if tuple(p for step in steps for p in passes(step)) != orders.ranks[stage]:
        raise EnergyValueError(f"stage {stage}: its fused steps do not run its passes in order")
