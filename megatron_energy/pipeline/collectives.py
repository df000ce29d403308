"""The collectives Kareus schedules: their names, process groups, bytes, launch points and CTA budgets.

This module is the contract between the Kareus planner (model, simulator, search) and the runtime that applies
a plan (NCCL communicator options, Megatron options and hooks). A plan says, per pipeline rank, *which*
collective is launched *where* and with *how many CTAs*, as :class:`~megatron_energy.plan.CollectiveAction`
``(at: Boundary, collective: CollectiveName, max_ctas: int | None)``. Everything below defines those three
fields; the typed values themselves are :mod:`megatron_energy.pipeline.collective_names`'.

**Names** (:class:`~megatron_energy.pipeline.collective_names.CollectiveName`, written here in their dotted
form ``<group>.<op>[.chunk<c>][.bucket<b>]``, which is what ``str()`` of a name gives):

* ``dp.reduce_scatter[.chunk<c>].bucket<b>`` (group ``dp``, bucket class): gradient reduce-scatter of DDP
  bucket ``b`` with the distributed optimizer; ``dp.all_reduce[.chunk<c>].bucket<b>`` without it;
* ``dp.all_gather[.chunk<c>].bucket<b>`` (``dp``, bucket class): parameter all-gather of bucket ``b``
  (distributed optimizer only);
* ``pp.send_recv`` (``pp``, inline): activations and gradients between adjacent pipeline stages;
* ``tp.all_reduce`` (``tp``, inline): tensor-parallel all-reduce without sequence parallelism;
* ``tp.all_gather`` and ``tp.reduce_scatter`` (``tp``, inline): their sequence-parallel replacements;
* ``ep.all_to_all`` (``ep``, inline): an MoE layer's token dispatch and combine over the expert-parallel group
  (and their gradients in the backward pass), two per MoE layer and pass (``pipeline.moe``); on the critical
  path unless :attr:`Collective.overlapped` (only the combined 1F1B schedule overlaps it).

``chunk<c>`` appears only when the job has more than one model chunk per stage (virtual pipeline): each chunk
is its own megatron-core ``DistributedDataParallel`` with its own buckets. ``bucket<b>`` is megatron-core's
bucket index inside that chunk's gradient buffer: buffers hold parameters in *reverse* registration order,
so bucket 0 holds the chunk's last layers, whose gradients are ready first in the backward pass.

**Process groups** (:data:`PROCESS_GROUPS`): ``dp`` is megatron-core's data-parallel group *with* context
parallelism (``parallel_state.get_data_parallel_group(with_context_parallel=True)``, the group DDP reduces
over), ``pp`` the pipeline group, ``tp`` the tensor-parallel group, ``ep`` the expert-parallel group.

**Launch points.** A launch point is a :class:`~megatron_energy.plan.Boundary`: an instruction and a
:class:`~megatron_energy.pipeline.collective_names.LaunchPoint` inside it (``None``: the instruction's
start):

* ``layer<k>`` (``layer_start(k)``): the start of the ``k``-th transformer layer of the instruction's chunk
  *in execution order* (0-based; a backward pass runs the chunk's layers last to first, so ``layer0`` of a
  backward is the chunk's last layer);
* ``end`` (``END``): the end of the instruction (after its last kernel, before the rank's next instruction);
* ``after_optimizer`` (``AFTER_OPTIMIZER``): after the optimizer step that follows the rank's last
  instruction of the iteration (the instruction named is that last instruction).

Per kind of class:

* *bucket* classes launch once per iteration per bucket; a plan holds exactly one action per bucket per rank.
  ``dp.reduce_scatter``/``dp.all_reduce`` bucket ``b`` of chunk ``c`` may launch at any layer boundary of the
  chunk's *last* backward instruction on the rank (the last microbatch's, the only one megatron-core reduces
  in) from the layer where the bucket's gradients are ready up to ``"end"``; megatron-core's
  ``--overlap-grad-reduce`` launches at the first of these, its default (no overlap) at ``"end"`` of the
  rank's last instruction. ``dp.all_gather`` bucket ``b`` launches either at ``"after_optimizer"``
  (megatron-core's default: synchronously inside the optimizer step) or at ``"layer0"`` of the chunk's
  *first* forward instruction (``--overlap-param-gather``: dispatched before the next iteration's forward,
  waited for before the chunk's first forward computes).
  Every chunk's buckets may also launch at ``"end"`` of the rank's *last* instruction, which is where
  megatron-core launches them without ``--overlap-grad-reduce`` (its default); that point is always the last
  of a bucket's launch points.
* *inline* classes are launched by megatron-core itself inside or between instructions (every layer, every
  microbatch): a plan holds one action per class per rank, at the rank's first instruction, whose
  ``max_ctas`` holds for the whole iteration. Its phase is ``None`` (NCCL, where megatron-core launches it)
  or, for the tensor-parallel classes only, ``gemm_overlap`` (``GEMM_OVERLAP``): split and overlapped with
  the GEMM it feeds or follows by Transformer Engine's userbuffers (``--tp-comm-overlap``, sequence
  parallelism required), ``max_ctas`` then being TE's ``num_sm`` for the class's userbuffers ops.

**CTA budgets.** ``max_ctas`` caps the CTAs (thread blocks; NCCL runs one per channel, one per SM) of the
collective's kernels: NCCL's per-communicator ``maxCTAs`` (``min_ctas``/``max_ctas`` in megatron-core's
``--nccl-communicator-config-path`` YAML), fixed when the communicator is created, so a class whose budget
differs from its group's default needs a communicator of its own. ``None`` means NCCL's default.
:data:`CTA_BUDGETS` lists the budgets a plan may use per class; NCCL accepts 1..64 (its channel limit).

**Bytes per launch** come from the workload model (:mod:`megatron_energy.pipeline.workload`): bf16
gradients and parameters, megatron-core's default bucket size ``max(40e6, 1e6 x dp)`` elements per bucket
(``--ddp-bucket-size``), hidden states ``2bsh`` bytes per microbatch (divided by TP with sequence
parallelism for pipeline transfers). ``bytes_per_launch`` is the size of the full (unsharded) buffer the
collective reduces or gathers; the traffic each GPU sends is ``traffic_factor x bytes_per_launch``.

Pure Python: no torch, megatron or NVML imports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.collective_levers import RuntimeLevers
from megatron_energy.pipeline.collective_names import (
    AFTER_OPTIMIZER,
    END,
    GEMM_OVERLAP,
    CollectiveName,
    CollectiveNameError,
    CollectiveOp,
    GroupName,
    layer_start,
)
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.pipeline.moe import ALL_TO_ALLS_PER_LAYER_PASS, all_to_all_bytes
from megatron_energy.pipeline.moe import layer_parameters as moe_layer_parameters
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.workload import BF16_BYTES, TransformerShape
from megatron_energy.plan import Boundary

Link = Literal["nvlink", "nic", "pcie"]

PROCESS_GROUPS: dict[str, str] = {
    "dp": "parallel_state.get_data_parallel_group(with_context_parallel=True)",
    "pp": "parallel_state.get_pipeline_model_parallel_group()",
    "tp": "parallel_state.get_tensor_model_parallel_group()",
    "ep": "parallel_state.get_expert_model_parallel_group()",
}
"""The megatron-core process group behind each group name."""

DEFAULT_BUCKET_ELEMENTS = 40_000_000
"""megatron-core's minimum DDP bucket size (elements); the default is ``max(40e6, 1e6 x dp)``."""

NCCL_DEFAULT_CTAS = 16
"""CTAs the model gives a collective whose ``max_ctas`` is ``None`` (NCCL's default): assumed; NCCL picks its
channel count from the topology, typically 16-32 on NVLink and fewer per NIC, and one CTA runs per channel."""

CTA_BUDGETS: dict[str, tuple[int, ...]] = {
    "dp.reduce_scatter": (1, 2, 4, 8, 16, 32),
    "dp.all_reduce": (1, 2, 4, 8, 16, 32),
    "dp.all_gather": (1, 2, 4, 8, 16, 32),
    "pp.send_recv": (1, 2, 4, 8, 16, 32),
    "tp.all_reduce": (4, 8, 16, 32),
    "tp.all_gather": (4, 8, 16, 32),
    "tp.reduce_scatter": (4, 8, 16, 32),
    "ep.all_to_all": (4, 8, 16, 32),
}
"""The CTA budgets a plan may give each class (besides ``None``, NCCL's default)."""


@dataclass(frozen=True)
class CollectiveClass:
    """One class of collectives (``<group>.<op>``) and how a plan may schedule it."""

    key: str
    """``<group>.<op>``."""
    group: GroupName
    """Process group name (:data:`PROCESS_GROUPS`)."""
    op: CollectiveOp
    """Collective operation."""
    per_bucket: bool
    """Bucket class (one launch per bucket per iteration, launch point chosen) or inline class."""
    cta_budgets: tuple[int, ...]
    """Allowed ``max_ctas`` besides ``None``."""


def traffic_factor(op: str, group_size: int) -> float:
    """Bytes each GPU sends per byte of the full buffer, for NCCL's ring algorithms.

    ``(n-1)/n`` for reduce-scatter and all-gather, ``2(n-1)/n`` for all-reduce, 1 for a send/recv; ``(n-1)/n``
    for an all-to-all of a GPU's buffer (the ``1/n`` bound for itself stays).
    """
    if group_size < 1:
        raise EnergyValueError(f"group size must be positive, got {group_size}")
    n = group_size
    if op == "send_recv":
        return 1.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    raise CollectiveNameError(f"unknown collective op {op!r}")


@dataclass(frozen=True)
class Collective:
    """One collective of one pipeline rank, with the bytes it moves and where it may launch."""

    name: CollectiveName
    """Its name (see the module docstring)."""
    stage: int
    """Pipeline rank."""
    cls: CollectiveClass
    """Its class."""
    group_size: int
    """GPUs in its process group."""
    bytes_per_launch: int
    """Bytes of the full buffer one launch reduces or gathers (or sends, for ``pp.send_recv``)."""
    launches_per_iteration: int
    """Launches per iteration on this rank (1 for a bucket; per microbatch and layer for inline classes)."""
    link: Link
    """The link its traffic crosses (its bandwidth is the job's, see :class:`CollectiveWorkload`)."""
    bandwidth_gbps: float
    """Bandwidth of that link per GPU and direction, GB/s."""
    launch_points: tuple[Boundary, ...]
    """Allowed launch points, earliest first; for inline classes the rank's first instruction (phase ``None``)
    and, for TP classes with sequence parallelism, the same with ``GEMM_OVERLAP``."""
    layers: tuple[int, int] = (0, 0)
    """Bucket classes: the chunk's layers (model order, ``[first, last)``) whose parameters the bucket holds;
    the embedding or output layer counts as a layer of its own just outside ``[0, L)``."""
    overlapped: bool = False
    """Inline classes: hidden behind other compute by the schedule (the expert all-to-all under the combined
    1F1B schedule) instead of exposed inside its instructions; ``False``: on the critical path."""

    @property
    def traffic_bytes(self) -> float:
        """Bytes each GPU sends per launch."""
        return traffic_factor(self.cls.op, self.group_size) * self.bytes_per_launch


@dataclass(frozen=True)
class MeasuredBucket:
    """One DDP bucket group as megatron-core laid it out on a running job (``megatron.bucket_layout``)."""

    stage: int
    """Pipeline rank."""
    chunk: int
    """Model chunk."""
    index: int
    """megatron-core's bucket index inside the chunk (the ``bucket<b>`` of its name)."""
    layers: tuple[int, int]
    """Model layers of the chunk its parameters sit in, ``[first, last)``; the embedding is layer -1, the
    output layer ``L`` (as :attr:`Collective.layers`)."""
    elements: int
    """Gradient elements it reduces."""


@dataclass(frozen=True)
class CollectiveWorkload:
    """What the collectives of a job are built from (job shape, parallelism, links).

    Attributes:
        shape: Model shape with the job's micro-batch size and TP degree.
        orders: Every rank's executed instruction order.
        data_parallel: Data-parallel size (with context parallelism).
        sequence_parallel: Megatron's sequence parallelism (TP all-gather/reduce-scatter instead of
            all-reduce; pipeline transfers split by TP).
        distributed_optimizer: ``--use-distributed-optimizer`` (gradient reduce-scatter and parameter
            all-gather instead of one all-reduce).
        bucket_elements: DDP bucket size in elements; ``None``: megatron-core's ``max(40e6, 1e6 x dp)``.
        dp_link: Link the data-parallel group crosses.
        dp_bandwidth_gbps: Its bandwidth per GPU and direction.
        pp_link: Link pipeline transfers cross.
        pp_bandwidth_gbps: Its bandwidth.
        tp_bandwidth_gbps: Bandwidth of the tensor-parallel group (NVLink inside a node).
        ep_link: Link the expert-parallel group crosses (MoE models).
        ep_bandwidth_gbps: Its bandwidth; ``None``: ``tp_bandwidth_gbps`` (NVLink).
        levers: What the running job lets a plan change (``pipeline.collective_levers``); ``None`` when
            planning offline, every lever free.
        measured_buckets: The running job's DDP bucket layout (every pipeline rank's); ``None``: modelled
            from the bucket size.
    """

    shape: TransformerShape
    orders: PipelineOrders
    data_parallel: int
    sequence_parallel: bool
    distributed_optimizer: bool
    dp_link: Link
    dp_bandwidth_gbps: float
    pp_link: Link
    pp_bandwidth_gbps: float
    tp_bandwidth_gbps: float
    ep_link: Link = "nvlink"
    ep_bandwidth_gbps: float | None = None
    bucket_elements: int | None = None
    levers: RuntimeLevers | None = None
    measured_buckets: tuple[MeasuredBucket, ...] | None = None

    @property
    def layers_per_chunk(self) -> int:
        """Transformer layers per model chunk."""
        return self.shape.num_layers // (self.orders.num_stages * self.orders.num_chunks)

    @property
    def bucket_size(self) -> int:
        """Elements per DDP bucket."""
        if self.bucket_elements is not None:
            return self.bucket_elements
        return max(DEFAULT_BUCKET_ELEMENTS, 1_000_000 * self.data_parallel)


def layer_parameters(shape: TransformerShape) -> float:
    """Parameters of one transformer layer on one GPU (norms and biases ignored).

    Attention and a dense MLP are split over the tensor-parallel group; an MoE layer's router and local
    experts are whole on the GPU (``pipeline.moe.layer_parameters``).
    """
    h, f = shape.hidden_size, shape.ffn_hidden_size
    kv_width = shape.query_groups * (h // shape.num_attention_heads)
    attention = (h * (h + 2 * kv_width) + h * h) / shape.tensor_parallel
    if shape.moe is not None:
        return attention + moe_layer_parameters(shape, shape.moe)
    return attention + h * f * (3 if shape.gated_mlp else 2) / shape.tensor_parallel


def edge_parameters(shape: TransformerShape) -> float:
    """Parameters of the embedding (first chunk) or output layer (last chunk) on one TP rank."""
    return shape.vocab_size * shape.hidden_size / shape.tensor_parallel


def chunk_parameter_layers(workload: CollectiveWorkload, stage: int, chunk: int) -> list[float]:
    """Parameters per layer of one chunk in model order, the embedding / output layer included as layers.

    The embedding comes first on stage 0 chunk 0, the output layer last on the last stage's last chunk.
    """
    orders = workload.orders
    per_layer = layer_parameters(workload.shape)
    layers = [per_layer] * workload.layers_per_chunk
    if stage == 0 and chunk == 0:
        layers = [edge_parameters(workload.shape), *layers]
    if stage == orders.num_stages - 1 and chunk == orders.num_chunks - 1:
        layers = [*layers, edge_parameters(workload.shape)]
    return layers


def build_collectives(workload: CollectiveWorkload) -> list[Collective]:
    """Every collective of every pipeline rank of the job (see the module docstring).

    Returns:
        Per rank: its DP buckets (reduce-scatter or all-reduce, and all-gather with the distributed
        optimizer), its pipeline transfers (with more than one stage) and its TP collectives (with TP > 1).
    """
    result: list[Collective] = []
    for stage in range(workload.orders.num_stages):
        if workload.data_parallel > 1:
            result += _bucket_collectives(workload, stage)
        result += _inline_collectives(workload, stage)
    return result


def _collective_class(group: GroupName, op: CollectiveOp, per_bucket: bool) -> CollectiveClass:
    key = f"{group}.{op}"
    return CollectiveClass(key, group, op, per_bucket, CTA_BUDGETS[key])


def _buckets(layers: Sequence[float], bucket_size: int) -> list[tuple[int, int, float]]:
    """Buckets over the chunk's parameters in reverse model order: (first layer, last layer + 1, elements).

    Parameters fill buckets from the chunk's last layer backwards; a bucket spans the layers it touches.
    """
    buckets: list[tuple[int, int, float]] = []
    total = sum(layers)
    count = max(1, math.ceil(total / bucket_size - 1e-9))
    bounds = [0.0]
    for value in reversed(layers):
        bounds.append(bounds[-1] + value)
    # bounds[i]: elements of the last i layers; bucket j covers [j*B, min((j+1)*B, total)).
    n = len(layers)
    for j in range(count):
        low, high = j * bucket_size, min((j + 1) * bucket_size, total)
        first_rev = next(i for i in range(n) if bounds[i + 1] > low)
        last_rev = next(i for i in range(n) if bounds[i + 1] >= high - 1e-6)
        buckets.append((n - 1 - last_rev, n - first_rev, high - low))
    return buckets


def _bucket_collectives(workload: CollectiveWorkload, stage: int) -> list[Collective]:
    orders = workload.orders
    order = orders.stage(stage)
    ops: list[CollectiveOp] = (
        ["reduce_scatter", "all_gather"] if workload.distributed_optimizer else ["all_reduce"]
    )
    virtual = orders.num_chunks > 1
    result = []
    for chunk in range(orders.num_chunks):
        layers = chunk_parameter_layers(workload, stage, chunk)
        offset = 1 if stage == 0 and chunk == 0 else 0  # the embedding is layer -1 of chunk 0
        last_backward = [i for i in order if i.chunk == chunk and i.kind == "backward"][-1]
        first_forward = next(i for i in order if i.chunk == chunk and i.kind == "forward")
        for index, model_layers, elements in _chunk_buckets(workload, stage, chunk, layers, offset):
            for op in ops:
                cls = _collective_class("dp", op, per_bucket=True)
                points: tuple[Boundary, ...]
                if op == "all_gather":
                    points = (
                        Boundary(order[-1], AFTER_OPTIMIZER),
                        Boundary(first_forward, layer_start(0)),
                    )
                else:
                    points = _reduce_launch_points(last_backward, model_layers, workload.layers_per_chunk)
                    if last_backward != order[-1]:
                        points += (Boundary(order[-1], END),)
                result.append(
                    Collective(
                        name=CollectiveName("dp", op, chunk if virtual else None, index),
                        stage=stage,
                        cls=cls,
                        group_size=workload.data_parallel,
                        bytes_per_launch=round(elements * BF16_BYTES),
                        launches_per_iteration=1,
                        link=workload.dp_link,
                        bandwidth_gbps=workload.dp_bandwidth_gbps,
                        launch_points=points,
                        layers=model_layers,
                    )
                )
    return result


def _chunk_buckets(
    workload: CollectiveWorkload, stage: int, chunk: int, layers: Sequence[float], offset: int
) -> list[tuple[int, tuple[int, int], float]]:
    """``(bucket index, model layers, elements)`` of one chunk's buckets.

    Measured where the workload has the job's layout (:class:`MeasuredBucket`), else modelled from the bucket
    size.
    """
    if workload.measured_buckets is not None:
        measured = [b for b in workload.measured_buckets if (b.stage, b.chunk) == (stage, chunk)]
        return [(b.index, b.layers, float(b.elements)) for b in sorted(measured, key=lambda b: b.index)]
    modelled = _buckets(layers, workload.bucket_size)
    return [(i, (first - offset, last - offset), n) for i, (first, last, n) in enumerate(modelled)]


def ready_layer(model_layers: tuple[int, int], num_layers: int) -> int:
    """Layers of a backward pass done (execution order) when a bucket holding ``model_layers`` is ready.

    The backward pass runs layers ``L-1 .. 0``; the bucket is ready once its first (lowest) layer is done.
    An embedding (layer -1) is done with the instruction; an output layer (layer L) before layer0 starts.
    """
    first = max(model_layers[0], 0)
    return min(num_layers, num_layers - first)


def _reduce_launch_points(
    instruction: Instruction, model_layers: tuple[int, int], num_layers: int
) -> tuple[Boundary, ...]:
    """Layer boundaries of the chunk's last backward from the bucket's readiness to the end."""
    ready = ready_layer(model_layers, num_layers)
    if model_layers[0] < 0:  # the embedding's gradient is ready only at the end
        ready = num_layers
    phases = [layer_start(k) for k in range(ready, num_layers)] + [END]
    return tuple(Boundary(instruction, phase) for phase in phases)


def _inline_collectives(workload: CollectiveWorkload, stage: int) -> list[Collective]:
    orders = workload.orders
    first = Boundary(orders.stage(stage)[0])
    shape = workload.shape
    hidden_bytes = shape.activation_bytes()
    passes = 2 * orders.num_microbatches * orders.num_chunks  # forward and backward of every microbatch
    layers = workload.layers_per_chunk
    result = []
    if orders.num_stages > 1:
        split = shape.tensor_parallel if workload.sequence_parallel else 1
        # One send or receive per pass except at the pipeline's ends; counted as one launch per pass.
        result.append(
            Collective(
                name=CollectiveName("pp", "send_recv"),
                stage=stage,
                cls=_collective_class("pp", "send_recv", per_bucket=False),
                group_size=2,
                bytes_per_launch=hidden_bytes // split,
                launches_per_iteration=passes,
                link=workload.pp_link,
                bandwidth_gbps=workload.pp_bandwidth_gbps,
                launch_points=(first,),
            )
        )
    if shape.tensor_parallel > 1:
        ops: list[CollectiveOp] = (
            ["all_gather", "reduce_scatter"] if workload.sequence_parallel else ["all_reduce"]
        )
        for op in ops:
            # Two per layer and pass (attention and MLP), as in the workload model; with sequence parallelism
            # two all-gathers and two reduce-scatters.
            result.append(
                Collective(
                    name=CollectiveName("tp", op),
                    stage=stage,
                    cls=_collective_class("tp", op, per_bucket=False),
                    group_size=shape.tensor_parallel,
                    bytes_per_launch=hidden_bytes,
                    launches_per_iteration=2 * layers * passes,
                    link="nvlink",
                    bandwidth_gbps=workload.tp_bandwidth_gbps,
                    launch_points=(first, first._replace(phase=GEMM_OVERLAP))
                    if workload.sequence_parallel
                    else (first,),
                )
            )
    moe = shape.moe
    if moe is not None and moe.expert_parallel > 1:
        result.append(
            Collective(
                name=CollectiveName("ep", "all_to_all"),
                stage=stage,
                cls=_collective_class("ep", "all_to_all", per_bucket=False),
                group_size=moe.expert_parallel,
                bytes_per_launch=all_to_all_bytes(shape, moe),
                launches_per_iteration=ALL_TO_ALLS_PER_LAYER_PASS * layers * passes,
                link=workload.ep_link,
                bandwidth_gbps=workload.ep_bandwidth_gbps or workload.tp_bandwidth_gbps,
                launch_points=(first,),
                overlapped=moe.overlapped_all_to_all,
            )
        )
    return result
