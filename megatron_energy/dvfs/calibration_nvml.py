"""The measuring side of the read-only calibration: NVML reads, a sampler thread, loops turned into figures.

``megatron-energy calibrate`` supplies the loops (``dvfs.calibration_loops``: torch kernels on the GPU) and
calls :func:`run_calibration`; everything between the loops and the
:class:`~megatron_energy.dvfs.calibration.CalibrationRun` lives here so that it runs, and is tested, without
a GPU: the ``nvml`` argument is the ``pynvml`` module on a GPU and a stand-in with the same functions in
tests (the NVML boundary).

Read-only by construction and by check: only these NVML functions are called —
``nvmlDeviceGetTotalEnergyConsumption``, ``nvmlDeviceGetPowerUsage``, ``nvmlDeviceGetClockInfo``,
``nvmlDeviceGetCurrentClocksEventReasons`` (``...ThrottleReasons`` on older bindings),
``nvmlDeviceGetTemperature``,``nvmlDeviceGetSupportedMemoryClocks``, ``nvmlDeviceGetSupportedGraphicsClocks``,
``nvmlDeviceGetPowerManagementLimit``, ``nvmlDeviceGetName``, ``nvmlSystemGetDriverVersion`` — and
:class:`SetterTripwires` replaces every ``nvmlDeviceSet*``/``Reset*``/``Clear*`` function of the module with
one that records the call and raises, so a setter reached by mistake stops the run before it changes the GPU.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from megatron_energy.dvfs.calibration import DUTY_SUFFIX, CalibrationRun, LoopMeasurement, power_from_counter
from megatron_energy.dvfs.kernel_classes import KernelClass

NVML_SETTER_PREFIXES = ("nvmlDeviceSet", "nvmlDeviceReset", "nvmlDeviceClear")
"""Every NVML function that could change a device setting starts with one of these."""


class SetterTripwires:
    """Replaces every setter of an NVML module with a function that records the call and raises."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        """The setters reached, in order (empty after a read-only run)."""

    def install(self, nvml: Any) -> None:
        """Wire every ``nvmlDeviceSet*``/``Reset*``/``Clear*`` attribute of ``nvml``."""
        for name in dir(nvml):
            if name.startswith(NVML_SETTER_PREFIXES):
                setattr(nvml, name, self.wire(f"{getattr(nvml, '__name__', 'nvml')}.{name}"))

    def wire(self, label: str) -> Callable[..., None]:
        """A function that records ``label`` and raises ``AssertionError`` when called."""

        def tripped(*args: object, **kwargs: object) -> None:
            self.calls.append(label)
            raise AssertionError(f"read-only GPU code reached a setter: {label}")

        return tripped


POWER_CAP_REASON = 0x4
"""NVML's clock-event reason bit for the software power cap (``nvmlClocksEventReasonSwPowerCap``)."""

REFERENCE_LOOP_CLASS = KernelClass.GEMM_BF16
"""A run needs at least one back-to-back loop of this class (the spec's reference class)."""


@dataclass(frozen=True)
class Sample:
    """One poll of the GPU (all measured).

    Attributes:
        time_s: ``perf_counter`` time of the energy read.
        energy_j: Cumulative energy counter, joules.
        sm_clock_mhz: SM clock in effect.
        power_w: NVML's instant-power field.
        reasons: The clock-event reason bits (0 where the driver cannot say).
        temperature_c: GPU temperature, °C (NaN where the driver cannot say).
    """

    time_s: float
    energy_j: float
    sm_clock_mhz: float
    power_w: float
    reasons: int = 0
    temperature_c: float = math.nan


class NvmlSampler:
    """A thread polling the energy counter, SM clock, power and clock-event reasons of one GPU (read-only).

    Args:
        nvml: The ``pynvml`` module (or a stand-in with the same functions).
        handle: The device handle.
        poll_s: Seconds between polls.
    """

    def __init__(self, nvml: Any, handle: object, poll_s: float) -> None:
        self._nvml = nvml
        self._handle = handle
        self._poll_s = poll_s
        self._reasons = _reasons_reader(nvml)
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)

    def __enter__(self) -> NvmlSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        nvml, handle = self._nvml, self._handle
        while not self._stop.is_set():
            energy_j = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0
            now = time.perf_counter()
            clock = float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
            power_w = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            reasons = int(self._reasons(handle)) if self._reasons is not None else 0
            temperature = self._temperature()
            self.samples.append(Sample(now, energy_j, clock, power_w, reasons, temperature))
            self._stop.wait(self._poll_s)

    def _temperature(self) -> float:
        """The GPU's temperature, °C, or NaN where NVML (or its stand-in) cannot read it."""
        reader = getattr(self._nvml, "nvmlDeviceGetTemperature", None)
        if reader is None:
            return math.nan
        return float(reader(self._handle, self._nvml.NVML_TEMPERATURE_GPU))

    def window(self, start_s: float, end_s: float) -> list[Sample]:
        """The samples taken in ``[start_s, end_s]``."""
        return [sample for sample in list(self.samples) if start_s <= sample.time_s <= end_s]


def _reasons_reader(nvml: Any) -> Callable[[object], int] | None:
    """NVML's clock-event reasons getter under its current or its older name, or None."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        reader = getattr(nvml, name, None)
        if reader is not None:
            return reader
    return None


def loop_from_samples(
    name: str,
    samples: list[Sample],
    duration_s: float,
    detail: str,
    bursts: Sequence[tuple[float, float]] = (),
) -> tuple[LoopMeasurement, float | None]:
    """Power (energy-counter slope), SM clock figures and counter period of one loop's samples.

    Args:
        name: The loop's name.
        samples: The samples inside the loop (its ramp left out).
        duration_s: How long the loop ran.
        detail: What the loop did, in words.
        bursts: For a duty-cycled run, the ``(start, end)`` times of its bursts: the burst clock is the
            median of the samples inside them.

    Returns:
        The measurement (rate 0, class None, busy fraction 1, for the caller to fill) and the counter period
        seen (None if unresolved).

    Raises:
        ValueError: If the counter changed fewer than twice in the window (hold the loop longer).
    """
    if not samples:
        raise ValueError(f"{name} loop: no NVML sample inside it; hold the loop longer or poll faster")
    power_w, period_s = power_from_counter([s.time_s for s in samples], [s.energy_j for s in samples])
    clocks = [s.sm_clock_mhz for s in samples]
    p10, p90 = (float(v) for v in np.percentile(clocks, [10, 90]))
    capped = sum(1 for s in samples if s.reasons & POWER_CAP_REASON) / len(samples)
    in_bursts = [s.sm_clock_mhz for s in samples if any(start <= s.time_s <= end for start, end in bursts)]
    instant_w = statistics.median(s.power_w for s in samples)
    temperature = statistics.median(s.temperature_c for s in samples)
    degrees = "" if math.isnan(temperature) else f", {temperature:.0f} °C"
    detail = f"{detail}; NVML instant-power field median {instant_w:.0f} W{degrees}"
    loop = LoopMeasurement(
        name,
        duration_s,
        power_w,
        statistics.median(clocks),
        detail=detail,
        clock_p10_mhz=p10,
        clock_p90_mhz=p90,
        power_cap_share=capped,
        burst_clock_mhz=statistics.median(in_bursts) if in_bursts else None,
    )
    return loop, period_s


@dataclass(frozen=True)
class BurstRun:
    """What a duty-cycled run did: bursts of kernels with idle gaps between them.

    Attributes:
        duration_s: Wall time of the whole run.
        busy_s: The bursts' time on the GPU, CUDA events.
        repetitions: Kernels run.
        windows: ``perf_counter`` ``(start, end)`` of each burst (launch to completion).
    """

    duration_s: float
    busy_s: float
    repetitions: int
    windows: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Loop:
    """A workload the caller runs on the GPU.

    Attributes:
        run: Runs the workload back to back for about the given seconds; returns its measured duration (CUDA
            events) and the repetitions done.
        detail: What it does, in words.
        rate: Throughput from ``(repetitions, duration_s)`` (TFLOP/s, GB/s); None for no rate.
        kernel_class: The class of its kernels (None for the blocked loop).
        bursts: Runs it duty-cycled for ``(seconds, burst_s, gap_s)``: bursts of about ``burst_s`` of kernels,
            each waited for, then ``gap_s`` with nothing launched; None where no duty-cycled run is wanted.
    """

    run: Callable[[float], tuple[float, int]]
    detail: str
    rate: Callable[[int, float], float] | None = None
    kernel_class: KernelClass | None = None
    bursts: Callable[[float, float, float], BurstRun] | None = None


@dataclass(frozen=True)
class LoopTiming:
    """How long each loop is held and how a duty-cycled run is cut.

    Attributes:
        loop_s: Seconds of each back-to-back loop; its first half is left out (clock and power settle).
        duty_s: Seconds of each duty-cycled run.
        burst_s: Seconds of kernels per burst of a duty-cycled run.
        gap_s: Idle seconds between bursts (with ``burst_s``, the duty cycle: 1/3 by default, below the
            power limit for every class measured so far).
        ramp_s: Samples in the first ``ramp_s`` of a duty-cycled run, the blocked loop and idle are left out.
        poll_s: Seconds between NVML polls.
    """

    loop_s: float = 6.0
    duty_s: float = 4.0
    burst_s: float = 0.010
    gap_s: float = 0.020
    ramp_s: float = 0.3
    poll_s: float = 0.005


def run_calibration(
    nvml: Any,
    handle: object,
    loops: Mapping[str, Loop],
    timing: LoopTiming,
    idle: Callable[[float], None] = time.sleep,
    progress: Callable[[str], None] = lambda line: None,
) -> CalibrationRun:
    """Hold each loop (and its duty-cycled run), then idle, sampling NVML throughout; nothing is set.

    Args:
        nvml: The ``pynvml`` module (initialised) or a stand-in; its setters are tripwired for the run.
        handle: The device handle.
        loops: Workload name -> loop, in the order to run them; ``blocked`` (a spinning wait, class None)
            and at least one loop of the reference class (bf16 matrix products) are required.
        timing: Seconds per loop, duty cycle, polling.
        idle: Waits the given seconds without launching work.
        progress: Called with one line as each loop ends.

    Returns:
        The run: the GPU's facts (name, driver, clocks, power limit) and every measured loop.

    Raises:
        ValueError: A required loop is missing, or a loop's window saw fewer than two counter updates.
        AssertionError: Something reached an NVML setter (the run stops there).
    """
    if "blocked" not in loops or not any(
        loop.kernel_class == REFERENCE_LOOP_CLASS for loop in loops.values()
    ):
        raise ValueError(
            f"run_calibration: give a 'blocked' loop and at least one {REFERENCE_LOOP_CLASS} loop; got "
            f"{sorted(loops)}"
        )
    tripwires = SetterTripwires()
    tripwires.install(nvml)
    memory_clocks = tuple(int(c) for c in nvml.nvmlDeviceGetSupportedMemoryClocks(handle))
    sm_clocks = tuple(int(c) for c in nvml.nvmlDeviceGetSupportedGraphicsClocks(handle, max(memory_clocks)))
    measured: list[LoopMeasurement] = []
    periods: list[float] = []

    def keep(loop: LoopMeasurement, period: float | None) -> LoopMeasurement:
        measured.append(loop)
        periods.extend([] if period is None else [period])
        progress(describe_loop(loop))
        return loop

    with NvmlSampler(nvml, handle, timing.poll_s) as sampler:
        for name, workload in loops.items():
            began = time.perf_counter()
            duration_s, repetitions = workload.run(timing.loop_s)
            ramp_s = timing.ramp_s if workload.kernel_class is None else timing.loop_s / 2
            window = sampler.window(began + ramp_s, time.perf_counter())
            loop, period = loop_from_samples(name, window, duration_s, workload.detail)
            rate = workload.rate(repetitions, duration_s) if workload.rate is not None else 0.0
            keep(dataclasses.replace(loop, rate=rate, kernel_class=workload.kernel_class), period)
            if workload.bursts is not None:
                keep(*_duty_run(sampler, name, workload, timing))
        began = time.perf_counter()
        idle(timing.loop_s)
        window = sampler.window(began + timing.ramp_s, time.perf_counter())
        idle_loop = keep(*loop_from_samples("idle", window, time.perf_counter() - began, "no kernel"))
    if tripwires.calls:  # pragma: no cover - the tripwire raised already
        raise AssertionError(f"setters reached: {tripwires.calls}")
    blocked = next(loop for loop in measured if loop.name == "blocked")
    return CalibrationRun(
        gpu_name=_text(nvml.nvmlDeviceGetName(handle)),
        driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
        date=datetime.date.today().isoformat(),
        supported_sm_clocks_mhz=sm_clocks,
        supported_memory_clocks_mhz=memory_clocks,
        power_limit_w=nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0,
        counter_period_s=statistics.median(periods) if periods else None,
        loops=tuple(loop for loop in measured if loop.name not in ("blocked", "idle")),
        blocked=blocked,
        idle=idle_loop,
    )


def _duty_run(
    sampler: NvmlSampler, name: str, workload: Loop, timing: LoopTiming
) -> tuple[LoopMeasurement, float | None]:
    """The duty-cycled run of ``workload``: its power, busy fraction and the clock inside its bursts."""
    assert workload.bursts is not None  # the caller checks
    began = time.perf_counter()
    bursts = workload.bursts(timing.duty_s, timing.burst_s, timing.gap_s)
    window = sampler.window(began + timing.ramp_s, time.perf_counter())
    detail = (
        f"{workload.detail}, duty-cycled: ~{timing.burst_s * 1e3:g} ms bursts, {timing.gap_s * 1e3:g} ms gaps"
    )
    loop, period = loop_from_samples(
        f"{name}{DUTY_SUFFIX}", window, bursts.duration_s, detail, bursts.windows
    )
    rate = workload.rate(bursts.repetitions, bursts.busy_s) if workload.rate is not None else 0.0
    busy = bursts.busy_s / bursts.duration_s
    return dataclasses.replace(
        loop, rate=rate, kernel_class=workload.kernel_class, busy_fraction=busy
    ), period


def describe_loop(loop: LoopMeasurement) -> str:
    """One line of a loop's figures, each measured."""
    burst = f", in bursts {loop.burst_clock_mhz:.0f} MHz" if loop.burst_clock_mhz is not None else ""
    busy = f"  busy {loop.busy_fraction:4.0%}" if loop.is_duty else ""
    return (
        f"{loop.name:22s} {loop.power_w:6.1f} W  SM {loop.median_sm_clock_mhz:5.0f} MHz "
        f"({loop.clock_p10_mhz:.0f}-{loop.clock_p90_mhz:.0f}{burst}){busy}  "
        f"power cap {loop.power_cap_share:4.0%}  rate {loop.rate:7.1f}  (measured)"
    )


def _text(value: str | bytes) -> str:
    """NVML strings are bytes in older pynvml releases."""
    return value.decode() if isinstance(value, bytes) else value
