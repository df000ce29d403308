"""A GPU spec calibrated from a read-only run at stock clocks (``megatron-energy calibrate``).

The calibration run changes nothing on the GPU. It holds four loops for a few seconds each and reads the
cumulative energy counter, the SM clock and the supported clocks:

* ``compute``: a bf16 matrix-product loop (compute-bound; often power-capped below the maximum clock);
* ``memory``: a device-to-device copy loop of a few GB (memory-bound);
* ``blocked``: a single spinning wait kernel, the way NCCL's kernels spin on a flag while a collective or a
  pipeline receive waits for its peer;
* ``idle``: nothing launched (the GPU still warm from the loops before it).

:func:`calibrate_spec` turns these into the :class:`GpuSpec` fields that they determine, through the
equations of :mod:`megatron_energy.dvfs.model`, and carries every other field from the shipped spec with its
source. Which field comes from where:

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
dynamic_power_max_w        compute loop: ``P = P_idle + P_dyn · (f / f_max) · v(f)²`` solved for ``P_dyn``
                           at the measured power ``P`` and the clock ``f`` the GPU chose (the voltage
                           curve ``v`` is the shipped spec's)
memory_core_activity       memory loop: ``P = P_idle + a · P_dyn · v(f)² · max(f, f_sat) / f_max + P_mem``
                           solved for ``a`` (``P_mem`` is the shipped spec's), clamped to [0, 1]
everything else            carried from the shipped spec (voltage curve, switch latency, interconnect,
                           datasheet peaks, saturation clock, memory power, prior)
=========================  ==============================================================================

Pure Python + numpy + PyYAML: no torch, NVML or zeus imports; the script does the measuring.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import DESCRIPTIVE_FIELDS, GpuSpec
from megatron_energy.dvfs.spec_ranges import SOURCE_PREFIX


@dataclass(frozen=True)
class LoopMeasurement:
    """One loop of the calibration run, held at stock clocks.

    Attributes:
        name: ``"compute"``, ``"memory"``, ``"blocked"`` or ``"idle"``.
        duration_s: How long the loop ran (CUDA events; wall clock for the idle loop).
        power_w: Mean power over the loop (slope of the energy counter over its updates).
        median_sm_clock_mhz: Median of the SM clock sampled during the loop (the clock the GPU chose).
        rate: Achieved throughput: TFLOP/s for ``compute``, GB/s (bytes read + written) for ``memory``,
            0 otherwise.
        detail: What the loop did, in words (kernel, sizes, repetitions).
    """

    name: str
    duration_s: float
    power_w: float
    median_sm_clock_mhz: float
    rate: float = 0.0
    detail: str = ""

    @property
    def energy_j(self) -> float:
        """Energy of the loop: mean power x duration."""
        return self.power_w * self.duration_s


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
        compute: The compute-bound loop.
        memory: The memory-bound loop.
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
    compute: LoopMeasurement
    memory: LoopMeasurement
    blocked: LoopMeasurement
    idle: LoopMeasurement


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


def calibrate_spec(shipped: GpuSpec, run: CalibrationRun, name: str) -> GpuSpec:
    """The spec the calibration run determines, every other field carried from ``shipped``.

    Args:
        shipped: The shipped spec of this GPU model (its voltage curve and assumptions are kept).
        run: The measurements.
        name: The new spec's name (the stem of the file it will be written to).

    Returns:
        A validated spec whose ``sources`` say, per field, what was measured (GPU, driver, date, loop) or
        from which shipped source it was carried.

    Raises:
        ValueError: If the measurements make an inconsistent spec (e.g. idle power above the power limit).
    """
    where = f"measured {run.gpu_name} (driver {run.driver_version}, {run.date}, megatron-energy calibrate)"
    sources = {key: f"carried from {shipped.name}.yaml: {text}" for key, text in shipped.sources.items()}
    values: dict[str, object] = {}

    def measured(field: str, value: object, how: str) -> None:
        values[field] = value
        sources[field] = f"{where}: {how}"

    clocks = tuple(sorted(run.supported_sm_clocks_mhz, reverse=True))
    f_max = float(clocks[0])
    measured("sm_clocks_mhz", clocks, f"{len(clocks)} supported SM clocks, {clocks[-1]}-{clocks[0]} MHz")
    measured("memory_clocks_mhz", tuple(sorted(run.supported_memory_clocks_mhz, reverse=True)), "NVML list")
    measured("default_sm_clock_mhz", clocks[0], "highest supported SM clock (stock boost)")
    measured("power_limit_w", round(run.power_limit_w, 1), "power-management limit in force")
    idle = run.idle
    measured("idle_power_w", round(idle.power_w, 1), _loop_text(idle))
    blocked_w = max(run.blocked.power_w, idle.power_w)
    clamp = "" if blocked_w == run.blocked.power_w else f"; below idle, so set to idle {idle.power_w:.1f} W"
    measured("blocked_power_w", round(blocked_w, 1), _loop_text(run.blocked) + clamp)
    if run.counter_period_s is not None:
        measured(
            "energy_counter_period_s",
            round(run.counter_period_s, 3),
            "median interval between total-energy counter updates",
        )

    voltage_model = GpuPowerModel(shipped)
    compute = run.compute
    f_compute = min(compute.median_sm_clock_mhz, f_max)
    v_compute = voltage_model.voltage_v(f_compute) / shipped.voltage_max_v
    p_dyn = (compute.power_w - idle.power_w) / ((f_compute / f_max) * v_compute**2)
    measured(
        "dynamic_power_max_w",
        round(p_dyn, 1),
        f"{_loop_text(compute)}; P = P_idle + P_dyn (f/f_max) v(f)^2 with the shipped voltage curve "
        f"(v = {v_compute:.3f})",
    )

    memory = run.memory
    f_memory = min(memory.median_sm_clock_mhz, f_max)
    v_memory = voltage_model.voltage_v(f_memory) / shipped.voltage_max_v
    f_sat = float(shipped.memory_saturation_mhz or 0.0)
    core_w = p_dyn * v_memory**2 * max(f_memory, f_sat) / f_max
    activity = (memory.power_w - idle.power_w - shipped.memory_power_w) / core_w
    clipped = min(max(activity, 0.0), 1.0)
    note = "" if clipped == activity else f" (solved {activity:.3f}, clamped to [0, 1])"
    measured(
        "memory_core_activity",
        round(clipped, 3),
        f"{_loop_text(memory)}; P = P_idle + a P_dyn v(f)^2 max(f, f_sat)/f_max + P_mem with the shipped "
        f"P_mem {shipped.memory_power_w:g} W{note}",
    )

    carried = {f.name: getattr(shipped, f.name) for f in dataclasses.fields(GpuSpec)}
    # a measured figure keeps no range of the shipped spec's: what it was unsure of is now measured
    dropped = [key for key in shipped.ranges if key.partition(".")[0] in values]
    for key in dropped:
        del sources[f"{SOURCE_PREFIX}{key}"]
    ranges = {key: bounds for key, bounds in shipped.ranges.items() if key not in dropped}
    carried.update(values, name=name, sources=sources, ranges=ranges)
    carried["display_name"] = f"{shipped.display_name} (calibrated {run.date})"
    spec = GpuSpec(**carried)
    cap_mhz = GpuPowerModel(spec).power_cap_clock_mhz(WorkProfile(compute_s=1.0, memory_s=0.0))
    sources["dynamic_power_max_w"] += (
        f"; check: the calibrated model caps pure compute at {cap_mhz:.0f} MHz (modelled) "
        f"vs {compute.median_sm_clock_mhz:.0f} MHz measured"
    )
    return dataclasses.replace(spec, sources=sources)


def _loop_text(loop: LoopMeasurement) -> str:
    """One loop's figures for a source entry."""
    rate = ""
    if loop.rate:
        rate = f", {loop.rate:.0f} {'TFLOP/s' if loop.name == 'compute' else 'GB/s'}"
    detail = f" ({loop.detail})" if loop.detail else ""
    return (
        f"{loop.name} loop{detail}: {loop.power_w:.1f} W over {loop.duration_s:.1f} s at median SM "
        f"{loop.median_sm_clock_mhz:.0f} MHz{rate}"
    )


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
        if isinstance(old, tuple):
            old_text, new_text = _clock_summary(old), _clock_summary(new)
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
