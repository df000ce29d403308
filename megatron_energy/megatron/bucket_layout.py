"""This rank's DDP bucket groups as the Kareus contract names them, and where their parameters sit.

megatron-core's ``DistributedDataParallel`` (one per model chunk) partitions its gradient buffer into buckets
and the buckets into bucket groups (``distributed_data_parallel.py``: ``partition_buckets``); each bucket
group is launched as one (coalesced) collective. With one buffer per chunk (one dtype, no experts) every
group holds one bucket and the group index is megatron-core's bucket index, which the contract names:
``dp.<op>[.chunk<c>].bucket<b>`` (a ``pipeline.collective_names.CollectiveName``; the chunk only with a
virtual pipeline). A parameter's place (a model-layer index of the chunk, the head or the embedding) decides
when its gradient is complete in the backward pass (``runtime.running.collective_points.ready_point``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from megatron_energy.pipeline.collective_names import CollectiveName, CollectiveOp
from megatron_energy.pipeline.collectives import MeasuredBucket
from megatron_energy.runtime.running.collective_points import EMBEDDING, HEAD, CollectivePlanError

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class BucketGroup:
    """One bucket group of one model chunk."""

    chunk: int
    """Model chunk (index into this rank's DDP chunks)."""
    index: int
    """Index among the chunk's bucket groups (megatron-core's bucket index)."""
    group: Any
    """megatron-core's ``_ParamAndGradBucketGroup``."""
    places: tuple[int | str, ...]
    """Where its parameters sit: model-layer indices of the chunk, ``head`` or ``embedding``."""
    elements: int
    """Gradient elements it reduces."""

    def name(self, op: CollectiveOp, virtual: bool) -> CollectiveName:
        """The contract's name of its ``op`` collective."""
        return CollectiveName("dp", op, self.chunk if virtual else None, self.index)


def parameter_place(name: str) -> int | str:
    """Where a parameter of a GPT chunk sits, from its name in the chunk (``decoder.layers.3.mlp...``)."""
    match = _LAYER.search(name)
    if match is not None:
        return int(match.group(1))
    return EMBEDDING if name.startswith("embedding.") else HEAD


def chunk_layers(ddp: Any) -> int:
    """Transformer layers of one DDP model chunk (distinct ``layers.<i>`` in its parameter names)."""
    return len({p for n, _ in ddp.module.named_parameters() if isinstance(p := parameter_place(n), int)})


def bucket_groups(model_chunks: Sequence[Any]) -> list[BucketGroup]:
    """Every dense bucket group of this rank's DDP chunks, chunk by chunk in megatron-core's order.

    Raises:
        CollectivePlanError: A chunk is not wrapped in megatron-core's ``DistributedDataParallel`` (e.g.
            Megatron-FSDP or torch FSDP, whose collectives have no bucket groups to retime).
    """
    result = []
    for chunk, ddp in enumerate(model_chunks):
        if not hasattr(ddp, "bucket_groups"):
            raise CollectivePlanError(
                f"model chunk {chunk} is a {type(ddp).__name__}, not megatron-core's DistributedDataParallel "
                "(--use-megatron-fsdp and torch FSDP have no bucket groups to retime): use Megatron's DDP, "
                "or plan without collective actions"
            )
        places = {param: parameter_place(name) for name, param in ddp.module.named_parameters()}
        for index, group in enumerate(ddp.bucket_groups):
            where = {places[param] for bucket in group.buckets for param in bucket.params_list}
            elements = sum(bucket.grad_data.numel() for bucket in group.buckets)
            result.append(BucketGroup(chunk, index, group, tuple(sorted(where, key=str)), elements))
    return result


def gradient_op(group: Any) -> CollectiveOp:
    """``reduce_scatter`` with the distributed optimizer, else ``all_reduce``."""
    return "reduce_scatter" if group.ddp_config.use_distributed_optimizer else "all_reduce"


def communicator_attr(group: Any) -> str:
    """The attribute of a bucket group holding the communicator its gradient reduction runs on."""
    if group.ddp_config.use_distributed_optimizer:
        return "intra_distributed_optimizer_instance_group"
    return "data_parallel_group"


def bucket_layout(
    model_chunks: Sequence[Any],
) -> list[tuple[CollectiveName, int, int, tuple[int | str, ...]]]:
    """``(name, chunk, elements, places)`` of every gradient reduction on this rank, for planning and logs."""
    virtual = len(model_chunks) > 1
    return [
        (b.name(gradient_op(b.group), virtual), b.chunk, b.elements, b.places)
        for b in bucket_groups(model_chunks)
    ]


def bucket_span(places: Sequence[int | str], num_layers: int) -> tuple[int, int]:
    """The model layers ``[first, last)`` a bucket's parameters sit in (embedding -1, head ``num_layers``)."""
    indices = [-1 if p == EMBEDDING else num_layers if p == HEAD else int(p) for p in places]
    return min(indices), max(indices) + 1


def measured_buckets(model_chunks: Sequence[Any], stage: int) -> tuple[MeasuredBucket, ...]:
    """This rank's DDP bucket groups as the planner takes them (``pipeline.collectives.MeasuredBucket``).

    Raises:
        CollectivePlanError: A chunk is not wrapped in megatron-core's ``DistributedDataParallel``.
    """
    layers = [chunk_layers(ddp) for ddp in model_chunks]
    return tuple(
        MeasuredBucket(stage, b.chunk, b.index, bucket_span(b.places, layers[b.chunk]), b.elements)
        for b in bucket_groups(model_chunks)
    )
