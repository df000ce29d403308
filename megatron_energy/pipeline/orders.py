"""The executed instruction order of every pipeline rank: what the DAG, the planner and the timer all use.

Megatron decides the order (``megatron_energy.megatron.schedule.pipeline_orders`` asks megatron-core's own
schedule helpers, with the job's real microbatch group size); it is computed once, travels in the job
context, and every DAG of the job is built from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.instruction import KINDS, Instruction


@dataclass(frozen=True)
class PipelineOrders:
    """Every pipeline rank's instructions in execution order, and the schedule parameters behind them."""

    ranks: tuple[tuple[Instruction, ...], ...]
    """Per pipeline stage, its instructions in the order the schedule runs them."""

    num_microbatches: int
    """Microbatches per iteration."""

    num_chunks: int = 1
    """Model chunks per stage (virtual pipeline size); 1 without interleaving."""

    microbatch_group_size: int | None = None
    """Megatron's ``microbatch_group_size_per_vp_stage`` (interleaved schedules; ``None`` = pipeline size)."""

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def num_stages(self) -> int:
        """Pipeline stages."""
        return len(self.ranks)

    def stage(self, stage: int) -> tuple[Instruction, ...]:
        """One stage's instructions in execution order."""
        return self.ranks[stage]

    def instructions(self) -> list[Instruction]:
        """Every instruction of the iteration, stage by stage in execution order."""
        return [instruction for order in self.ranks for instruction in order]

    def describe(self) -> dict[str, int | None]:
        """The schedule parameters, for fingerprints and messages."""
        return {
            "pipeline_size": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "num_chunks": self.num_chunks,
            "microbatch_group_size": self.microbatch_group_size,
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
