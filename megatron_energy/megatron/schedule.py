"""Megatron-core's own schedule tables, for the runtime's pipeline orders.

Megatron-core decides the order of forward and backward passes on every pipeline rank from two pure helpers
in ``megatron.core.pipeline_parallel.schedules``: ``get_schedule_table`` (which microbatch and model chunk
each virtual microbatch id maps to) and ``get_pp_rank_microbatches`` (how many warm-up forwards a rank runs).
:func:`megatron_schedule_tables` asks both; ``pipeline.schedule_orders.pipeline_orders`` replays them into
every rank's order. The runtime, inside a Megatron job, passes this function so its orders follow the
installed megatron-core; offline planning computes the same tables without megatron
(``pipeline.schedule_tables``), and the tests hold the two equal.
"""

import warnings
from dataclasses import dataclass

from megatron_energy.pipeline.schedule_tables import ScheduleShape, ScheduleTables


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


def megatron_schedule_tables(shape: ScheduleShape) -> ScheduleTables:
    """The schedule table and every rank's warm-up count of ``shape``, as megatron-core computes them.

    Args:
        shape: The schedule's shape.

    Returns:
        ``get_schedule_table``'s table and, per rank, ``get_pp_rank_microbatches``'s warm-up count.
    """
    with warnings.catch_warnings():
        # megatron-core warns at import about fused kernels (TE, Apex) that the schedule does not use.
        warnings.simplefilter("ignore")
        from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches, get_schedule_table

    virtual_size = shape.num_chunks if shape.num_chunks > 1 else None
    warmups = []
    for rank in range(shape.num_stages):
        communicator = _CommunicatorView(_PipelineGroupView(shape.num_stages, rank), virtual_size)
        _, _, num_warmup, _ = get_pp_rank_microbatches(
            shape.num_microbatches,
            shape.num_chunks,
            shape.group_size,
            overlap_moe_expert_parallel_comm=shape.combined,
            p2p_communicator=communicator,
        )
        warmups.append(num_warmup)
    table = get_schedule_table(shape.num_microbatches, shape.num_chunks, shape.group_size)
    return ScheduleTables(table=tuple(table), warmups=tuple(warmups))
