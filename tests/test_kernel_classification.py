"""Kernel classes from recorded kernel names, and the class mix a kernel timeline's phases carry (pure).

The names are of the kinds cuBLAS, CUTLASS, flash attention, cuDNN, NCCL, Transformer Engine, PyTorch and
Triton launch in Megatron training (cuBLAS xmma and Ampere GEMMs, CUTLASS 2/3, FA2/FA3, cuDNN SDPA, ...).
"""

from __future__ import annotations

import dataclasses

import pytest

from megatron_energy.dvfs.kernel_classes import ClassMix, KernelClass
from megatron_energy.dvfs.model import GpuPowerModel
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.kernel_classification import kernel_class
from megatron_energy.pipeline.phase_timeline import KernelRecord, classify_kernel, compute_mix, group_phases

SPEC = load_gpu_spec("h100-sxm")
K = KernelClass

NAMED: tuple[tuple[str, KernelClass], ...] = (
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
        K.GEMM_BF16,
    ),
    (
        "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        K.GEMM_FP16,
    ),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_cublas", K.GEMM_FP8),
    (
        "cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_bf16_bf16_128x256x128_1x1x1_0_tnn_align16_warpspecialized",
        K.GEMM_FP8,
    ),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x10_nn_align8", K.GEMM_BF16),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", K.GEMM_FP16),
    ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_nn", K.GEMM_BF16),
    (
        "sm80_xmma_gemm_tf32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel",
        K.GEMM_TF32,
    ),
    ("cutlass_tensorop_s1688tf32gemm_256x128_16x3_nn_align4", K.GEMM_TF32),
    ("turing_h1688gemm_256x128_ldg8_tn", K.GEMM_FP16),
    ("flash_fwd_kernel", K.ATTENTION),
    (
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64>>",
        K.ATTENTION,
    ),
    (
        "cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<CollectiveMainloopFwdSm90>>>",
        K.ATTENTION,
    ),
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0",
        K.ATTENTION,
    ),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", K.ATTENTION),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", K.COMMUNICATION),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", K.COMMUNICATION),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs", K.COMMUNICATION),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
        K.MEMORY,
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float>>>",
        K.MEMORY,
    ),
    ("void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<float, __nv_bfloat16>", K.MEMORY),
    ("void transformer_engine::detail::cast_transpose_kernel<8, 4, __nv_bfloat16, __nv_fp8_e4m3>", K.MEMORY),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 3, 128, 1>", K.MEMORY),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float, float, float>>", K.MEMORY),
    ("void at::native::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>", K.MEMORY),
    ("triton_poi_fused_add_mul_silu_0", K.MEMORY),
    ("gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>", K.MEMORY),
)


@pytest.mark.parametrize("name, expected", NAMED, ids=[name[:40] for name, _ in NAMED])
def test_recorded_kernel_names_give_their_class(name: str, expected: KernelClass) -> None:
    assert kernel_class(name) == expected


def test_a_gemm_whose_name_says_no_dtype_is_of_the_jobs_gemm_class_and_an_unknown_name_has_none() -> None:
    assert kernel_class("nvjet_hsh_192x192_64x3_2x1_v_bz_coopB_NTN", K.GEMM_FP16) == K.GEMM_FP16
    assert kernel_class("nvjet_hsh_192x192_64x3_2x1_v_bz_coopB_NTN") == K.GEMM_BF16
    assert kernel_class("my_custom_fused_kernel_v2", K.GEMM_FP8) is None


def test_an_uncounted_kernel_is_compute_bound_when_its_name_says_a_product_or_attention() -> None:
    """torch.profiler counts no work for kernels launched outside an operator it knows."""
    assert (
        classify_kernel(KernelRecord("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNT", 0, 1e-3), SPEC) == "compute"
    )
    assert classify_kernel(KernelRecord("flash_bwd_dq_dk_dv_loop_kernel", 0, 1e-3), SPEC) == "compute"
    assert classify_kernel(KernelRecord("my_custom_fused_kernel_v2", 0, 1e-3), SPEC) == "memory"


def _compute(name: str, start_s: float, duration_s: float) -> KernelRecord:
    """A kernel at 60 % of the H100's bf16 peak (the roofline calls it compute-bound whatever its name)."""
    return KernelRecord(name, start_s, duration_s, flops=0.6 * 989e12 * duration_s, bytes=1e6)


def test_a_phase_carries_the_classes_of_its_kernels_by_time() -> None:
    kernels = [
        _compute("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_cublas", 0.0, 3e-3),
        _compute("flash_fwd_kernel", 3e-3, 1e-3),
        KernelRecord("vectorized_elementwise_kernel", 4e-3, 1e-3, flops=0.0, bytes=4e9),
        _compute("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_cublas", 5e-3, 2e-3),
    ]
    compute, memory, tail = group_phases(kernels, SPEC, gemm_class=K.GEMM_FP8)
    assert compute.work.compute_mix == ClassMix.of({K.GEMM_FP8: 3.0, K.ATTENTION: 1.0})
    assert memory.kind == "memory" and memory.work.compute_mix is None
    assert tail.work.compute_mix == ClassMix.single(K.GEMM_BF16)
    assert compute_mix(kernels, SPEC) == ClassMix.of({K.GEMM_FP8: 3.0, K.ATTENTION: 1.0, K.GEMM_BF16: 2.0})


def test_a_compute_bound_kernel_of_an_unknown_name_is_priced_as_the_jobs_gemm_class() -> None:
    kernels = [_compute("my_custom_fused_kernel_v2", 0.0, 1e-3), _compute("flash_fwd_kernel", 1e-3, 1e-3)]
    (phase,) = group_phases(kernels, SPEC, gemm_class=K.GEMM_FP8)
    assert phase.work.compute_mix == ClassMix.of({K.GEMM_FP8: 1.0, K.ATTENTION: 1.0})


def test_a_timeline_phase_of_hotter_kernels_caps_lower_under_a_calibrated_spec() -> None:
    spec = dataclasses.replace(SPEC, class_activity={K.GEMM_FP8: 1.2, K.ATTENTION: 0.8})
    model = GpuPowerModel(spec)
    caps = {
        name: model.power_cap_clock_mhz(group_phases([_compute(name, 0.0, 1e-3)], spec)[0].work)
        for name in ("sm90_xmma_gemm_e4m3e4m3_cublas", "sm90_xmma_gemm_bf16bf16_cublas", "flash_fwd_kernel")
    }
    assert (
        caps["sm90_xmma_gemm_e4m3e4m3_cublas"]
        < caps["sm90_xmma_gemm_bf16bf16_cublas"]
        < caps["flash_fwd_kernel"]
    )
