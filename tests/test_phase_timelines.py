"""Kernel timelines from a Kineto Chrome trace (synthetic): attribution, estimated work, classes, phases."""

import pytest

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.kineto_trace import kernels_from_trace, op_bytes, op_flops
from megatron_energy.pipeline.phase_timeline import classify_kernel, group_phases, long_phases, split_op_work

SPEC = load_gpu_spec("h200")


def _op(name, ts, dur, dims, types, tid=1):
    args = {"Input Dims": dims, "Input type": types}
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": 1,
        "tid": tid,
        "args": args,
    }


def _launch(ts, correlation, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "pid": 1,
            "tid": tid, "args": {"correlation": correlation}}  # fmt: skip


def _kernel(name, ts, dur, correlation):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
            "args": {"correlation": correlation}}  # fmt: skip


def test_operator_work_estimates() -> None:
    assert op_flops("aten::mm", [[4096, 2048], [2048, 8192]]) == 2.0 * 4096 * 2048 * 8192
    assert op_flops("aten::addmm", [[8192], [4096, 2048], [2048, 8192]]) == 2.0 * 4096 * 2048 * 8192
    sdpa = op_flops("aten::_scaled_dot_product_flash_attention", [[1, 16, 2048, 128]] * 3)
    flash = op_flops("aten::_flash_attention_forward", [[1, 2048, 16, 128]] * 3)
    assert sdpa == flash == 4.0 * 16 * 2048 * 2048 * 128
    assert op_flops("aten::add", [[10, 10], [10, 10]]) == 0.0
    assert op_bytes([[1024, 1024], [1024, 1024]], ["c10::BFloat16", "c10::BFloat16"]) == 3 * 2 * 1024 * 1024


def test_split_op_work_is_pro_rata() -> None:
    assert split_op_work(100.0, 10.0, [1.0, 3.0]) == [(25.0, 2.5), (75.0, 7.5)]
    assert split_op_work(100.0, 10.0, [0.0]) == [(0.0, 0.0)]


def test_trace_to_classified_phases() -> None:
    m, k, n = 8192, 8192, 8192
    gemm_us = 2.0 * m * k * n / (600e12) * 1e6  # ~60 % of the H200's peak
    events = [
        _op("aten::layer_norm", 0, 50, [[8192, 8192]], ["c10::BFloat16"]),
        _launch(10, 1),
        _op("aten::mm", 100, 30, [[m, k], [k, n]], ["c10::BFloat16", "c10::BFloat16"]),
        _launch(110, 2),
        _launch(120, 3),  # a GEMM split into two kernels: the op's FLOPs shared by duration
        _op("ncclAllReduce", 200, 10, [], []),
        _launch(205, 4),
    ]
    start = 1000.0
    events += [
        _kernel("vectorized_layer_norm_kernel", start, 180, 1),
        _kernel("sm90_gemm_a", start + 190, gemm_us / 2, 2),
        _kernel("sm90_gemm_b", start + 190 + gemm_us / 2, gemm_us / 2, 3),
        _kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", start + 200 + gemm_us, 12_000, 4),
    ]
    kernels = kernels_from_trace({"traceEvents": events})
    assert kernels[0].name == "vectorized_layer_norm_kernel" and kernels[0].start_s == 0.0
    assert kernels[1].flops == pytest.approx(m * k * n) and kernels[2].flops == pytest.approx(m * k * n)
    assert [classify_kernel(k, SPEC) for k in kernels] == ["memory", "compute", "compute", "communication"]
    phases = group_phases(kernels, SPEC)
    assert [p.kind for p in phases] == ["memory", "compute", "communication"]
    assert [p.kind for p in long_phases(phases)] == ["communication"]  # only the 12 ms all-reduce > 10 ms


def test_tensor_list_inputs_count_every_tensor() -> None:
    """A TensorList input's ``Input Dims`` is a list of shapes (``aten::_foreach_*`` in an optimizer)."""
    dims = [[[4, 4], [2, 8]], [1024]]
    assert op_bytes(dims, ["TensorList", "float"]) == 4 * 1024  # the list's dtype is unknown: 0 bytes
    assert op_bytes([[[4, 4], [2, 8]]], ["float"]) == 2 * 4 * (16 + 16)


def test_driver_launches_and_nested_operators() -> None:
    """cuBLAS launches through the driver API; a kernel goes to the innermost enclosing operator, also when
    an earlier sibling operator has closed and a later one starts after the launch."""
    events = [
        _op("aten::linear", 0, 100, [[64, 32], [16, 32]], ["float", "float"]),
        _op("aten::t", 5, 5, [[16, 32]], ["float"]),  # a closed sibling before the launch
        _op("aten::mm", 20, 50, [[64, 32], [32, 16]], ["float", "float"]),
        _launch(30, 9) | {"cat": "cuda_driver", "name": "cuLaunchKernelEx"},
        _launch(90, 10),  # inside aten::linear only, after aten::mm closed
        _op("aten::add", 200, 10, [[64, 16], [64, 16]], ["float", "float"]),
        _launch(205, 11, tid=2),  # another thread, with no operator open
        _kernel("nvjet_sm90_gemm", 1000, 100, 9),
        _kernel("bias_add", 1100, 10, 10),
        _kernel("orphan", 1200, 10, 11),
    ]
    kernels = kernels_from_trace({"traceEvents": events})
    assert [k.name for k in kernels] == ["nvjet_sm90_gemm", "bias_add", "orphan"]
    assert kernels[0].flops == pytest.approx(2.0 * 64 * 32 * 16)  # aten::mm, launched via the driver
    assert kernels[1].flops == pytest.approx(2.0 * 64 * 32 * 16)  # aten::linear's own estimate
    assert kernels[2].flops == 0.0 and kernels[2].bytes == 0.0
