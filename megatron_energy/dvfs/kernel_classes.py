"""Kernel classes and the class mix of a piece of work: what its power per clock depends on.

Kernels of one class draw about the same power per clock: an fp8 matrix product switches more transistors per
cycle than a bf16 one, so under the same power limit it runs at a lower clock (measured on one H100: bf16
8192³ products cap at ~1380 MHz, fp8 ones at ~1260 MHz, tf32 ones at ~1500 MHz). A GPU spec holds one
*activity* per compute class (its dynamic power relative to the bf16 matrix product the spec's
``dynamic_power_max_w`` describes; ``megatron-energy calibrate`` measures them), and a
:class:`~megatron_energy.dvfs.model.WorkProfile` holds the :class:`ClassMix` of its compute-bound time.

Memory-bound kernels (elementwise, normalisation, copies) are not a compute class: their power is the model's
memory term (``memory_core_activity``, ``memory_power_w``). Communication kernels spin on one SM while they
wait (``blocked_power_w``) and sit in the fixed, clock-independent time.

Pure Python: no torch, NVML or zeus imports.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


class KernelClass(StrEnum):
    """A class of GPU kernels with one power per clock (values are the names used in files)."""

    GEMM_BF16 = "gemm_bf16"
    """bf16 matrix products (the reference class: activity 1 by definition)."""
    GEMM_FP16 = "gemm_fp16"
    """fp16 matrix products."""
    GEMM_TF32 = "gemm_tf32"
    """fp32 matrix products on tensor cores (tf32)."""
    GEMM_FP8 = "gemm_fp8"
    """fp8 (e4m3/e5m2) scaled matrix products."""
    ATTENTION = "attention"
    """Fused (flash) attention, forward and backward."""
    MEMORY = "memory"
    """Memory-bound kernels: elementwise, normalisation, copies (the model's memory term)."""
    COMMUNICATION = "communication"
    """Collective and point-to-point kernels (fixed time; a spinning SM while they wait)."""

    @property
    def is_compute(self) -> bool:
        """Whether kernels of this class are compute-bound (their time scales with the SM clock)."""
        return self not in (KernelClass.MEMORY, KernelClass.COMMUNICATION)


REFERENCE_CLASS = KernelClass.GEMM_BF16
"""The class of activity 1: ``dynamic_power_max_w`` is its dynamic power at the top clock and voltage."""

COMPUTE_CLASSES = tuple(k for k in KernelClass if k.is_compute)
"""The classes a :class:`ClassMix` may hold."""

_SHARE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class ClassMix:
    """The split of a piece of work's compute-bound time over compute classes.

    Build one with :meth:`of`, which drops zero shares, normalises the rest to sum to 1 and orders them by
    class, so that equal mixes compare and hash equal.

    Attributes:
        shares: ``(class, share of compute-bound time)`` pairs, in :data:`COMPUTE_CLASSES` order, each share
            in (0, 1], summing to 1.
    """

    shares: tuple[tuple[KernelClass, float], ...]

    def __post_init__(self) -> None:
        if not self.shares:
            raise ValueError("ClassMix needs at least one class with a positive share")
        order = [
            COMPUTE_CLASSES.index(kernel_class) for kernel_class, _ in self.shares if kernel_class.is_compute
        ]
        if len(order) != len(self.shares):
            raise ValueError(
                f"ClassMix holds compute classes only ({', '.join(COMPUTE_CLASSES)}); got "
                f"{[str(kernel_class) for kernel_class, _ in self.shares]}"
            )
        if order != sorted(set(order)):
            raise ValueError(
                "ClassMix shares must be in class order without repeats; build it with ClassMix.of"
            )
        if any(not math.isfinite(share) or share <= 0 for _, share in self.shares):
            raise ValueError(f"ClassMix shares must be positive and finite, got {self.shares}")
        if abs(sum(share for _, share in self.shares) - 1.0) > _SHARE_TOLERANCE:
            raise ValueError(f"ClassMix shares must sum to 1, got {self.shares}")

    @classmethod
    def of(cls, times: Mapping[KernelClass, float] | Iterable[tuple[KernelClass, float]]) -> ClassMix:
        """The mix of the given compute times (seconds or any common unit), normalised.

        Args:
            times: Class -> time (or ``(class, time)`` pairs; a class given twice adds up). Zero times are
                dropped; negative or non-finite ones are refused.

        Raises:
            ValueError: If no time is positive, a class is not a compute class, or a time is negative.
        """
        pairs = times.items() if isinstance(times, Mapping) else times
        totals: dict[KernelClass, float] = {}
        for kernel_class, time in pairs:
            kernel_class = KernelClass(kernel_class)
            if not kernel_class.is_compute:
                raise ValueError(
                    f"ClassMix.of: {kernel_class} is not a compute class; compute classes: "
                    f"{', '.join(COMPUTE_CLASSES)}"
                )
            if not math.isfinite(time) or time < 0:
                raise ValueError(
                    f"ClassMix.of: the time of {kernel_class} must be finite and >= 0, got {time!r}"
                )
            totals[kernel_class] = totals.get(kernel_class, 0.0) + time
        total = sum(totals.values())
        if total <= 0:
            raise ValueError("ClassMix.of: no class has a positive time")
        return cls(tuple((k, totals[k] / total) for k in COMPUTE_CLASSES if totals.get(k, 0.0) > 0))

    @classmethod
    def single(cls, kernel_class: KernelClass) -> ClassMix:
        """All compute-bound time in one class."""
        return cls(((kernel_class, 1.0),))

    def activity(self, activities: Mapping[KernelClass, float]) -> float:
        """The mix's mean activity: each class's activity (1 where ``activities`` has none) by its share.

        Summed as 1 plus each class's excess over 1, so that a mix of classes without activities is exactly 1
        (its shares' floating-point sum may miss 1 by an ulp): work of such a mix prices as work without one.
        """
        return 1.0 + sum(
            share * (activities.get(kernel_class, 1.0) - 1.0) for kernel_class, share in self.shares
        )

    def blend(self, own_s: float, other: ClassMix, other_s: float) -> ClassMix:
        """The mix of this work's ``own_s`` of compute time together with ``other_s`` of ``other``'s."""
        if own_s <= 0:
            return other
        if other_s <= 0:
            return self
        return ClassMix.of(
            [(k, s * own_s) for k, s in self.shares] + [(k, s * other_s) for k, s in other.shares]
        )

    def as_dict(self) -> dict[str, float]:
        """``{class name: share}``, for JSON."""
        return {str(kernel_class): share for kernel_class, share in self.shares}

    def describe(self) -> str:
        """``gemm_bf16 75 %, attention 25 %``."""
        return ", ".join(f"{kernel_class} {share:.0%}" for kernel_class, share in self.shares)


def parse_activities(raw: Mapping[str, float]) -> dict[KernelClass, float]:
    """Class activities from a file's ``{name: activity}`` map, checked.

    Raises:
        ValueError: If a name is not a compute class or an activity is not a positive number, or the reference
            class's activity is given and is not 1.
    """
    activities: dict[KernelClass, float] = {}
    for name, value in raw.items():
        try:
            kernel_class = KernelClass(name)
        except ValueError:
            raise ValueError(
                f"unknown kernel class {name!r}; compute classes: {', '.join(COMPUTE_CLASSES)}"
            ) from None
        if not kernel_class.is_compute:
            raise ValueError(
                f"{name!r} is not a compute class; compute classes: {', '.join(COMPUTE_CLASSES)}"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 5:
            raise ValueError(f"activity of {name} must be a number in (0, 5], got {value!r}")
        activities[kernel_class] = float(value)
    if activities.get(REFERENCE_CLASS, 1.0) != 1.0:
        raise ValueError(f"the activity of the reference class {REFERENCE_CLASS} is 1 by definition")
    return activities
