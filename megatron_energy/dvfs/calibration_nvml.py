"""The measuring side of the read-only calibration: NVML reads, a sampler thread, loops turned into figures.

``megatron-energy calibrate`` supplies the loops (``dvfs.calibration_loops``: torch kernels on the GPU) and
calls :func:`run_calibration`; everything between the loops and the
:class:`~megatron_energy.dvfs.calibration.CalibrationRun` lives here so that it runs, and is tested, without
a GPU: the ``nvml`` argument is the ``pynvml`` module on a GPU and a stand-in with the same functions in
tests (the NVML boundary).

Read-only by construction and by check: only these NVML functions are called —
``nvmlDeviceGetTotalEnergyConsumption``, ``nvmlDeviceGetPowerUsage``, ``nvmlDeviceGetClockInfo``,
``nvmlDeviceGetSupportedMemoryClocks``, ``nvmlDeviceGetSupportedGraphicsClocks``,
``nvmlDeviceGetPowerManagementLimit``, ``nvmlDeviceGetName``, ``nvmlSystemGetDriverVersion`` — and
:class:`SetterTripwires` replaces every ``nvmlDeviceSet*``/``Reset*``/``Clear*`` function of the module with
one that records the call and raises, so a setter reached by mistake stops the run before it changes the GPU.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from megatron_energy.dvfs.calibration import CalibrationRun, LoopMeasurement, power_from_counter

NVML_SETTER_PREFIXES = ("nvmlDeviceSet", "nvmlDeviceReset", "nvmlDeviceClear")
"""Every NVML function that could change a device setting starts with one of these."""

LOOP_NAMES = ("compute", "memory", "blocked")
"""The loops :func:`run_calibration` needs, in the order it runs them (idle comes last, launching nothing)."""


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


@dataclass(frozen=True)
class Sample:
    """One poll of the GPU (all measured).

    Attributes:
        time_s: ``perf_counter`` time of the energy read.
        energy_j: Cumulative energy counter, joules.
        sm_clock_mhz: SM clock in effect.
        power_w: NVML's instant-power field.
    """

    time_s: float
    energy_j: float
    sm_clock_mhz: float
    power_w: float


class NvmlSampler:
    """A thread polling the energy counter, SM clock and power of one GPU (read-only NVML calls).

    Args:
        nvml: The ``pynvml`` module (or a stand-in with the same functions).
        handle: The device handle.
        poll_s: Seconds between polls.
    """

    def __init__(self, nvml: Any, handle: object, poll_s: float) -> None:
        self._nvml = nvml
        self._handle = handle
        self._poll_s = poll_s
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
            self.samples.append(Sample(now, energy_j, clock, power_w))
            self._stop.wait(self._poll_s)

    def window(self, start_s: float, end_s: float) -> list[Sample]:
        """The samples taken in ``[start_s, end_s]``."""
        return [sample for sample in list(self.samples) if start_s <= sample.time_s <= end_s]


def loop_from_samples(
    name: str, samples: list[Sample], duration_s: float, detail: str
) -> tuple[LoopMeasurement, float | None]:
    """Power (energy-counter slope), median SM clock and counter period of one loop's samples.

    Args:
        name: The loop's name.
        samples: The samples inside the loop (its ramp left out).
        duration_s: How long the loop ran.
        detail: What the loop did, in words.

    Returns:
        The measurement (rate 0, for the caller to fill) and the counter period seen (None if unresolved).

    Raises:
        ValueError: If the counter changed fewer than twice in the window (hold the loop longer).
    """
    if not samples:
        raise ValueError(f"{name} loop: no NVML sample inside it; hold the loop longer or poll faster")
    power_w, period_s = power_from_counter([s.time_s for s in samples], [s.energy_j for s in samples])
    clock = statistics.median(s.sm_clock_mhz for s in samples)
    instant_w = statistics.median(s.power_w for s in samples)
    detail = f"{detail}; NVML instant-power field median {instant_w:.0f} W"
    return LoopMeasurement(name, duration_s, power_w, clock, 0.0, detail), period_s


@dataclass(frozen=True)
class Loop:
    """A loop the caller runs on the GPU.

    Attributes:
        run: Runs the loop for about the given seconds; returns its measured duration (CUDA events) and the
            repetitions done.
        detail: What it does, in words.
        rate: Throughput from ``(repetitions, duration_s)`` (TFLOP/s, GB/s); None for no rate.
    """

    run: Callable[[float], tuple[float, int]]
    detail: str
    rate: Callable[[int, float], float] | None = None


def run_calibration(
    nvml: Any,
    handle: object,
    loops: Mapping[str, Loop],
    loop_s: float,
    poll_s: float = 0.005,
    ramp_s: float = 0.3,
    idle: Callable[[float], None] = time.sleep,
) -> CalibrationRun:
    """Hold each loop for ``loop_s``, then idle as long, sampling NVML throughout; nothing is set.

    Args:
        nvml: The ``pynvml`` module (initialised) or a stand-in; its setters are tripwired for the run.
        handle: The device handle.
        loops: ``compute``, ``memory`` and ``blocked`` (:data:`LOOP_NAMES`).
        loop_s: Seconds per loop and of idle.
        poll_s: Seconds between NVML polls.
        ramp_s: Samples in the first ``ramp_s`` of each loop are left out (clock and power settle).
        idle: Waits the given seconds without launching work.

    Returns:
        The run: the GPU's facts (name, driver, clocks, power limit) and the four measured loops.

    Raises:
        ValueError: A loop is missing, or a loop's window saw fewer than two counter updates.
        AssertionError: Something reached an NVML setter (the run stops there).
    """
    missing = [name for name in LOOP_NAMES if name not in loops]
    if missing:
        raise ValueError(f"run_calibration: loops {missing} missing; give {list(LOOP_NAMES)}")
    tripwires = SetterTripwires()
    tripwires.install(nvml)
    memory_clocks = tuple(int(c) for c in nvml.nvmlDeviceGetSupportedMemoryClocks(handle))
    sm_clocks = tuple(int(c) for c in nvml.nvmlDeviceGetSupportedGraphicsClocks(handle, max(memory_clocks)))
    measured: dict[str, LoopMeasurement] = {}
    periods: list[float] = []
    with NvmlSampler(nvml, handle, poll_s) as sampler:
        for name in (*LOOP_NAMES, "idle"):
            began = time.perf_counter()
            if name == "idle":
                idle(loop_s)
                duration_s, repetitions, detail = time.perf_counter() - began, 0, "no kernel"
            else:
                duration_s, repetitions = loops[name].run(loop_s)
                detail = loops[name].detail
            window = sampler.window(began + ramp_s, time.perf_counter())
            loop, period = loop_from_samples(name, window, duration_s, detail)
            rate = loops[name].rate if name in loops else None
            if rate is not None:
                loop = dataclasses.replace(loop, rate=rate(repetitions, duration_s))
            measured[name] = loop
            periods += [] if period is None else [period]
    if tripwires.calls:  # pragma: no cover - the tripwire raised already
        raise AssertionError(f"setters reached: {tripwires.calls}")
    return CalibrationRun(
        gpu_name=_text(nvml.nvmlDeviceGetName(handle)),
        driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
        date=datetime.date.today().isoformat(),
        supported_sm_clocks_mhz=sm_clocks,
        supported_memory_clocks_mhz=memory_clocks,
        power_limit_w=nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0,
        counter_period_s=statistics.median(periods) if periods else None,
        compute=measured["compute"],
        memory=measured["memory"],
        blocked=measured["blocked"],
        idle=measured["idle"],
    )


def _text(value: str | bytes) -> str:
    """NVML strings are bytes in older pynvml releases."""
    return value.decode() if isinstance(value, bytes) else value
