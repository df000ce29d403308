"""The GPU loops a calibration holds (torch kernels on the current CUDA device), timed with CUDA events.

``megatron-energy calibrate`` (``commands.calibrate``) runs them under the NVML sampler of
``dvfs.calibration_nvml``: ``compute`` (a bf16 matrix product), ``memory`` (a device-to-device copy) and
``blocked`` (``torch.cuda._sleep``, one thread block spinning on the SM clock counter, as NCCL's kernels spin
while a collective waits for its peer). Imports torch and pynvml: only the command's run imports this module.
"""

from __future__ import annotations

from collections.abc import Callable

import pynvml
import torch

from megatron_energy.dvfs.calibration import CalibrationRun
from megatron_energy.dvfs.calibration_nvml import Loop, run_calibration

MATMUL_N = 8192
CHUNK_S = 0.05
"""Work enqueued ahead of the GPU: one chunk runs while the next is queued (the launch queue never fills)."""


def cuda_loop(step: Callable[[], object]) -> Callable[[float], tuple[float, int]]:
    """Runs ``step`` back to back for about the given seconds (sized from a warm-up); CUDA-event duration."""

    def run(seconds: float) -> tuple[float, int]:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        probe_start, probe_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        probe_start.record()
        for _ in range(10):
            step()
        probe_end.record()
        torch.cuda.synchronize()
        step_s = probe_start.elapsed_time(probe_end) / 1000.0 / 10
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


def torch_loops(copy_gib: float, max_sm_clock_mhz: int) -> dict[str, Loop]:
    """The compute, memory and blocked loops on the current CUDA device."""
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    c = torch.empty_like(a)
    src = torch.randn(int(copy_gib * 2**30) // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    spin_cycles = int(0.05 * max_sm_clock_mhz * 1e6)  # ~50 ms per spin kernel at the top clock
    return {
        "compute": Loop(
            cuda_loop(lambda: torch.matmul(a, b, out=c)),
            f"bf16 {MATMUL_N}^3 matmul",
            lambda n, s: 2 * MATMUL_N**3 * n / s / 1e12,
        ),
        "memory": Loop(
            cuda_loop(lambda: dst.copy_(src)),
            f"{copy_gib:g} GiB device copy",
            lambda n, s: 2 * src.nbytes * n / s / 1e9,
        ),
        "blocked": Loop(
            cuda_loop(lambda: torch.cuda._sleep(spin_cycles)), "torch.cuda._sleep spin kernel, one block"
        ),
    }


def measure_gpu(
    index: int, top_clock_mhz: int, copy_gib: float, loop_s: float, poll_s: float
) -> CalibrationRun:
    """Hold the loops on GPU ``index`` under the NVML sampler (read-only) and return what was measured.

    Args:
        index: The GPU's CUDA and NVML index.
        top_clock_mhz: The highest SM clock of its spec (sizes the spin kernel of the ``blocked`` loop).
        copy_gib: Size of the memory loop's copy.
        loop_s: Seconds per loop.
        poll_s: NVML sampling period.

    Returns:
        The calibration run (every figure measured).
    """
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    torch.cuda.set_device(index)
    return run_calibration(pynvml, handle, torch_loops(copy_gib, top_clock_mhz), loop_s, poll_s=poll_s)
