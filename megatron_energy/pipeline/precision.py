"""The dtypes a job's matrix products run in: their kernel class and their tensor-core peak (*modelled*).

Megatron trains with bf16 (``--bf16``) or fp16 (``--fp16``) parameters, else fp32; with ``--fp8-format``
Transformer Engine runs the decoder layers' linear layers (QKV, projection, MLP, experts) as fp8 matrix
products, while the output layer (LM head) and the MoE router stay in the parameters' dtype, and fused
attention stays 16-bit. fp32 matrix products are taken to run on tensor cores in tf32.

Each class runs at its own dense tensor-core peak, relative to bf16 (:data:`PEAK_OVER_BF16`; NVIDIA's
datasheets: H100/H200 SXM fp8 1979, bf16 and fp16 989, tf32 495 TFLOP/s; A100 bf16 312, tf32 156).

Pure Python: no torch, megatron or NVML imports.
"""

from __future__ import annotations

from typing import Literal

from megatron_energy.dvfs.kernel_classes import KernelClass

ParamsDtype = Literal["bf16", "fp16", "fp32"]
"""The parameters' dtype (Megatron's ``--bf16``, ``--fp16``, neither)."""

PARAMS_GEMM_CLASSES: dict[str, KernelClass] = {
    "bf16": KernelClass.GEMM_BF16,
    "fp16": KernelClass.GEMM_FP16,
    "fp32": KernelClass.GEMM_TF32,
}
"""The class of the matrix products in each parameters' dtype."""

PEAK_OVER_BF16: dict[KernelClass, float] = {
    KernelClass.GEMM_BF16: 1.0,
    KernelClass.GEMM_FP16: 1.0,
    KernelClass.GEMM_TF32: 0.5,
    KernelClass.GEMM_FP8: 2.0,
}
"""Each GEMM class's dense tensor-core peak over bf16's (module docstring)."""


def params_gemm_class(params_dtype: str) -> KernelClass:
    """The class of the matrix products the parameters' dtype runs (LM head, router; all without fp8).

    Raises:
        ValueError: If ``params_dtype`` is not one of :data:`PARAMS_GEMM_CLASSES`.
    """
    try:
        return PARAMS_GEMM_CLASSES[params_dtype]
    except KeyError:
        raise ValueError(
            f"params_dtype must be one of {', '.join(PARAMS_GEMM_CLASSES)}, got {params_dtype!r}"
        ) from None


def layer_gemm_class(params_dtype: str, fp8: bool) -> KernelClass:
    """The class of the decoder layers' linear GEMMs: fp8 with ``--fp8-format``, else the parameters'."""
    return KernelClass.GEMM_FP8 if fp8 else params_gemm_class(params_dtype)
