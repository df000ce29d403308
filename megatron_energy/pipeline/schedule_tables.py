"""The two tables megatron-core's pipeline schedules are driven by, computed without megatron-core.

Megatron-core decides the order of forward and backward passes on every pipeline rank from two tables (in
``megatron.core.pipeline_parallel.schedules``):

* the *schedule table* (``get_schedule_table``): which microbatch and model chunk each virtual microbatch id
  runs. Microbatches go in groups of ``microbatch_group_size_per_vp_stage``; within a group every chunk runs
  the whole group before the next chunk starts, and the last group takes every remaining microbatch.
* the *warm-up count* (``get_pp_rank_microbatches``): how many forwards a rank runs before its first backward.
  Without interleaving that is one per later stage (``stages - rank - 1``); with interleaving two per later
  stage plus ``(chunks - 1) * group size`` (and one more for the combined 1F1B schedule, so the two halves of
  every fused step are independent); without pipelining none. It never exceeds the rank's passes.

:func:`schedule_tables` computes both for a :class:`ScheduleShape`; ``megatron_energy.megatron.schedule``
reads the same tables from megatron-core itself, and the tests hold the two equal over a grid of shapes.
:class:`ScheduleShape` refuses what megatron-core refuses at run time, with the reason spelled out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleShape:
    """What a pipeline schedule's order depends on; a shape megatron-core refuses is refused here."""

    num_stages: int
    """Pipeline-parallel size (ranks in the pipeline)."""

    num_microbatches: int
    """Microbatches per iteration."""

    num_chunks: int = 1
    """Model chunks per rank (virtual pipeline size); 1 without interleaving."""

    microbatch_group_size: int | None = None
    """Megatron's ``microbatch_group_size_per_vp_stage``; ``None``: the pipeline size, like
    ``ModelParallelConfig``. Only an interleaved schedule reads it."""

    combined: bool = False
    """The combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``): steady steps fuse a forward with a
    backward."""

    def __post_init__(self) -> None:
        check_schedule_arguments(self.num_stages, self.num_microbatches, self.num_chunks, self.group_size)
        if self.combined:
            check_combined_arguments(self.num_stages, self.num_chunks)

    @property
    def group_size(self) -> int:
        """The microbatch group size the schedule uses (the pipeline size unless given)."""
        return self.num_stages if self.microbatch_group_size is None else self.microbatch_group_size


@dataclass(frozen=True)
class ScheduleTables:
    """The tables one schedule shape drives megatron-core's schedule with."""

    table: tuple[tuple[int, int], ...]
    """``(microbatch, chunk)`` of each virtual microbatch id, in forward order (``get_schedule_table``)."""

    warmups: tuple[int, ...]
    """Per pipeline rank, the forwards it runs before its first backward (``get_pp_rank_microbatches``)."""


def schedule_tables(shape: ScheduleShape) -> ScheduleTables:
    """The schedule table and every rank's warm-up count of ``shape``, by megatron-core's rules.

    Args:
        shape: The schedule's shape.

    Returns:
        The tables megatron-core computes for ``shape`` (see the module docstring for the rules).
    """
    return ScheduleTables(
        table=_schedule_table(shape.num_microbatches, shape.num_chunks, shape.group_size),
        warmups=tuple(_warmup_forwards(shape, rank) for rank in range(shape.num_stages)),
    )


def _schedule_table(num_microbatches: int, num_chunks: int, group_size: int) -> tuple[tuple[int, int], ...]:
    """``(microbatch, chunk)`` per virtual microbatch id: each group runs on every chunk in turn."""
    table: list[tuple[int, int]] = []
    for first in range(0, num_microbatches, group_size):
        group = range(first, min(first + group_size, num_microbatches))
        table.extend((microbatch, chunk) for chunk in range(num_chunks) for microbatch in group)
    return tuple(table)


def _warmup_forwards(shape: ScheduleShape, rank: int) -> int:
    """The forwards ``rank`` runs before its first backward, at most all of its passes' forwards."""
    later_stages = shape.num_stages - rank - 1
    if shape.num_stages == 1:
        warmup = 0
    elif shape.num_chunks == 1:
        warmup = later_stages
    else:
        warmup = 2 * later_stages + (shape.num_chunks - 1) * shape.group_size + int(shape.combined)
    return min(warmup, shape.num_microbatches * shape.num_chunks)


def check_schedule_arguments(
    num_stages: int, num_microbatches: int, num_chunks: int = 1, group_size: int | None = None
) -> None:
    """Reject pipeline shapes megatron-core refuses at run time, with the reason spelled out.

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
