"""Per-rank pipeline instruction order, replayed from megatron-core's schedule tables.

Megatron-core runs every pipeline rank's schedule in three parts (``forward_backward_pipelining_with_
interleaving`` / ``..._without_interleaving``): warm-up forwards, steady one-forward-one-backward, cool-down
backwards. Forward ``k`` runs the ``k``-th entry of the schedule table; backward ``k`` the same microbatch on
the mirrored chunk (the last chunk first). :func:`pipeline_orders` replays that loop structure over the
tables of :mod:`~megatron_energy.pipeline.schedule_tables`, so the order is Megatron's and no megatron import
is needed; the runtime passes ``megatron.schedule.megatron_schedule_tables`` to replay megatron-core's own.

The combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``, ``combined_1f1b.py``) runs every step
through ``combined_forward_backward_step``: warm-up forwards alone, then each steady forward *fused* with a
backward (one :class:`~megatron_energy.pipeline.instruction.FusedInstruction`), then cool-down backwards
alone. Megatron-core takes it without pipelining (``combined_1f1b_schedule_for_no_pipelining``: one forward,
then fused pairs, then one backward) and with interleaving, whose warm-up is one microbatch longer.
"""

from __future__ import annotations

from collections.abc import Callable

from megatron_energy.pipeline.instruction import FusedInstruction, Instruction, Step, passes
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.schedule_tables import ScheduleShape, ScheduleTables, schedule_tables

TablesSource = Callable[[ScheduleShape], ScheduleTables]
"""Where a schedule's tables come from: :func:`~megatron_energy.pipeline.schedule_tables.schedule_tables`
(pure) or megatron-core (``megatron.schedule.megatron_schedule_tables``)."""


def pipeline_orders(
    num_stages: int,
    num_microbatches: int,
    num_chunks: int = 1,
    *,
    microbatch_group_size: int | None = None,
    combined: bool = False,
    tables: TablesSource = schedule_tables,
) -> PipelineOrders:
    """Return every pipeline rank's instruction order for one training iteration, as the schedule runs it.

    ``num_chunks == 1`` gives Megatron's non-interleaved 1F1B schedule (or plain forward-backward alternation
    when ``num_stages == 1``); ``num_chunks > 1`` gives the interleaved (virtual pipeline) schedule, whose
    backward passes visit model chunks from the last down to the first.

    Args:
        num_stages: Pipeline-parallel size (number of ranks in the pipeline).
        num_microbatches: Microbatches per iteration.
        num_chunks: Model chunks per rank (virtual pipeline size); 1 without interleaving.
        microbatch_group_size: Megatron's ``microbatch_group_size_per_vp_stage``; defaults to ``num_stages``
            like ``ModelParallelConfig``. Ignored without interleaving.
        combined: The combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``): steady steps are
            fused forward-backward pairs.
        tables: Where the schedule's tables come from; megatron-core's rules computed here by default.

    Returns:
        Every rank's instructions in execution order, with the schedule parameters (group size included).

    Raises:
        ValueError: If megatron-core would refuse the combination (for instance an interleaved schedule whose
            microbatch count is not a multiple of the pipeline size, or a combined one without interleaving).
    """
    shape = ScheduleShape(num_stages, num_microbatches, num_chunks, microbatch_group_size, combined)
    schedule = tables(shape)
    orders = tuple(_rank_steps(shape, schedule, rank) for rank in range(num_stages))
    group = microbatch_group_size if num_chunks > 1 else None
    if combined:
        return PipelineOrders.combined(orders, num_microbatches, num_chunks, group)
    return PipelineOrders(
        tuple(tuple(p for step in order for p in passes(step)) for order in orders),
        num_microbatches=num_microbatches,
        num_chunks=num_chunks,
        microbatch_group_size=group,
    )


def _rank_steps(shape: ScheduleShape, schedule: ScheduleTables, rank: int) -> tuple[Step, ...]:
    """One rank's steps: warm-up forwards, steady forward-backward pairs (fused when combined), cool-down."""
    last_chunk = shape.num_chunks - 1
    forwards = [Instruction(rank, chunk, microbatch, "forward") for microbatch, chunk in schedule.table]
    backwards = [
        Instruction(rank, last_chunk - chunk, microbatch, "backward") for microbatch, chunk in schedule.table
    ]
    total = len(schedule.table)
    warmup = schedule.warmups[rank]
    if shape.combined and shape.num_stages == 1:
        # combined_1f1b_schedule_for_no_pipelining: the first forward runs alone.
        warmup = min(1, total)
    order: list[Step] = list(forwards[:warmup])
    for k in range(warmup, total):
        if shape.combined:
            order.append(FusedInstruction(forwards[k], backwards[k - warmup]))
        else:
            order += [forwards[k], backwards[k - warmup]]
    order.extend(backwards[total - warmup :])
    return tuple(order)
