"""``ExpectedOrder``: the ids of the instructions Megatron's timers report, from this rank's expected order.

On the unpatched path the timers name only the kind of work that starts, never its microbatch or chunk. The
walker replays this rank's order from megatron-core's own schedule tables
(``schedule.megatron_schedule_tables`` through ``pipeline.schedule_orders.pipeline_orders``) and checks every
observed kind (and, for combined 1F1B, every call's passes and forward microbatch) against it; a difference
is a ``ScheduleMismatchError``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from megatron_energy.errors import EnergyRuntimeError
from megatron_energy.megatron.schedule import megatron_schedule_tables
from megatron_energy.pipeline.instruction import FUSED, FusedInstruction, Step
from megatron_energy.pipeline.schedule_orders import pipeline_orders

RankOrder = Sequence[Step]


class ScheduleMismatchError(EnergyRuntimeError):
    """The instructions Megatron ran differ from the order ``pipeline_orders`` predicts for this rank."""


def current_rank_order(
    num_microbatches: int, microbatch_group_size: int | None = None, combined: bool = False
) -> RankOrder:
    """This rank's expected order of steps for the next schedule, from megatron-core's parallel state.

    Args:
        num_microbatches: Microbatches in the step.
        microbatch_group_size: ``--microbatch-group-size-per-virtual-pipeline-stage``; ``None``: PP size.
        combined: The combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``).

    Returns:
        This pipeline rank's steps (instructions; with ``combined``, fused pairs too) in execution order.
    """
    from megatron.core import parallel_state

    num_stages = parallel_state.get_pipeline_model_parallel_world_size()
    num_chunks = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
    rank = parallel_state.get_pipeline_model_parallel_rank()
    return _rank_order(num_stages, num_microbatches, num_chunks, microbatch_group_size, rank, combined)


@functools.lru_cache(maxsize=16)
def _rank_order(
    num_stages: int,
    num_microbatches: int,
    num_chunks: int,
    microbatch_group_size: int | None,
    rank: int,
    combined: bool,
) -> RankOrder:
    """``pipeline_orders`` for one rank, once per schedule shape (which changes only with batch ramp-up)."""
    orders = pipeline_orders(
        num_stages,
        num_microbatches,
        num_chunks,
        microbatch_group_size=microbatch_group_size,
        combined=combined,
        tables=megatron_schedule_tables,
    )
    return orders.steps(rank)


class ExpectedOrder:
    """Gives the ids of the instructions the timers report by walking this rank's expected order."""

    def __init__(self, order_fn: Callable[[], RankOrder]):
        """Create the walker.

        Args:
            order_fn: Returns this rank's order for the schedule that is starting.
        """
        self._order_fn = order_fn
        self._order: RankOrder = ()
        self._position = 0
        self._running: dict[str, tuple[int, int]] = {}

    def start(self) -> None:
        """A training schedule starts: fetch its order."""
        self._order = self._order_fn()
        self._position = 0
        self._running.clear()

    def begin(self, kind: str) -> tuple[int, int]:
        """An instruction of ``kind`` starts; return its ``(microbatch, chunk)``.

        Raises:
            ScheduleMismatchError: Megatron ran another kind, or more instructions, than expected.
        """
        if self._position >= len(self._order) or self._order[self._position].kind != kind:
            expected = self._order[self._position].kind if self._position < len(self._order) else "nothing"
            raise ScheduleMismatchError(
                f"instruction {self._position} of this step is a {kind}, but megatron-core's schedule table "
                f"predicts {expected} (order of {len(self._order)} instructions); this configuration changes "
                "Megatron's schedule in a way the launcher cannot follow: apply the patch set "
                "(`megatron-energy patch apply`) so the schedule reports its own ids"
            )
        step = self._order[self._position]
        chunk, microbatch = step.chunk, step.microbatch  # a fused step's are its forward's
        self._position += 1
        self._running[kind] = (microbatch, chunk)
        return microbatch, chunk

    def end(self, kind: str) -> tuple[int, int]:
        """The running instruction of ``kind`` ends; return its ``(microbatch, chunk)``."""
        return self._running.pop(kind)

    def begin_step(self, has_forward: bool, has_backward: bool, forward_microbatch: int | None) -> Step:
        """A combined 1F1B step starts (``combined_forward_backward_step``); return the expected step.

        Args:
            has_forward: The call runs a forward (``f_model`` given).
            has_backward: The call runs a backward (``b_model`` given).
            forward_microbatch: The call's ``current_microbatch`` (``None`` where megatron-core passes none).

        Raises:
            ScheduleMismatchError: The call runs other passes, or another forward microbatch, than the order.
        """
        kind = FUSED if has_forward and has_backward else "forward" if has_forward else "backward"
        self.begin(kind)
        step = self._order[self._position - 1]
        forward = step.forward if isinstance(step, FusedInstruction) else step
        if has_forward and forward_microbatch is not None and forward_microbatch != forward.microbatch:
            raise ScheduleMismatchError(
                f"combined 1F1B step {self._position - 1} of this step runs the forward of microbatch "
                f"{forward_microbatch}, but megatron-core's schedule table predicts {step.label}"
            )
        return step

    def finish(self) -> None:
        """The schedule ended; check that every expected instruction ran.

        Raises:
            ScheduleMismatchError: Fewer instructions ran than expected.
        """
        if self._position != len(self._order):
            raise ScheduleMismatchError(
                f"the step ran {self._position} instructions but megatron-core's schedule table predicts "
                f"{len(self._order)}; check --num-microbatches/--global-batch-size, or apply the patch set"
            )
