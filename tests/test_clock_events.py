"""NVML's SM clock and clock-event reasons: the reader, and the same reads on simulated GPUs (modelled)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron_energy.dvfs.clock_events import (
    GPU_IDLE,
    SW_POWER_CAP,
    SW_THERMAL_SLOWDOWN,
    ClockEvent,
    ClockEventReader,
    ClockEventsUnavailableError,
    open_clock_events,
)
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.simulated import SimulatedGPUs
from megatron_energy.dvfs.spec import load_gpu_spec

COMPUTE_BOUND = WorkProfile(compute_s=0.0019, memory_s=0.00046, fixed_s=0.000144)
"""A forward pass of GPT-3 1.3B on one of four stages: the H100's 700 W limit holds it near 1608 MHz."""
MEMORY_BOUND = WorkProfile(compute_s=0.0001, memory_s=0.001)
"""Streams memory: far below the power limit."""


@pytest.fixture
def gpus(tmp_path) -> SimulatedGPUs:
    return SimulatedGPUs(load_gpu_spec("h100-sxm"), state_path=tmp_path / "gpus.json")


def test_a_simulated_gpu_held_at_its_power_cap_reports_the_models_clock_and_the_cap_reason(gpus) -> None:
    reader = open_clock_events(gpus, 0)
    gpus.execute(0, COMPUTE_BOUND)
    expected = GpuPowerModel(gpus.spec).effective_clock_mhz(COMPUTE_BOUND, 1980)
    assert expected < 1980
    assert reader.read() == ClockEvent(round(expected), SW_POWER_CAP)
    assert reader.read().held_at_power_cap(1980)


def test_uncapped_work_idle_time_and_a_throttle_have_their_own_reasons(gpus) -> None:
    reader = open_clock_events(gpus, 0)
    assert reader.read() == ClockEvent(1980, GPU_IDLE)  # nothing ran yet
    gpus.execute(0, MEMORY_BOUND)
    assert reader.read() == ClockEvent(1980, 0)
    gpus.wait(0, 0.01, blocked=False)
    assert reader.read() == ClockEvent(1980, GPU_IDLE)
    gpus.throttle(0, 1200)  # below the power cap's clock: the throttle holds it, not the cap
    gpus.execute(0, COMPUTE_BOUND)
    assert reader.read() == ClockEvent(1200, SW_THERMAL_SLOWDOWN)
    assert not reader.read().held_at_power_cap(1980)


def test_a_clock_locked_below_the_power_caps_clock_is_not_held_by_the_cap(gpus) -> None:
    gpus.lock_clocks(0, 1200, 1200)
    gpus.wait(0, 1.0, blocked=True)  # the switch takes effect
    gpus.execute(0, COMPUTE_BOUND)
    assert open_clock_events(gpus, 0).read() == ClockEvent(1200, 0)


class _OldNvml:
    """A ``pynvml`` from before NVML renamed the throttle reasons to clock-event reasons."""

    NVML_CLOCK_SM = 1

    def nvmlDeviceGetClockInfo(self, handle: str, clock_type: int) -> int:  # noqa: N802 - NVML's name
        assert (handle, clock_type) == ("device", 1)
        return 1410

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: str) -> int:  # noqa: N802 - NVML's name
        return SW_POWER_CAP | GPU_IDLE


def test_the_reader_takes_the_reasons_call_by_its_older_name() -> None:
    assert ClockEventReader(_OldNvml(), "device").read() == ClockEvent(1410, SW_POWER_CAP | GPU_IDLE)


def test_a_library_without_the_reasons_call_is_refused_with_why() -> None:
    with pytest.raises(ClockEventsUnavailableError, match="nvmlDeviceGetCurrentClocksEventReasons"):
        ClockEventReader(SimpleNamespace(NVML_CLOCK_SM=1), "device")


class _Gpus:
    """A zeus ``GPUs`` stand-in holding GPUs without an NVML handle (as AMD GPUs are)."""

    def __init__(self, gpus: list[object]) -> None:
        self.gpus = gpus

    def __len__(self) -> int:
        return len(self.gpus)


def test_a_gpu_without_an_nvml_handle_has_no_reader() -> None:
    with pytest.raises(ClockEventsUnavailableError, match="no NVML handle"):
        open_clock_events(_Gpus([SimpleNamespace()]), 0)  # type: ignore[arg-type]
    with pytest.raises(ClockEventsUnavailableError, match="no NVML handle"):
        open_clock_events(_Gpus([]), 0)  # type: ignore[arg-type]


def test_an_nvidia_gpus_reads_go_to_pynvml_whose_refusal_is_an_nvml_error() -> None:
    """A zeus GPU's NVML handle is read through the real ``pynvml`` (here NVML has no GPU to answer)."""
    import pynvml

    reader = open_clock_events(_Gpus([SimpleNamespace(handle=object())]), 0)  # type: ignore[arg-type]
    with pytest.raises(pynvml.NVMLError):
        reader.read()
