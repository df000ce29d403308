"""The NVML reads of simulated GPUs: their SM clock and clock-event reasons, as ``pynvml`` gives a real GPU's.

``SimulatedGPUs.nvml`` is a :class:`SimulatedNvml`;
:func:`~megatron_energy.dvfs.clock_events.open_clock_events` reads it with the same calls as ``pynvml``, the
GPU's index standing for the device handle. The clock is the
one the GPU's latest stretch of virtual time ran at: for work, the model's effective clock
(``GpuPowerModel.effective_clock_mhz``: the clock in effect, lowered to fit the power limit, then to a thermal
throttle's ceiling), rounded to whole MHz as NVML reports it; for a wait, the clock in effect. The reasons say
why that clock is below the one in effect: ``SW_POWER_CAP`` when the model's power cap lowered it,
``SW_THERMAL_SLOWDOWN`` when a throttle did (``SimulatedGPUs.throttle``), ``GPU_IDLE`` after an idle wait.
Every figure is modelled.
"""

from __future__ import annotations

from typing import Protocol

NVML_CLOCK_SM = 1
"""NVML's ``NVML_CLOCK_SM`` clock type (the only one modelled)."""


class _ClockState(Protocol):
    """What a simulated GPU's state records of its latest stretch of virtual time."""

    running_sm_clock_mhz: float
    clock_event_reasons: int


class _SimulatedGpus(Protocol):
    """What the reads need of ``SimulatedGPUs``."""

    def state(self, index: int) -> _ClockState:
        """The live state of GPU ``index``."""
        ...


class SimulatedNvml:
    """The read-only NVML functions of simulated GPUs (the handle is the GPU's index)."""

    NVML_CLOCK_SM = NVML_CLOCK_SM

    def __init__(self, gpus: _SimulatedGpus) -> None:
        self._gpus = gpus

    def nvmlDeviceGetClockInfo(self, handle: int, clock_type: int) -> int:  # noqa: N802 - NVML's name
        """The SM clock the GPU's latest stretch of virtual time ran at. Units: MHz.

        Raises:
            ValueError: For another clock type than ``NVML_CLOCK_SM``.
        """
        if clock_type != NVML_CLOCK_SM:
            raise ValueError(f"simulated GPUs model the SM clock only, not NVML clock type {clock_type}")
        return round(self._gpus.state(handle).running_sm_clock_mhz)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:  # noqa: N802 - NVML's name
        """Why that clock is below the clock in effect: NVML's reasons bit mask."""
        return self._gpus.state(handle).clock_event_reasons
