"""Mixture-of-experts layers: router, experts and the expert-parallel all-to-all, per GPU (*modelled*).

A job with ``moe`` (:class:`MoeShape`) replaces every decoder layer's dense MLP by megatron-core's
``MoELayer`` with the ``alltoall`` token dispatcher and experts whole on each expert-parallel rank
(``--expert-tensor-parallel-size 1``). Per layer and microbatch on one GPU, with ``t = bs / TP`` the tokens it
holds (megatron-core requires sequence parallelism for MoE with TP > 1, so each TP rank holds ``1/TP`` of the
sequence), ``E`` experts, top-``k`` routing, expert FFN width ``f_e`` and hidden size ``h``:

* router GEMM, forward: ``2thE`` FLOPs; its softmax/top-k: ``ROUTER_PASSES`` fp32 passes over ``tE`` scores;
* experts, forward: ``2tk·h·f_e·m`` FLOPs (``m`` = 3 gated, else 2), activation ``m-1`` bf16 passes over
  ``tk·f_e`` elements (as the dense MLP's); balanced routing gives every rank the same share whatever EP is;
* permute and unpermute: each reads and writes ``tkh`` bf16 elements;
* the all-to-all (:func:`all_to_all_bytes`): ``dispatch`` sends every token to its ``k`` experts' ranks and
  ``combine`` brings the results back, ``tkh`` bf16 elements each; the backward pass runs both again
  (the gradients), so ``ALL_TO_ALLS_PER_LAYER_PASS`` = 2 per layer and pass. A GPU keeps the ``1/EP`` of the
  copies bound for its own experts: it sends ``(EP-1)/EP`` of the bytes, at the spec's P2P latency plus
  bytes over the expert-parallel link's bandwidth (NVLink inside a node; the job's
  ``all_to_all_bandwidth_gbps`` where the group spans nodes).

The all-to-all is on the critical path (the layer waits for its tokens) unless the job overlaps it
(megatron-core's combined 1F1B schedule, ``--overlap-moe-expert-parallel-comm``:
:attr:`MoeShape.overlapped_all_to_all`, which only that schedule sets).
Backward passes cost twice the forward's FLOPs and bytes, as the dense layers' do.

Pure Python: no torch, megatron or NVML imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class MicrobatchShape(Protocol):
    """What the formulas read of ``pipeline.workload.TransformerShape`` (which holds a :class:`MoeShape`)."""

    @property
    def hidden_size(self) -> int: ...  # noqa: D102
    @property
    def ffn_hidden_size(self) -> int: ...  # noqa: D102
    @property
    def seq_length(self) -> int: ...  # noqa: D102
    @property
    def micro_batch_size(self) -> int: ...  # noqa: D102
    @property
    def tensor_parallel(self) -> int: ...  # noqa: D102
    @property
    def gated_mlp(self) -> bool: ...  # noqa: D102


ALL_TO_ALLS_PER_LAYER_PASS = 2
"""All-to-alls per MoE layer and pass: dispatch and combine (forward), their gradients (backward)."""

ROUTER_PASSES = 4
"""fp32 passes over the router's ``tokens x experts`` scores (softmax, top-k, probabilities, gradient)."""

ELEMENT_BYTES = 2
"""bf16 activations."""

SCORE_BYTES = 4
"""fp32 router scores."""


@dataclass(frozen=True)
class MoeShape:
    """The MoE layers of a model and how their experts are spread (module docstring)."""

    num_experts: int
    """Experts per MoE layer (``--num-experts``)."""

    topk: int
    """Experts each token is routed to (``--moe-router-topk``)."""

    expert_parallel: int = 1
    """GPUs a layer's experts are split over (``--expert-model-parallel-size``); all-to-all group size."""

    ffn_hidden_size: int | None = None
    """One expert's FFN width (``--moe-ffn-hidden-size``); ``None``: the model's ``ffn_hidden_size``."""

    all_to_all_bandwidth_gbps: float | None = None
    """Bandwidth per GPU and direction of the link the expert-parallel group crosses, GB/s; ``None``: the
    GPU spec's NVLink (the group inside a node)."""

    overlapped_all_to_all: bool = False
    """Whether the schedule hides the all-to-all behind another microbatch's compute (only the combined 1F1B
    schedule does); ``False``: on the critical path."""

    def __post_init__(self) -> None:
        for name in ("num_experts", "topk", "expert_parallel", "ffn_hidden_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"moe.{name} must be a positive integer, got {value!r}")
        if self.topk > self.num_experts:
            raise ValueError(
                f"moe.topk {self.topk} exceeds moe.num_experts {self.num_experts}: route each token to at "
                "most num_experts experts"
            )
        if self.num_experts % self.expert_parallel:
            raise ValueError(
                f"moe.num_experts {self.num_experts} is not a multiple of moe.expert_parallel "
                f"{self.expert_parallel}: megatron-core puts num_experts / expert_parallel experts per rank"
            )
        bandwidth = self.all_to_all_bandwidth_gbps
        if bandwidth is not None and (isinstance(bandwidth, bool) or not isinstance(bandwidth, int | float)):
            raise ValueError(f"moe.all_to_all_bandwidth_gbps must be a positive number, got {bandwidth!r}")
        if bandwidth is not None and bandwidth <= 0:
            raise ValueError(f"moe.all_to_all_bandwidth_gbps must be a positive number, got {bandwidth!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MoeShape:
        """An MoE shape from a mapping of its fields (a job file's ``moe:``, or ``dataclasses.asdict``).

        Raises:
            ValueError: On unknown or missing fields (the message names them and the allowed ones).
        """
        allowed = sorted(cls.__dataclass_fields__)
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ValueError(f"moe has unknown key(s) {unknown}; allowed: {allowed}")
        missing = [key for key in ("num_experts", "topk") if key not in data]
        if missing:
            raise ValueError(f"moe is missing {missing}, e.g. moe: {{num_experts: 8, topk: 2}}")
        return cls(**data)

    def expert_ffn(self, shape: MicrobatchShape) -> int:
        """One expert's FFN width."""
        return self.ffn_hidden_size or shape.ffn_hidden_size


def tokens_per_gpu(shape: MicrobatchShape) -> float:
    """Tokens of one microbatch one GPU holds at an MoE layer: ``bs / TP`` (module docstring)."""
    return shape.micro_batch_size * shape.seq_length / shape.tensor_parallel


def _mlp_matrices(shape: MicrobatchShape) -> int:
    return 3 if shape.gated_mlp else 2


def all_to_all_bytes(shape: MicrobatchShape, moe: MoeShape) -> int:
    """Bytes of one dispatch (or combine) all-to-all of one microbatch on one GPU: ``t·k·h`` bf16 elements.

    That is the buffer the all-to-all exchanges (its ``bytes_per_launch``); the GPU sends
    ``(EP-1)/EP`` of it (``pipeline.collectives.traffic_factor``).
    """
    return round(ELEMENT_BYTES * tokens_per_gpu(shape) * moe.topk * shape.hidden_size)


def all_to_all_s(shape: MicrobatchShape, moe: MoeShape, latency_s: float, bandwidth_gbps: float) -> float:
    """Time of one all-to-all at ``bandwidth_gbps`` (0 with one expert-parallel rank: nothing crosses)."""
    ep = moe.expert_parallel
    if ep == 1:
        return 0.0
    return latency_s + (ep - 1) / ep * all_to_all_bytes(shape, moe) / (bandwidth_gbps * 1e9)


def router_flops(shape: MicrobatchShape, moe: MoeShape) -> float:
    """Forward FLOPs of the router GEMM on one GPU."""
    return 2 * tokens_per_gpu(shape) * shape.hidden_size * moe.num_experts


def expert_flops(shape: MicrobatchShape, moe: MoeShape) -> float:
    """Forward FLOPs of the experts' GEMMs on one GPU (FC1 and FC2 of the ``k`` experts of each token)."""
    t, h = tokens_per_gpu(shape), shape.hidden_size
    return 2 * t * moe.topk * h * moe.expert_ffn(shape) * _mlp_matrices(shape)


def router_bytes(shape: MicrobatchShape, moe: MoeShape) -> float:
    """Forward bytes of the router's softmax and top-k (fp32 scores)."""
    return ROUTER_PASSES * SCORE_BYTES * tokens_per_gpu(shape) * moe.num_experts


def permute_bytes(shape: MicrobatchShape, moe: MoeShape) -> float:
    """Forward bytes of permute or of unpermute (each reads and writes ``t·k·h`` elements)."""
    return 2 * ELEMENT_BYTES * tokens_per_gpu(shape) * moe.topk * shape.hidden_size


def activation_bytes(shape: MicrobatchShape, moe: MoeShape) -> float:
    """Forward bytes of the experts' activation function (as the dense MLP's, over ``t·k·f_e`` elements)."""
    elements = (_mlp_matrices(shape) - 1) * tokens_per_gpu(shape) * moe.topk * moe.expert_ffn(shape)
    return ELEMENT_BYTES * elements


def layer_parameters(shape: MicrobatchShape, moe: MoeShape) -> float:
    """MLP parameters of one MoE layer on one GPU: the router plus its ``E / EP`` whole experts."""
    h = shape.hidden_size
    local_experts = moe.num_experts // moe.expert_parallel
    return h * moe.num_experts + local_experts * h * moe.expert_ffn(shape) * _mlp_matrices(shape)
