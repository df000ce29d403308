"""Per-rank pipeline instruction order, taken from megatron-core's own schedule helpers.

Megatron-core decides the order of forward and backward passes on every pipeline rank inside
``forward_backward_pipelining_with_interleaving`` / ``..._without_interleaving``. Two pure helpers in
``megatron.core.pipeline_parallel.schedules`` carry that decision: ``get_pp_rank_microbatches`` (how many
warm-up forwards a rank runs) and ``get_schedule_table`` (which microbatch and model chunk each virtual
microbatch id maps to). :func:`pipeline_orders` calls both and replays the schedule's loop structure
(warm-up forwards, steady one-forward-one-backward, cool-down backwards), so the order is Megatron's, not a
re-derivation of 1F1B.

The combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``, ``combined_1f1b.py``) runs every step
through ``combined_forward_backward_step``: warm-up forwards alone, then each steady forward *fused* with a
backward (one :class:`~megatron_energy.pipeline.instruction.FusedInstruction`), then cool-down backwards
alone.
Megatron-core takes it without pipelining (``combined_1f1b_schedule_for_no_pipelining``: one forward, then
fused pairs, then one backward) and with interleaving, whose warm-up ``get_pp_rank_microbatches`` lengthens
by one microbatch so the two halves of every fused step are independent.
"""

import warnings
from dataclasses import dataclass

from megatron_energy.pipeline.instruction import FusedInstruction, Instruction, Step, passes
from megatron_energy.pipeline.orders import PipelineOrders


@dataclass(frozen=True)
class _PipelineGroupView:
    """The two methods of a process group that ``get_pp_rank_microbatches`` reads."""

    world_size: int
    rank_id: int

    def size(self) -> int:
        return self.world_size

    def rank(self) -> int:
        return self.rank_id


@dataclass(frozen=True)
class _CommunicatorView:
    """The attributes of ``P2PCommunicator`` that ``get_pp_rank_microbatches`` reads; no process group."""

    pp_group: _PipelineGroupView
    virtual_pipeline_model_parallel_size: int | None


def check_schedule_arguments(
    num_stages: int, num_microbatches: int, num_chunks: int = 1, group_size: int | None = None
) -> None:
    """Reject pipeline shapes megatron-core refuses at run time, with the reason spelled out.

    Needs no megatron import, so configs can be checked early.

    Args:
        num_stages: Pipeline-parallel size.
        num_microbatches: Microbatches per iteration.
        num_chunks: Model chunks per rank (virtual pipeline size).
        group_size: ``microbatch_group_size_per_vp_stage``; ``num_stages`` when ``None``.

    Raises:
        ValueError: If megatron-core would refuse the combination.
    """
    group_size = num_stages if group_size is None else group_size
    if num_stages < 1 or num_microbatches < 1 or num_chunks < 1:
        raise ValueError(
            f"num_stages ({num_stages}), num_microbatches ({num_microbatches}) and num_chunks ({num_chunks}) "
            "must all be >= 1"
        )
    if num_chunks == 1:
        return
    if num_stages < 2:
        raise ValueError(
            f"an interleaved schedule ({num_chunks} chunks per rank) needs at least 2 pipeline stages, "
            f"got {num_stages}"
        )
    if not num_stages <= group_size <= num_microbatches:
        raise ValueError(
            f"megatron-core needs the microbatch group size per virtual stage ({group_size}) to lie in "
            f"[pipeline stages={num_stages}, microbatches={num_microbatches}]; use at least {num_stages} "
            "microbatches with an interleaved schedule"
        )
    remainder = num_microbatches % group_size
    if 0 < remainder < num_stages:
        raise ValueError(
            f"megatron-core refuses {num_microbatches} microbatches in groups of {group_size} with "
            f"{num_stages} pipeline stages: the last group has {remainder} < {num_stages} microbatches; "
            f"use a multiple of {group_size} microbatches"
        )


def check_combined_arguments(num_stages: int, num_chunks: int) -> None:
    """Reject pipeline shapes megatron-core runs no combined 1F1B schedule for.

    Args:
        num_stages: Pipeline-parallel size.
        num_chunks: Model chunks per rank (virtual pipeline size).

    Raises:
        ValueError: For pipelining without interleaving, which ``TransformerConfig`` refuses with
            ``--overlap-moe-expert-parallel-comm``.
    """
    if num_stages > 1 and num_chunks == 1:
        raise ValueError(
            f"megatron-core runs the combined 1F1B schedule (--overlap-moe-expert-parallel-comm) with "
            f"{num_stages} pipeline stages only when interleaved: add "
            "--num-layers-per-virtual-pipeline-stage (or --num-virtual-stages-per-pipeline-rank), or use "
            "pipeline-parallel size 1"
        )


def pipeline_orders(
    num_stages: int,
    num_microbatches: int,
    num_chunks: int = 1,
    *,
    microbatch_group_size: int | None = None,
    combined: bool = False,
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

    Returns:
        Every rank's instructions in execution order, with the schedule parameters (group size included).

    Raises:
        ValueError: If megatron-core would refuse the combination (for instance an interleaved schedule whose
            microbatch count is not a multiple of the pipeline size, or a combined one without interleaving).
    """
    group_size = num_stages if microbatch_group_size is None else microbatch_group_size
    check_schedule_arguments(num_stages, num_microbatches, num_chunks, group_size)
    if combined:
        check_combined_arguments(num_stages, num_chunks)
    with warnings.catch_warnings():
        # megatron-core warns at import about fused kernels (TE, Apex) that the schedule does not use.
        warnings.simplefilter("ignore")
        from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches, get_schedule_table

    schedule_table = get_schedule_table(num_microbatches, num_chunks, group_size)
    virtual_size = num_chunks if num_chunks > 1 else None
    orders = []
    for rank in range(num_stages):
        forwards = [Instruction(rank, chunk, microbatch, "forward") for microbatch, chunk in schedule_table]
        backwards = [
            Instruction(rank, num_chunks - 1 - chunk, microbatch, "backward")
            for microbatch, chunk in schedule_table
        ]
        communicator = _CommunicatorView(_PipelineGroupView(num_stages, rank), virtual_size)
        total, _, num_warmup, _ = get_pp_rank_microbatches(
            num_microbatches,
            num_chunks,
            group_size,
            overlap_moe_expert_parallel_comm=combined,
            p2p_communicator=communicator,
        )
        if combined and num_stages == 1:
            # combined_1f1b_schedule_for_no_pipelining: the first forward runs alone.
            num_warmup = min(1, total)
        order: list[Step] = list(forwards[:num_warmup])
        for k in range(num_warmup, total):
            if combined:
                order.append(FusedInstruction(forwards[k], backwards[k - num_warmup]))
            else:
                order += [forwards[k], backwards[k - num_warmup]]
        order.extend(backwards[total - num_warmup :])
        orders.append(tuple(order))
    group = microbatch_group_size if num_chunks > 1 else None
    if combined:
        return PipelineOrders.combined(tuple(orders), num_microbatches, num_chunks, group)
    return PipelineOrders(
        tuple(tuple(p for step in order for p in passes(step)) for order in orders),
        num_microbatches=num_microbatches,
        num_chunks=num_chunks,
        microbatch_group_size=group,
    )
