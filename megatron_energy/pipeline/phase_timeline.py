"""Kernels, their roofline class, and a kernel timeline grouped into phases.

A kernel's class comes from what it achieved against the GPU spec's roofline: its compute utilisation
(FLOP/s over the spec's peak) against its memory utilisation (bytes/s over the spec's bandwidth), whichever
is higher; communication kernels (NCCL) are communication-bound whatever they achieve, and a kernel without
counted work is compute-bound when its name says a matrix product or attention, else memory-bound
(:mod:`~megatron_energy.pipeline.kernel_classification`). A *phase* is a maximal run of consecutive kernels
of one class; the gaps between kernels belong to the phase they fall in.

Each phase carries its :class:`~megatron_energy.dvfs.model.WorkProfile`: compute-bound time is clock
sensitive, memory-bound time is flat down to the saturation clock, communication time (and gaps) is fixed.
The compute-bound time carries its :class:`~megatron_energy.dvfs.kernel_classes.ClassMix`: each compute
kernel's time in the class its name says (GEMM dtype, attention); a compute-bound kernel whose name says no
compute class (a name no rule knows) is priced as the job's GEMM class, which the caller gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from megatron_energy.dvfs.kernel_classes import ClassMix, KernelClass
from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.kernel_classification import kernel_class, kernel_family

PhaseClass = Literal["compute", "memory", "communication", "mixed"]
"""A phase's class; ``mixed`` only for phases merged from several classes (:mod:`.merge`)."""


@dataclass(frozen=True)
class KernelRecord:
    """One kernel execution from a timeline (torch.profiler / CUPTI), with its counted work."""

    name: str
    """Kernel name."""
    start_s: float
    """Start on the GPU, seconds from the timeline's origin."""
    duration_s: float
    """Duration on the GPU."""
    flops: float = 0.0
    """Floating-point operations it performed (0 when unknown)."""
    bytes: float = 0.0
    """Bytes it moved through device memory (0 when unknown)."""


def classify_kernel(kernel: KernelRecord, spec: GpuSpec) -> PhaseClass:
    """The kernel's class from its achieved FLOP/s and bytes/s against the spec's roofline.

    Args:
        kernel: The kernel with its counted FLOPs and bytes.
        spec: The GPU (peak BF16 TFLOP/s and memory bandwidth).

    Returns:
        ``communication`` for communication kernels (by name); else ``compute`` when its compute utilisation
        is at least its memory utilisation, ``memory`` otherwise. A kernel with neither counted is
        ``compute`` when its name says a matrix product or attention, else ``memory`` (elementwise and copy
        kernels are what profilers leave uncounted).
    """
    family = kernel_family(kernel.name)
    if family == "communication":
        return "communication"
    if kernel.duration_s <= 0:
        return "memory"
    if kernel.flops <= 0 and kernel.bytes <= 0:
        return "compute" if family in ("gemm", "attention") else "memory"
    compute = kernel.flops / (kernel.duration_s * spec.peak_bf16_tflops * 1e12)
    memory = kernel.bytes / (kernel.duration_s * spec.memory_bandwidth_gbps * 1e9)
    return "compute" if compute > 0 and compute >= memory else "memory"


@dataclass(frozen=True)
class Phase:
    """A run of kernels of one class (or, merged, several), with its work at the maximum clock."""

    kind: PhaseClass
    """The class (``mixed`` after merging different classes)."""
    start_s: float
    """Start, seconds from the instruction's (or the tail's) start."""
    work: WorkProfile
    """Its work: compute-, memory-bound and fixed time at the maximum clock."""
    kernels: int = 1
    """Kernels it holds (modelled phases count runs, not kernels)."""

    @property
    def duration_s(self) -> float:
        """Its length at the maximum clock, gaps included."""
        return self.work.compute_s + self.work.memory_s + self.work.fixed_s


def compute_class(kernel: KernelRecord, gemm_class: KernelClass) -> KernelClass:
    """The compute class of a compute-bound kernel: its name's, else ``gemm_class`` (module docstring)."""
    named = kernel_class(kernel.name, gemm_class)
    return named if named is not None and named.is_compute else gemm_class


def compute_mix(
    kernels: Sequence[KernelRecord], spec: GpuSpec, gemm_class: KernelClass = KernelClass.GEMM_BF16
) -> ClassMix | None:
    """The mix of the compute-bound kernels' classes by their time (``None`` when none is compute-bound)."""
    times = [
        (compute_class(kernel, gemm_class), kernel.duration_s)
        for kernel in kernels
        if classify_kernel(kernel, spec) == "compute"
    ]
    return ClassMix.of(times) if sum(seconds for _, seconds in times) > 0 else None


def class_work(kind: PhaseClass, duration_s: float, compute_mix: ClassMix | None = None) -> WorkProfile:
    """The work of ``duration_s`` of one class at the maximum clock (compute time of ``compute_mix``)."""
    if kind == "compute":
        return WorkProfile(compute_s=duration_s, memory_s=0.0, compute_mix=compute_mix)
    if kind == "memory":
        return WorkProfile(compute_s=0.0, memory_s=duration_s)
    return WorkProfile(compute_s=0.0, memory_s=0.0, fixed_s=duration_s)


def group_phases(
    kernels: Sequence[KernelRecord],
    spec: GpuSpec,
    split: Mapping[PhaseClass, WorkProfile] | None = None,
    gemm_class: KernelClass = KernelClass.GEMM_BF16,
) -> list[Phase]:
    """Group a timeline (any order) into phases of consecutive same-class kernels.

    The gap before a kernel (launch latency, host work) is fixed time of the phase it falls in; overlapping
    kernels (several streams) count from the end of the previous one. A compute phase's work carries the
    mix of its kernels' compute classes (:func:`compute_class`), by their time.

    Args:
        kernels: The timeline's kernels, measured at the maximum (stock) clock.
        spec: The GPU whose roofline classifies them.
        split: Per class, the work one second of it is (a measured clock response,
            ``pipeline.clock_response``); a class without one is all compute-, memory-bound or fixed.
        gemm_class: The class of matrix products whose names name no dtype and of compute-bound kernels of
            unknown names (the job's GEMM class, ``pipeline.precision``).

    Returns:
        The phases in time order, starts relative to the first kernel's start.
    """
    ordered = sorted(kernels, key=lambda kernel: kernel.start_s)
    if not ordered:
        return []
    origin = ordered[0].start_s
    phases: list[Phase] = []
    end_s = origin
    for kernel in ordered:
        kind = classify_kernel(kernel, spec)
        busy_s = max(0.0, kernel.start_s + kernel.duration_s - max(end_s, kernel.start_s))
        gap_s = max(0.0, kernel.start_s - end_s)
        mix = ClassMix.single(compute_class(kernel, gemm_class)) if kind == "compute" else None
        if split and kind in split:
            busy = replace(split[kind].scaled(busy_s), compute_mix=mix)
        else:
            busy = class_work(kind, busy_s, mix)
        work = busy + WorkProfile(0.0, 0.0, gap_s)
        end_s = max(end_s, kernel.start_s + kernel.duration_s)
        if phases and phases[-1].kind == kind:
            last = phases[-1]
            phases[-1] = Phase(kind, last.start_s, last.work + work, last.kernels + 1)
        else:
            start = kernel.start_s - origin - gap_s if phases else 0.0
            phases.append(Phase(kind, start, work))
    return phases


def class_shares(phases: Sequence[Phase]) -> dict[str, float]:
    """Fraction of the phases' total time in compute-, memory-bound and fixed (communication, gap) work."""
    total = sum(phase.duration_s for phase in phases)
    if total <= 0:
        return {"compute": 0.0, "memory": 0.0, "communication": 0.0}
    return {
        "compute": sum(p.work.compute_s for p in phases) / total,
        "memory": sum(p.work.memory_s for p in phases) / total,
        "communication": sum(p.work.fixed_s for p in phases) / total,
    }


def split_op_work(
    flops: float, num_bytes: float, kernel_durations_s: Sequence[float]
) -> list[tuple[float, float]]:
    """An operator's counted FLOPs and bytes shared over its kernels in proportion to their durations.

    Profilers count work per operator (``torch.profiler``'s ``with_flops``, input shapes), not per kernel;
    an operator's kernels get its work pro rata (a kernel of zero duration gets none).

    Returns:
        ``(flops, bytes)`` per kernel, in the given order.
    """
    total = sum(kernel_durations_s)
    if total <= 0:
        return [(0.0, 0.0) for _ in kernel_durations_s]
    return [(flops * d / total, num_bytes * d / total) for d in kernel_durations_s]


def long_phases(phases: Sequence[Phase], threshold_s: float = 0.010) -> list[Phase]:
    """The phases longer than ``threshold_s`` (default 10 ms: long enough for a Hopper clock switch)."""
    return [phase for phase in phases if phase.duration_s > threshold_s]
