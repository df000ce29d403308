"""A made-up GPU that follows the calibration's equations exactly: what its loops would measure.

Like the H100 measured on 2026-12-06: back to back, each class's kernels run at the clock where their power
meets the 700 W limit; in 10 ms bursts a faster limit (930 W here) holds them lower than the top clock while
NVML's clock reading still says the top clock, so only the bursts' throughput tells their clock.
"""

from __future__ import annotations

from megatron_energy.dvfs.calibration import DUTY_SUFFIX, CalibrationRun, LoopMeasurement
from megatron_energy.dvfs.kernel_classes import KernelClass

F_MAX = 1980.0
KNEE_MHZ = 990.0
VOLTAGE_RATIO = 0.5
DYNAMIC_W = 1700.0
IDLE_W = 115.0
LIMIT_W = 700.0
BURST_LIMIT_W = 930.0
BUSY = 0.3
MEMORY_POWER_W = 100.0
COPY_ACTIVITY = 0.16
WORKLOADS = {
    "gemm_bf16_8192": (KernelClass.GEMM_BF16, 1.0),
    "gemm_fp16_8192": (KernelClass.GEMM_FP16, 1.12),
    "gemm_tf32_8192": (KernelClass.GEMM_TF32, 0.91),
    "gemm_fp8_8192": (KernelClass.GEMM_FP8, 1.27),
    "attention": (KernelClass.ATTENTION, 0.55),
}
TFLOPS_PER_MHZ = 0.5


def g(clock_mhz: float, ratio: float = VOLTAGE_RATIO) -> float:
    """(f / f_max) v(f)^2 of the made-up GPU."""
    rise = max(0.0, (clock_mhz - KNEE_MHZ) / (F_MAX - KNEE_MHZ))
    v = ratio + (1.0 - ratio) * min(rise, 1.0)
    return clock_mhz / F_MAX * v * v


def clock_at(power_w: float, activity: float) -> float:
    """The clock at which a class of ``activity`` draws ``power_w`` (the top clock if it never does)."""
    if IDLE_W + activity * DYNAMIC_W * g(F_MAX) <= power_w:
        return F_MAX
    low, high = 345.0, F_MAX
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if IDLE_W + activity * DYNAMIC_W * g(middle) <= power_w else (low, middle)
    return (low + high) / 2


def loops_measured(with_rates: bool = True) -> list[LoopMeasurement]:
    """Each workload back to back, then duty-cycled, as the calibration would measure them."""
    loops = []
    for name, (kernel_class, activity) in WORKLOADS.items():
        capped = clock_at(LIMIT_W, activity)
        burst = clock_at(BURST_LIMIT_W, activity)
        burst_w = IDLE_W + activity * DYNAMIC_W * g(burst)
        rate = TFLOPS_PER_MHZ if with_rates else 0.0
        loops.append(
            LoopMeasurement(
                name, 6.0, LIMIT_W, capped, rate * capped, kernel_class=kernel_class, power_cap_share=1.0
            )
        )
        loops.append(
            LoopMeasurement(
                name + DUTY_SUFFIX,
                4.0,
                IDLE_W * (1 - BUSY) + BUSY * burst_w,
                F_MAX,
                rate * burst,
                kernel_class=kernel_class,
                busy_fraction=BUSY,
                burst_clock_mhz=F_MAX,  # what NVML reads inside the bursts
            )
        )
    copy_w = IDLE_W + COPY_ACTIVITY * DYNAMIC_W + MEMORY_POWER_W
    loops.append(LoopMeasurement("copy", 6.0, copy_w, F_MAX, 3000.0, kernel_class=KernelClass.MEMORY))
    return loops


def synthetic_run(with_rates: bool = True, blocked_w: float = 125.0) -> CalibrationRun:
    """The whole run of the made-up GPU."""
    return CalibrationRun(
        gpu_name="NVIDIA H100 80GB HBM3",
        driver_version="580.159.04",
        date="2026-12-06",
        supported_sm_clocks_mhz=tuple(range(345, 1981, 15)),
        supported_memory_clocks_mhz=(1593, 2619),
        power_limit_w=LIMIT_W,
        counter_period_s=0.1,
        loops=tuple(loops_measured(with_rates)),
        blocked=LoopMeasurement("blocked", 4.0, blocked_w, F_MAX),
        idle=LoopMeasurement("idle", 4.0, IDLE_W, F_MAX),
    )
