"""The GPU workloads a calibration holds (torch kernels on the current CUDA device), timed with CUDA events.

``megatron-energy calibrate`` (``commands.calibrate``) runs them under the NVML sampler of
``dvfs.calibration_nvml``, one workload per kernel class and a few sizes:

* matrix products of every dtype the GPU runs on tensor cores: bf16, fp16, tf32 (fp32 inputs) and, from
  compute capability 8.9, fp8 e4m3 (``torch._scaled_mm``), at 8192³ (sizes that reach the power cap on a
  Hopper GPU) and bf16 at 2048³ (one that stays near the top clock);
* fused attention (``scaled_dot_product_attention``, bf16, causal);
* an elementwise loop (``addcmul`` over 1 GiB operands) and a device copy: memory-bound;
* ``blocked``: ``torch.cuda._sleep``, one thread block spinning on the SM clock counter, as NCCL's kernels
  spin while a collective waits for its peer.

Every compute workload also runs duty-cycled (bursts of kernels with idle gaps, below the power limit), so
that its power at the clock of its bursts is known as well as the clock it reaches at the cap. Imports torch
and pynvml: only the command's run imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pynvml
import torch

from megatron_energy.dvfs.calibration import CalibrationRun
from megatron_energy.dvfs.calibration_nvml import BurstRun, Loop, LoopTiming, run_calibration
from megatron_energy.dvfs.kernel_classes import KernelClass

CHUNK_S = 0.05
"""Work enqueued ahead of the GPU: one chunk runs while the next is queued (the launch queue never fills)."""

LARGE_N = 8192
SMALL_N = 2048
ATTENTION_SHAPE = (4, 32, 4096, 128)
"""Batch, heads, sequence, head size of the attention workload."""


def _step_seconds(step: Callable[[], object]) -> float:
    """Seconds one ``step`` takes on the GPU (after a warm-up), CUDA events."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / 10


def back_to_back(step: Callable[[], object]) -> Callable[[float], tuple[float, int]]:
    """Runs ``step`` back to back for about the given seconds (sized from a warm-up); CUDA-event duration."""

    def run(seconds: float) -> tuple[float, int]:
        step_s = _step_seconds(step)
        repetitions = max(1, round(seconds / step_s))
        per_chunk = max(1, round(CHUNK_S / step_s))
        start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start_event.record()
        in_flight: torch.cuda.Event | None = None
        for first in range(0, repetitions, per_chunk):
            for _ in range(min(per_chunk, repetitions - first)):
                step()
            chunk_done = torch.cuda.Event()
            chunk_done.record()
            if in_flight is not None:
                in_flight.synchronize()  # waits without the GIL, so the sampler thread keeps polling
            in_flight = chunk_done
        end_event.record()
        torch.cuda.synchronize()
        return start_event.elapsed_time(end_event) / 1000.0, repetitions

    return run


def duty_cycled(step: Callable[[], object]) -> Callable[[float, float, float], BurstRun]:
    """Runs ``step`` in bursts of about ``burst_s`` each waited for, then ``gap_s`` idle, for ``seconds``."""

    def run(seconds: float, burst_s: float, gap_s: float) -> BurstRun:
        per_burst = max(1, round(burst_s / _step_seconds(step)))
        busy_s, repetitions, windows = 0.0, 0, []
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            start_event, end_event = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            launched = time.perf_counter()
            start_event.record()
            for _ in range(per_burst):
                step()
            end_event.record()
            end_event.synchronize()
            windows.append((launched, time.perf_counter()))
            busy_s += start_event.elapsed_time(end_event) / 1000.0
            repetitions += per_burst
            time.sleep(gap_s)
        return BurstRun(time.perf_counter() - began, busy_s, repetitions, tuple(windows))

    return run


def _compute(step: Callable[[], object], detail: str, flops: float, kernel_class: KernelClass) -> Loop:
    """A compute workload: back to back and duty-cycled, its rate in TFLOP/s."""
    return Loop(
        back_to_back(step),
        detail,
        lambda n, s: flops * n / s / 1e12,
        kernel_class,
        duty_cycled(step),
    )


def _gemm(dtype: torch.dtype, n: int, kernel_class: KernelClass) -> Loop:
    """An ``n``³ matrix product of ``dtype`` (fp32 runs as tf32 on tensor cores)."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b, c = torch.randn_like(a), torch.empty_like(a)
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "tf32 (fp32 inputs)"}[dtype]
    return _compute(lambda: torch.matmul(a, b, out=c), f"{name} {n}^3 matmul", 2 * n**3, kernel_class)


def _fp8_gemm(n: int) -> Loop:
    """An ``n``³ fp8 e4m3 scaled matrix product with a bf16 result."""
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    scale = torch.tensor(1.0, device="cuda")

    def step() -> object:
        return torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)

    return _compute(step, f"fp8 e4m3 {n}^3 _scaled_mm", 2 * n**3, KernelClass.GEMM_FP8)


def _attention() -> Loop:
    """Causal fused attention, bf16, forward."""
    batch, heads, sequence, head = ATTENTION_SHAPE
    q = torch.randn(batch, heads, sequence, head, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)

    def step() -> object:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    flops = 2 * batch * heads * sequence**2 * head  # 4bhs²d halved by the causal mask
    return _compute(
        step, f"causal SDPA bf16 b{batch} h{heads} s{sequence} d{head}", flops, KernelClass.ATTENTION
    )


def _memory(step: Callable[[], object], detail: str, bytes_moved: int) -> Loop:
    """A memory-bound workload, back to back only (it never reaches the cap), its rate in GB/s."""
    return Loop(back_to_back(step), detail, lambda n, s: bytes_moved * n / s / 1e9, KernelClass.MEMORY)


def torch_loops(copy_gib: float, max_sm_clock_mhz: int) -> dict[str, Loop]:
    """The calibration's workloads on the current CUDA device, in the order to run them."""
    torch.backends.cuda.matmul.allow_tf32 = True  # this process only: fp32 products run as tf32
    loops = {
        "gemm_bf16_8192": _gemm(torch.bfloat16, LARGE_N, KernelClass.GEMM_BF16),
        "gemm_fp16_8192": _gemm(torch.float16, LARGE_N, KernelClass.GEMM_FP16),
        "gemm_tf32_8192": _gemm(torch.float32, LARGE_N, KernelClass.GEMM_TF32),
    }
    if torch.cuda.get_device_capability() >= (8, 9):
        loops["gemm_fp8_8192"] = _fp8_gemm(LARGE_N)
    loops["gemm_bf16_2048"] = _gemm(torch.bfloat16, SMALL_N, KernelClass.GEMM_BF16)
    loops["attention"] = _attention()
    elements = 2**30 // 2
    x, y, z = (torch.randn(elements, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(x)
    loops["elementwise"] = _memory(
        lambda: torch.addcmul(x, y, z, out=out), "addcmul over 1 GiB bf16 operands", 4 * x.nbytes
    )
    src = torch.randn(int(copy_gib * 2**30) // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    loops["copy"] = _memory(lambda: dst.copy_(src), f"{copy_gib:g} GiB device copy", 2 * src.nbytes)
    spin_cycles = int(0.05 * max_sm_clock_mhz * 1e6)  # ~50 ms per spin kernel at the top clock
    loops["blocked"] = Loop(
        back_to_back(lambda: torch.cuda._sleep(spin_cycles)), "torch.cuda._sleep spin kernel, one block"
    )
    return loops


def measure_gpu(
    index: int,
    top_clock_mhz: int,
    copy_gib: float,
    timing: LoopTiming,
    progress: Callable[[str], None] = lambda line: None,
) -> CalibrationRun:
    """Hold the workloads on GPU ``index`` under the NVML sampler (read-only) and return what was measured.

    Args:
        index: The GPU's CUDA and NVML index.
        top_clock_mhz: The highest SM clock of its spec (sizes the spin kernel of the ``blocked`` loop).
        copy_gib: Size of the copy loop's copy.
        timing: Seconds per loop, duty cycle, polling.
        progress: Called with one line as each loop ends.

    Returns:
        The calibration run (every figure measured).
    """
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    torch.cuda.set_device(index)
    return run_calibration(pynvml, handle, torch_loops(copy_gib, top_clock_mhz), timing, progress=progress)
