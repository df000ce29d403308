"""A GPU spec calibrated from a read-only run at stock clocks (``megatron-energy calibrate``).

The calibration run changes nothing on the GPU. It holds one workload per kernel class for a few seconds
each, back to back and duty-cycled (``dvfs.calibration_loops``), then a spinning wait and an idle window, and
reads the cumulative energy counter, the SM clock, the clock-event reasons and the supported clocks.
Under a heavy load the GPU lowers its own clock at its power limit, and classes of different activity land
at different clocks: :mod:`megatron_energy.dvfs.calibration_fit` fits the voltage curve and the activities
from those clocks and the duty-cycled powers. :func:`~megatron_energy.dvfs.calibrated_spec.calibrate_spec`
turns the run and the fit into the :class:`GpuSpec` fields that they determine, and carries every other field
from the shipped spec with its source:

=========================  ==============================================================================
field                      from
=========================  ==============================================================================
sm_clocks_mhz              supported SM clocks (NVML), measured
memory_clocks_mhz          supported memory clocks (NVML), measured
default_sm_clock_mhz       the highest supported SM clock (what the GPU boosts to at stock), measured
power_limit_w              the power-management limit in force (NVML), measured
idle_power_w               power of the idle loop, measured
blocked_power_w            power of the spinning-wait loop, measured
energy_counter_period_s    median interval between energy-counter updates, measured
voltage_min_v              fitted: ``V_min / V_max`` times the shipped ``voltage_max_v`` (knee kept)
dynamic_power_max_w        fitted: the reference bf16 matrix product's dynamic power at the top clock
class_activity             fitted: each other compute class's activity
memory_core_activity       the copy loop: ``P = P_idle + a · P_dyn · g(f) · max(f, f_sat) / f + P_mem``
                           solved for ``a`` (``P_mem`` is the shipped spec's), clamped to [0, 1]
everything else            carried from the shipped spec (knee, switch latency, interconnect, datasheet
                           peaks, saturation clock, memory power, the memory clock's idle share, prior)
=========================  ==============================================================================

Pure Python + numpy + PyYAML: no torch, NVML or zeus imports; the command does the measuring.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from megatron_energy.dvfs.kernel_classes import KernelClass
from megatron_energy.dvfs.spec import DESCRIPTIVE_FIELDS, GpuSpec


@dataclass(frozen=True)
class LoopMeasurement:
    """One loop of the calibration run, held at stock clocks (every figure measured).

    Attributes:
        name: The workload, e.g. ``"gemm_fp8_8192"``, ``"copy"``, ``"blocked"``, ``"idle"``; a duty-cycled
            run of a workload is named ``"<workload>@duty"``.
        duration_s: How long the loop ran (CUDA events; wall clock for the idle loop and duty runs).
        power_w: Mean power over the loop (slope of the energy counter over its updates).
        median_sm_clock_mhz: Median of the SM clock sampled during the loop (the clock the GPU chose).
        rate: Achieved throughput while busy: TFLOP/s for compute loops, GB/s (bytes read + written) for
            memory loops, 0 otherwise.
        detail: What the loop did, in words (kernel, sizes, repetitions).
        kernel_class: The kernel class of the loop's kernels (None for ``blocked`` and ``idle``).
        busy_fraction: Share of the loop's time the GPU ran its kernels (1 for a back-to-back loop; the
            CUDA-event busy time over the wall time for a duty-cycled run).
        clock_p10_mhz: 10th percentile of the sampled SM clock.
        clock_p90_mhz: 90th percentile of the sampled SM clock.
        power_cap_share: Share of the samples whose clock-event reasons held the software power cap.
        burst_clock_mhz: Median SM clock sampled inside the bursts of a duty-cycled run (None otherwise).
    """

    name: str
    duration_s: float
    power_w: float
    median_sm_clock_mhz: float
    rate: float = 0.0
    detail: str = ""
    kernel_class: KernelClass | None = None
    busy_fraction: float = 1.0
    clock_p10_mhz: float = 0.0
    clock_p90_mhz: float = 0.0
    power_cap_share: float = 0.0
    burst_clock_mhz: float | None = None

    def __post_init__(self) -> None:
        if self.kernel_class is not None:
            object.__setattr__(self, "kernel_class", KernelClass(self.kernel_class))

    @property
    def energy_j(self) -> float:
        """Energy of the loop: mean power x duration."""
        return self.power_w * self.duration_s

    @property
    def is_duty(self) -> bool:
        """Whether this is the duty-cycled run of a workload."""
        return self.name.endswith(DUTY_SUFFIX)


DUTY_SUFFIX = "@duty"
"""Appended to a workload's name for its duty-cycled run."""


@dataclass(frozen=True)
class CalibrationRun:
    """Everything a calibration run measured on one GPU.

    Attributes:
        gpu_name: As NVML names it (e.g. ``"NVIDIA H200"``).
        driver_version: NVIDIA driver version.
        date: ISO date of the run.
        supported_sm_clocks_mhz: Supported SM clocks at the highest memory clock.
        supported_memory_clocks_mhz: Supported memory clocks.
        power_limit_w: The power-management limit in force.
        counter_period_s: Median interval between energy-counter updates (None if not resolved).
        loops: The workloads' loops in the order they ran: each back-to-back loop, then its duty-cycled run
            where it has one.
        blocked: The spinning-wait loop.
        idle: The idle window.
    """

    gpu_name: str
    driver_version: str
    date: str
    supported_sm_clocks_mhz: tuple[int, ...]
    supported_memory_clocks_mhz: tuple[int, ...]
    power_limit_w: float
    counter_period_s: float | None
    loops: tuple[LoopMeasurement, ...]
    blocked: LoopMeasurement
    idle: LoopMeasurement

    def loop(self, name: str) -> LoopMeasurement | None:
        """The loop named ``name``, or None."""
        return next((loop for loop in self.loops if loop.name == name), None)

    def to_dict(self) -> dict[str, object]:
        """The run as JSON-ready values (``from_dict`` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CalibrationRun:
        """A run from :meth:`to_dict`'s values (e.g. a ``calibrate --json`` file's ``run``).

        Raises:
            ValueError: If a field is missing or of the wrong kind.
        """
        try:
            return cls(
                gpu_name=str(raw["gpu_name"]),
                driver_version=str(raw["driver_version"]),
                date=str(raw["date"]),
                supported_sm_clocks_mhz=tuple(int(c) for c in raw["supported_sm_clocks_mhz"]),
                supported_memory_clocks_mhz=tuple(int(c) for c in raw["supported_memory_clocks_mhz"]),
                power_limit_w=float(raw["power_limit_w"]),
                counter_period_s=None if raw["counter_period_s"] is None else float(raw["counter_period_s"]),
                loops=tuple(LoopMeasurement(**loop) for loop in raw["loops"]),
                blocked=LoopMeasurement(**raw["blocked"]),
                idle=LoopMeasurement(**raw["idle"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a calibration run: {error!r}") from error


def power_from_counter(times_s: Sequence[float], energies_j: Sequence[float]) -> tuple[float, float | None]:
    """Mean power and update period from energy-counter readings polled during a loop.

    The counter advances in steps (every ~100 ms on Hopper), so only the readings where it changed carry
    information; the power is the least-squares slope of energy against time over those change points,
    which is far less sensitive to the counter's granularity than two end-point reads.

    Args:
        times_s: Times of the polls (any origin), ascending.
        energies_j: Counter value at each poll, joules.

    Returns:
        ``(power_w, period_s)``: the slope, and the median interval between changes (None with fewer than
        three changes).

    Raises:
        ValueError: If the lengths differ or the counter changed fewer than twice.
    """
    times = np.asarray(times_s, dtype=float)
    energies = np.asarray(energies_j, dtype=float)
    if times.shape != energies.shape or times.ndim != 1:
        raise ValueError("power_from_counter: times and energies must be sequences of the same length")
    changed = np.flatnonzero(np.diff(energies) != 0.0) + 1
    if changed.size < 2:
        raise ValueError(
            "power_from_counter: the energy counter changed fewer than twice; hold the loop longer"
        )
    slope = float(np.polyfit(times[changed], energies[changed], 1)[0])
    period = float(np.median(np.diff(times[changed]))) if changed.size >= 3 else None
    return slope, period


def spec_differences(shipped: GpuSpec, calibrated: GpuSpec, rel_tol: float = 0.02) -> list[str]:
    """The numeric fields that differ by more than ``rel_tol``, one line each (shipped -> calibrated).

    Args:
        shipped: The shipped spec.
        calibrated: The spec from :func:`calibrate_spec`.
        rel_tol: Relative difference below which a field counts as unchanged.

    Returns:
        Lines such as ``"idle_power_w: 130 -> 112.4 (-13.5 %)"``; clock lists are compared as a whole.
    """
    lines = []
    for f in dataclasses.fields(GpuSpec):
        if f.name in DESCRIPTIVE_FIELDS:
            continue
        old, new = getattr(shipped, f.name), getattr(calibrated, f.name)
        if isinstance(old, tuple):
            if old != new:
                lines.append(f"{f.name}: {_clock_summary(old)} -> {_clock_summary(new)}")
            continue
        if isinstance(old, dict):
            if old != new:
                lines.append(f"{f.name}: {_activities_text(old)} -> {_activities_text(new)}")
            continue
        if old is None or new is None or abs(new - old) <= rel_tol * abs(old):
            continue
        lines.append(f"{f.name}: {old:g} -> {new:g} ({100 * (new / old - 1):+.1f} %)")
    return lines


COMPARISON_HEADER = "shipped vs calibrated"
"""The first line of :func:`comparison_lines` (scripts look for it)."""


def comparison_lines(shipped: GpuSpec, calibrated: GpuSpec) -> list[str]:
    """Every field side by side: shipped value, calibrated value, change, and where the new one came from.

    Args:
        shipped: The shipped spec.
        calibrated: The spec from :func:`calibrate_spec`.

    Returns:
        A header line (starting with :data:`COMPARISON_HEADER`), then one line per field:
        ``idle_power_w  shipped 125  calibrated 118.2 (-5.4 %)  measured``; the last word is ``measured``
        (this run) or ``carried`` (from the shipped file, unchanged).
    """
    lines = [f"{COMPARISON_HEADER} ({shipped.name}.yaml -> {calibrated.name}.yaml), per value:"]
    for f in dataclasses.fields(GpuSpec):
        if f.name in DESCRIPTIVE_FIELDS:
            continue
        old, new = getattr(shipped, f.name), getattr(calibrated, f.name)
        provenance = "measured" if calibrated.sources.get(f.name, "").startswith("measured") else "carried"
        if isinstance(old, tuple | dict):
            old_text, new_text = _summary(old), _summary(new)
            change = "same" if old == new else "differs"
        else:
            old_text = "-" if old is None else f"{old:g}"
            new_text = "-" if new is None else f"{new:g}"
            change = (
                "same" if old == new else (f"{100 * (new / old - 1):+.1f} %" if old and new else "differs")
            )
        lines.append(
            f"  {f.name:26s} shipped {old_text:>22s}  calibrated {new_text:>22s}  ({change})  {provenance}"
        )
    return lines


def _summary(value: tuple[int, ...] | dict[KernelClass, float]) -> str:
    """A clock list or a class-activity map in a few words."""
    return _clock_summary(value) if isinstance(value, tuple) else _activities_text(value)


def _activities_text(activities: dict[KernelClass, float]) -> str:
    """``gemm_fp8 1.31, attention 0.82`` (``none`` for an empty map)."""
    return ", ".join(f"{k} {a:.3g}" for k, a in activities.items()) or "none"


def _clock_summary(clocks: tuple[int, ...]) -> str:
    """``n clocks lo-hi MHz``."""
    return f"{len(clocks)} clocks {min(clocks)}-{max(clocks)} MHz"


def write_spec_yaml(spec: GpuSpec, path: Path, header: str) -> None:
    """Write ``spec`` in the schema of ``configs/gpus/*.yaml`` (loadable with ``load_gpu_spec(path)``).

    Args:
        spec: The spec; its name must be ``path``'s stem.
        path: Where to write.
        header: Comment lines put at the top (without ``#``).

    Raises:
        ValueError: If the spec's name is not the file's stem (the loader would refuse the file).
    """
    if spec.name != path.stem:
        raise ValueError(f"spec name {spec.name!r} must be the file stem {path.stem!r}")
    document: dict[str, object] = {}
    for f in sorted(dataclasses.fields(GpuSpec), key=lambda f: f.name == "sources"):
        value = getattr(spec, f.name)
        if f.name == "sm_clocks_mhz":
            value = _clock_grid(value)
        elif f.name == "memory_clocks_mhz":
            value = list(value)
        elif f.name == "sources":
            value = dict(value)
        elif f.name == "class_activity":
            value = {str(k): float(a) for k, a in value.items()}
        elif f.name == "ranges":
            if not value:
                continue
            value = {key: list(bounds) for key, bounds in value.items()}
        document[f.name] = value
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    body = yaml.safe_dump(document, sort_keys=False, width=10_000, allow_unicode=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(comment + body, encoding="utf-8")


def _clock_grid(clocks: tuple[int, ...]) -> dict[str, int] | list[int]:
    """A regular descending clock list as ``{max, min, step}``, else the list itself."""
    steps = {a - b for a, b in itertools.pairwise(clocks)}
    if len(clocks) > 2 and len(steps) == 1:
        return {"max": clocks[0], "min": clocks[-1], "step": steps.pop()}
    return list(clocks)
