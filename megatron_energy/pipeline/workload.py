"""Work of transformer pipeline instructions from FLOP and byte counts (*modelled*).

Per transformer layer and microbatch (``b`` micro-batch size, ``s`` sequence length, ``h`` hidden size,
``f`` FFN hidden size, ``g·d`` key/value width with ``g`` query groups of head size ``d``), on one
tensor-parallel rank (everything below divided by the TP degree unless marked replicated):

* GEMM FLOPs, forward: ``2bsh(h + 2gd)`` (QKV) + ``2bsh²`` (projection) + ``2bshf·k`` (MLP, k = 2, or 3 with a
  gated MLP). With ``g·d = h``, ``f = 4h`` this is the standard ``24bsh²``.
* Attention FLOPs, forward: ``4bs²h`` (scores and values).
* Memory-bound bytes, forward (bf16): norms, residual adds, bias/dropout and rotary ``16bsh`` elements
  (replicated, no sequence parallelism) plus the activation function ``2bsf`` (``3bsf`` gated).
* Backward: twice the forward FLOPs and bytes.
* Fixed time: tensor-parallel all-reduces (two per layer and pass, ring, over the spec's NVLink bandwidth) and
  kernel launch gaps.

Every instruction's compute-bound time carries its kernel classes
(:class:`~megatron_energy.dvfs.kernel_classes.ClassMix`): the decoder layers' GEMMs in the job's layer GEMM
class (``params_dtype``, or fp8 with ``fp8``), the LM head's and the MoE router's in the parameters' class,
attention in ``attention``; each GEMM class at its own tensor-core peak
(:mod:`megatron_energy.pipeline.precision`). Memory-bound time stays the memory term, communication the fixed
time.

With ``moe`` the dense MLP's GEMMs and activation give way to an MoE layer's router, experts, permute and
unpermute, and its expert-parallel all-to-alls (dispatch and combine) join the fixed time unless overlapped:
:mod:`megatron_energy.pipeline.moe` has their formulas.

The embedding (gather, and its gradient) runs on the first stage's first chunk; the final norm, LM head GEMM
(``2bshV``) and the vocab-parallel cross-entropy (fp32 passes over ``bsV`` logits) on the last stage's last
chunk. So first and last stages carry more work than the middle ones, as in real pipelines. Decoder layers
are split evenly over the model chunks, or as ``--pipeline-model-parallel-layout`` places them
(:class:`~megatron_energy.pipeline.chunk_layers.ChunkLayers`).

Achieved-efficiency assumptions (relative to the peak at the clock the work runs at; the power cap is applied
separately by :class:`~megatron_energy.dvfs.model.GpuPowerModel`):

* ``GEMM_EFFICIENCY`` 0.80: the measured H200 bf16 8192³ GEMM reached ~678 TFLOP/s at ~1515 MHz, i.e. ~0.90 of
  the clock-scaled 989 TFLOP/s peak; transformer GEMMs are smaller. With power-cap throttling this gives
  ~60-65 % of the nominal peak, the usual training GEMM figure.
* ``ATTENTION_EFFICIENCY`` 0.60: fused (flash) attention reaches roughly 50-70 % of peak on Hopper.
* ``MEMORY_EFFICIENCY`` 0.80: the measured H200 copy loop reached 4.25 of 4.8 TB/s (0.89); elementwise
  kernels do a little worse.
* ``LAUNCH_GAP_S`` 2 µs per kernel, ~12 kernels per layer forward and ~24 backward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from megatron_energy.dvfs.kernel_classes import ClassMix, KernelClass
from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.chunk_layers import ChunkLayers
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.moe import (
    ALL_TO_ALLS_PER_LAYER_PASS,
    MoeShape,
    activation_bytes,
    all_to_all_s,
    expert_flops,
    permute_bytes,
    router_bytes,
    router_flops,
)
from megatron_energy.pipeline.precision import PEAK_OVER_BF16, layer_gemm_class, params_gemm_class

GEMM_EFFICIENCY = 0.80
ATTENTION_EFFICIENCY = 0.60
MEMORY_EFFICIENCY = 0.80
LAUNCH_GAP_S = 2e-6
KERNELS_PER_LAYER = {"forward": 12, "backward": 24}
BACKWARD_TO_FORWARD = 2.0
BF16_BYTES = 2
FP32_BYTES = 4


@dataclass(frozen=True)
class TransformerShape:
    """Shape of a GPT/Llama-style decoder and the per-rank microbatch it processes.

    Attributes:
        num_layers: Transformer layers in the whole model.
        hidden_size: Model width ``h``.
        ffn_hidden_size: MLP inner width ``f``.
        num_attention_heads: Attention heads.
        seq_length: Tokens per sequence ``s``.
        micro_batch_size: Sequences per microbatch ``b``.
        vocab_size: Vocabulary size ``V``.
        tensor_parallel: Tensor-parallel degree (FLOPs and sharded bytes are divided by it).
        num_query_groups: Key/value heads for grouped-query attention; None means one per attention head.
        gated_mlp: Whether the MLP is gated (SwiGLU: three weight matrices instead of two; the experts' too).
        moe: The MoE layers replacing every layer's dense MLP (:mod:`megatron_energy.pipeline.moe`);
            ``None``: a dense model.
        params_dtype: The parameters' dtype, ``bf16``, ``fp16`` or ``fp32`` (``--bf16``, ``--fp16``, neither).
        fp8: Whether the decoder layers' linear layers run fp8 matrix products (``--fp8-format``).
    """

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    seq_length: int
    micro_batch_size: int
    vocab_size: int
    tensor_parallel: int = 1
    num_query_groups: int | None = None
    gated_mlp: bool = False
    moe: MoeShape | None = None
    params_dtype: str = "bf16"
    fp8: bool = False

    def __post_init__(self) -> None:
        if self.moe is not None and not isinstance(self.moe, MoeShape):
            raise ValueError(f"TransformerShape.moe must be a MoeShape or None, got {self.moe!r}")
        params_gemm_class(self.params_dtype)
        if not isinstance(self.fp8, bool):
            raise ValueError(f"TransformerShape.fp8 must be true or false, got {self.fp8!r}")
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
                raise ValueError(f"TransformerShape.{item.name} must be positive, got {value}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.query_groups:
            raise ValueError("num_attention_heads must be divisible by num_query_groups")

    @property
    def layer_gemm_class(self) -> KernelClass:
        """The class of the decoder layers' linear GEMMs (QKV, projection, MLP, experts)."""
        return layer_gemm_class(self.params_dtype, self.fp8)

    @property
    def params_gemm_class(self) -> KernelClass:
        """The class of the LM head's and the MoE router's GEMMs (the parameters' dtype)."""
        return params_gemm_class(self.params_dtype)

    def identity(self) -> dict[str, Any]:
        """The shape's fields for a fingerprint.

        The precision fields only where not the default (bf16, no fp8), so that jobs described before they
        existed keep their fingerprints.
        """
        fields = dataclasses.asdict(self)
        if self.params_dtype == "bf16" and not self.fp8:
            del fields["params_dtype"], fields["fp8"]
        return fields

    def layer_forward_gemm_flops_by_class(self) -> dict[KernelClass, float]:
        """:meth:`layer_forward_gemm_flops` per GEMM class: the router's in the params', the rest layers'."""
        flops = self.layer_forward_gemm_flops()
        if self.moe is None or self.layer_gemm_class == self.params_gemm_class:
            return {self.layer_gemm_class: flops}
        router = router_flops(self, self.moe)
        return {self.layer_gemm_class: flops - router, self.params_gemm_class: router}

    @property
    def query_groups(self) -> int:
        """Key/value heads (equal to the attention heads without grouped-query attention)."""
        return self.num_query_groups or self.num_attention_heads

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerShape:
        """A shape from a mapping of its fields (``dataclasses.asdict`` of one, or a job file's ``model``).

        Raises:
            ValueError: If a field is unknown or invalid (the MoE section's errors name ``moe.<key>``).
            TypeError: If a required field is missing.
        """
        fields = dict(data)
        moe = fields.pop("moe", None)
        return cls(**fields, moe=None if moe is None else MoeShape.from_dict(moe))

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> TransformerShape:
        """Return a known model shape, optionally with fields overridden (e.g. ``micro_batch_size=2``).

        Args:
            name: One of :data:`KNOWN_SHAPES` (``"gpt3-1.3b"``, ``"llama-7b"``, ``"llama-70b"``, ...).
            **overrides: TransformerShape fields to replace.

        Raises:
            ValueError: If the name is unknown (the message lists the known names).
        """
        if name not in KNOWN_SHAPES:
            raise ValueError(f"unknown model shape {name!r}; known: {', '.join(sorted(KNOWN_SHAPES))}")
        return dataclasses.replace(KNOWN_SHAPES[name], **overrides)

    def layer_forward_gemm_flops(self) -> float:
        """GEMM FLOPs of one layer's forward pass on one TP rank."""
        b, s, h, f = self.micro_batch_size, self.seq_length, self.hidden_size, self.ffn_hidden_size
        kv_width = self.query_groups * (h // self.num_attention_heads)
        attention = (2 * b * s * h * (h + 2 * kv_width) + 2 * b * s * h * h) / self.tensor_parallel
        if self.moe is not None:
            return attention + router_flops(self, self.moe) + expert_flops(self, self.moe)
        mlp_matrices = 3 if self.gated_mlp else 2
        return attention + 2 * b * s * h * f * mlp_matrices / self.tensor_parallel

    def layer_forward_attention_flops(self) -> float:
        """Attention (scores and values) FLOPs of one layer's forward pass on one TP rank."""
        b, s, h = self.micro_batch_size, self.seq_length, self.hidden_size
        return 4 * b * s * s * h / self.tensor_parallel

    def layer_forward_memory_bytes(self) -> float:
        """Bytes moved by memory-bound kernels of one layer's forward pass on one TP rank."""
        b, s, h, f = self.micro_batch_size, self.seq_length, self.hidden_size, self.ffn_hidden_size
        elementwise = BF16_BYTES * 16 * b * s * h
        if self.moe is not None:
            moe = self.moe
            return (
                elementwise
                + router_bytes(self, moe)
                + 2 * permute_bytes(self, moe)
                + activation_bytes(self, moe)
            )
        activation_elements = (3 if self.gated_mlp else 2) * b * s * f / self.tensor_parallel
        return elementwise + BF16_BYTES * activation_elements

    def layer_all_to_all_s(self, spec: GpuSpec) -> float:
        """Exposed expert all-to-all time of one MoE layer's pass (0 without MoE or when overlapped)."""
        moe = self.moe
        if moe is None or moe.overlapped_all_to_all:
            return 0.0
        bandwidth_gbps = moe.all_to_all_bandwidth_gbps or spec.nvlink_bandwidth_gbps
        return ALL_TO_ALLS_PER_LAYER_PASS * all_to_all_s(self, moe, spec.p2p_latency_s, bandwidth_gbps)

    def activation_bytes(self) -> int:
        """Bytes of one microbatch's hidden states sent between pipeline stages (bf16)."""
        return BF16_BYTES * self.micro_batch_size * self.seq_length * self.hidden_size


KNOWN_SHAPES: dict[str, TransformerShape] = {
    "gpt3-1.3b": TransformerShape(24, 2048, 8192, 16, 2048, 1, 50257),
    "gpt3-2.7b": TransformerShape(32, 2560, 10240, 32, 2048, 1, 50257),
    "gpt3-6.7b": TransformerShape(32, 4096, 16384, 32, 2048, 1, 50257),
    "llama-7b": TransformerShape(32, 4096, 11008, 32, 4096, 1, 32000, gated_mlp=True),
    "llama-13b": TransformerShape(40, 5120, 13824, 40, 4096, 1, 32000, gated_mlp=True),
    "llama-70b": TransformerShape(80, 8192, 28672, 64, 4096, 1, 32000, num_query_groups=8, gated_mlp=True),
}


def instruction_work(
    shape: TransformerShape,
    spec: GpuSpec,
    num_stages: int,
    num_chunks: int = 1,
    layers: ChunkLayers | None = None,
) -> dict[Work, WorkProfile]:
    """Work of every pipeline instruction class ``Work(stage, chunk, kind)`` at the spec's maximum clock.

    Each carries the spec's ``workload_activity_scale``: its compute kernels draw that share of their classes'
    calibrated activity (a training step's products are smaller than a calibration's).

    Args:
        shape: Model shape and microbatch.
        spec: The GPU.
        num_stages: Pipeline stages.
        num_chunks: Model chunks per stage.
        layers: Decoder layers of every chunk (``--pipeline-model-parallel-layout``); ``None``: Megatron's
            even split of ``shape.num_layers`` over ``num_stages x num_chunks`` chunks.

    Raises:
        ValueError: If the layers do not split evenly (without ``layers``), ``layers`` has another number of
            stages, chunks or layers than the job, or the counts are not positive.
    """
    if layers is None:
        layers = ChunkLayers.even(shape.num_layers, num_stages, num_chunks)
    elif (layers.num_stages, layers.num_chunks, layers.num_layers) != (
        num_stages,
        num_chunks,
        shape.num_layers,
    ):
        raise ValueError(
            f"the layer layout ({layers.describe()}) does not fit {num_stages} stages x {num_chunks} chunks "
            f"and {shape.num_layers} layers"
        )
    work: dict[Work, WorkProfile] = {}
    for stage in range(num_stages):
        for chunk in range(num_chunks):
            for kind in ("forward", "backward"):
                total = _layer_work(shape, spec, kind).scaled(layers.of(stage, chunk))
                if stage == 0 and chunk == 0:
                    total = total + _embedding_work(shape, spec, kind)
                if stage == num_stages - 1 and chunk == num_chunks - 1:
                    total = total + _head_work(shape, spec, kind)
                work[Work(stage, chunk, kind)] = dataclasses.replace(
                    total, activity_scale=spec.workload_activity_scale
                )
    return work


def instruction_mixes(
    shape: TransformerShape,
    spec: GpuSpec,
    num_stages: int,
    num_chunks: int = 1,
    layers: ChunkLayers | None = None,
) -> dict[Work, ClassMix]:
    """The kernel classes of every instruction class's compute-bound time (:func:`instruction_work`'s)."""
    works = instruction_work(shape, spec, num_stages, num_chunks, layers)
    return {key: work.compute_mix for key, work in works.items() if work.compute_mix is not None}


def _pass_factor(kind: str) -> float:
    """How many forward-equivalents of FLOPs and bytes a pass of ``kind`` costs."""
    return BACKWARD_TO_FORWARD if kind == "backward" else 1.0


def _gemm_s(
    spec: GpuSpec, flops: float, efficiency: float, gemm_class: KernelClass = KernelClass.GEMM_BF16
) -> float:
    """Time of ``flops`` of tensor-core work at the maximum clock, at ``gemm_class``'s peak."""
    return flops / (spec.peak_bf16_tflops * 1e12 * PEAK_OVER_BF16[gemm_class] * efficiency)


def _memory_s(spec: GpuSpec, num_bytes: float) -> float:
    """Time to stream ``num_bytes`` through HBM."""
    return num_bytes / (spec.memory_bandwidth_gbps * 1e9 * MEMORY_EFFICIENCY)


def tp_all_reduce_s(shape: TransformerShape, spec: GpuSpec) -> float:
    """Time of one ring all-reduce of the hidden states over the tensor-parallel group."""
    if shape.tensor_parallel == 1:
        return 0.0
    traffic = 2 * (shape.tensor_parallel - 1) / shape.tensor_parallel * shape.activation_bytes()
    return spec.p2p_latency_s + traffic / (spec.p2p_bandwidth_gbps * 1e9)


def _layer_work(shape: TransformerShape, spec: GpuSpec, kind: str) -> WorkProfile:
    """Work of one transformer layer's forward or backward pass."""
    factor = _pass_factor(kind)
    times = [
        (gemm_class, _gemm_s(spec, flops, GEMM_EFFICIENCY, gemm_class))
        for gemm_class, flops in shape.layer_forward_gemm_flops_by_class().items()
    ]
    times.append(
        (KernelClass.ATTENTION, _gemm_s(spec, shape.layer_forward_attention_flops(), ATTENTION_EFFICIENCY))
    )
    compute_s = sum(seconds for _, seconds in times)
    fixed_s = (
        2 * tp_all_reduce_s(shape, spec)
        + shape.layer_all_to_all_s(spec)
        + KERNELS_PER_LAYER[kind] * LAUNCH_GAP_S
    )
    return WorkProfile(
        compute_s=factor * compute_s,
        memory_s=factor * _memory_s(spec, shape.layer_forward_memory_bytes()),
        fixed_s=fixed_s,
        compute_mix=ClassMix.of(times),
    )


def _embedding_work(shape: TransformerShape, spec: GpuSpec, kind: str) -> WorkProfile:
    """Embedding lookup (forward) or gradient accumulation (backward): ~3 memory-bound passes over bsh."""
    hidden_bytes = shape.activation_bytes()
    return WorkProfile(compute_s=0.0, memory_s=_pass_factor(kind) * _memory_s(spec, 3 * hidden_bytes))


def _head_work(shape: TransformerShape, spec: GpuSpec, kind: str) -> WorkProfile:
    """Final norm, LM head GEMM and vocab-parallel cross-entropy (about 4 fp32 passes over the logits)."""
    b, s, h, vocab = shape.micro_batch_size, shape.seq_length, shape.hidden_size, shape.vocab_size
    factor = _pass_factor(kind)
    head_flops = 2 * b * s * h * vocab / shape.tensor_parallel
    logits_bytes = 4 * FP32_BYTES * b * s * vocab / shape.tensor_parallel
    norm_bytes = 2 * shape.activation_bytes()
    head_class = shape.params_gemm_class
    return WorkProfile(
        compute_s=factor * _gemm_s(spec, head_flops, GEMM_EFFICIENCY, head_class),
        memory_s=factor * _memory_s(spec, logits_bytes + norm_bytes),
        fixed_s=tp_all_reduce_s(shape, spec),
        compute_mix=ClassMix.single(head_class),
    )
