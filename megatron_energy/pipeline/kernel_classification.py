"""The kernel class of a recorded CUDA kernel, read from its name (table-driven).

Kernel names say what a kernel does, and a matrix product's name its dtype: cuBLAS's
``sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_...``, ``ampere_fp16_s16816gemm_fp16_...``,
``sm80_xmma_gemm_tf32f32_tf32f32_f32_...``, CUTLASS's ``cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_bf16_...``,
``cutlass_tensorop_s1688tf32gemm_...``. Attention runs as flash attention (``flash_fwd_kernel``,
``flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel``, FlashAttention-3's ``flash::FlashAttnFwdSm90``), cuDNN's
fused attention (``cudnn_generated_fort_native_sdpa_sm90_...``) or PyTorch's memory-efficient
``fmha_cutlassF_...``.
Collectives are NCCL's (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``) or Transformer Engine's userbuffers.
Elementwise, reduction, normalisation, copy, cast and optimizer kernels move memory.

:data:`FAMILY_RULES` says, in order, which name fragments make a kernel communication, attention, a matrix
product or memory-bound (the first rule with a fragment in the lower-case name decides);
:data:`GEMM_DTYPE_RULES` the class of a matrix product from its dtype fragments. A matrix product whose name
names no dtype (cuBLAS's Hopper ``nvjet_*`` kernels, Triton's ``matmul_kernel``) is of the class the caller
gives (the job's GEMM class from the workload model); a name no rule knows has no class
(:func:`kernel_class` returns ``None``), and the caller falls back to the kernel's roofline and says so.

Pure Python: no torch, NVML or zeus imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from megatron_energy.dvfs.kernel_classes import KernelClass

KernelFamily = Literal["communication", "attention", "gemm", "memory"]
"""What a kernel does, by its name; a ``gemm``'s class further depends on its dtype."""

FAMILY_RULES: tuple[tuple[KernelFamily, tuple[str, ...]], ...] = (
    (
        "communication",
        ("nccl", "allreduce", "all_reduce", "allgather", "all_gather", "reducescatter", "userbuffers"),
    ),
    ("attention", ("flash", "fmha", "sdpa", "flashattn", "fused_attn")),
    ("memory", ("gemv", "splitkreduce")),  # matrix-vector products and split-K reductions stream memory
    ("gemm", ("gemm", "nvjet", "xmma", "matmul", "wgmma", "tensorop")),
    (
        "memory",
        (
            "elementwise",
            "reduce",
            "norm",
            "softmax",
            "copy",
            "memcpy",
            "memset",
            "cast",
            "transpose",
            "fill",
            "gather",
            "scatter",
            "index",
            "embedding",
            "dropout",
            "multi_tensor",
            "adam",
            "rotary",
            "rope",
            "permute",
            "topk",
            "sort",
            "cross_entropy",
            "gelu",
            "silu",
            "swiglu",
            "bias",
            "triton_poi",
            "triton_red",
            "triton_per",
        ),
    ),
)
"""In order: a family and the name fragments (lower case) that put a kernel in it; the first match decides."""

GEMM_DTYPE_RULES: tuple[tuple[KernelClass, tuple[str, ...]], ...] = (
    (KernelClass.GEMM_FP8, ("e4m3", "e5m2", "fp8", "f8f8")),
    (KernelClass.GEMM_TF32, ("tf32",)),
    (KernelClass.GEMM_BF16, ("bf16",)),
    (KernelClass.GEMM_FP16, ("fp16", "f16", "hgemm", "h1688", "h16816")),
)
"""In order: a matrix product's class and the dtype fragments that say it (fp8 first: an fp8 product's name
also names its bf16 output; bf16 before fp16, whose fragment ``f16`` it holds)."""

FAMILY_CLASSES: dict[KernelFamily, KernelClass] = {
    "communication": KernelClass.COMMUNICATION,
    "attention": KernelClass.ATTENTION,
    "memory": KernelClass.MEMORY,
}
"""The class of every family but ``gemm`` (whose class is its dtype's)."""


def first_match[T](rules: Sequence[tuple[T, tuple[str, ...]]], name: str) -> T | None:
    """The value of the first rule with a fragment in the lower-case ``name``; ``None`` when none has one."""
    lowered = name.lower()
    return next((value for value, fragments in rules if any(f in lowered for f in fragments)), None)


def kernel_family(name: str) -> KernelFamily | None:
    """The family of a kernel by its name (:data:`FAMILY_RULES`); ``None`` when no rule knows the name."""
    return first_match(FAMILY_RULES, name)


def gemm_dtype_class(name: str) -> KernelClass | None:
    """The class of a matrix product by the dtype its name says (:data:`GEMM_DTYPE_RULES`); ``None``: none."""
    return first_match(GEMM_DTYPE_RULES, name)


def kernel_class(name: str, gemm_class: KernelClass = KernelClass.GEMM_BF16) -> KernelClass | None:
    """The kernel class of a kernel by its name.

    Args:
        name: The kernel's name as the profiler recorded it.
        gemm_class: The class of a matrix product whose name names no dtype (the job's GEMM class).

    Returns:
        The class, or ``None`` when no rule knows the name (the caller falls back and says so).
    """
    family = kernel_family(name)
    if family is None:
        return None
    if family == "gemm":
        return gemm_dtype_class(name) or gemm_class
    return FAMILY_CLASSES[family]
