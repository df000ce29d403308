"""The NVML reads of simulated GPUs: SM clock, clock-event reasons and power, as ``pynvml`` gives a GPU's.

``SimulatedGPUs.nvml`` is a :class:`SimulatedNvml`;
:func:`~megatron_energy.dvfs.clock_events.open_clock_events` and
:func:`~megatron_energy.dvfs.power_reader.open_power_reader` read it with the same calls as ``pynvml``, the
GPU's index standing for the device handle. The averaged power is the model's over the last second of
virtual time (``SimulatedGPUs.average_power_w``), the instant-power field (186) the power of the latest
stretch of virtual time, time-stamped in virtual microseconds. The clock is the
one the GPU's latest stretch of virtual time ran at: for work, the model's effective clock
(``GpuPowerModel.effective_clock_mhz``: the clock in effect, lowered to fit the power limit, then to a thermal
throttle's ceiling), rounded to whole MHz as NVML reports it; for a wait, the clock in effect. The reasons say
why that clock is below the one in effect: ``SW_POWER_CAP`` when the model's power cap lowered it,
``SW_THERMAL_SLOWDOWN`` when a throttle did (``SimulatedGPUs.throttle``), ``GPU_IDLE`` after an idle wait.
Every figure is modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from megatron_energy.dvfs.power_reader import AVERAGE_POWER_FIELD, INSTANT_POWER_FIELD

NVML_CLOCK_SM = 1
"""NVML's ``NVML_CLOCK_SM`` clock type (the only one modelled)."""
NVML_VALUE_TYPE_UNSIGNED_INT = 1
"""NVML's ``NVML_VALUE_TYPE_UNSIGNED_INT``: the value is in the union's ``uiVal``."""
NVML_ERROR_NOT_SUPPORTED = 3
"""NVML's ``NVML_ERROR_NOT_SUPPORTED``, a field value's ``nvmlReturn`` for a field not modelled."""


class _ClockState(Protocol):
    """What a simulated GPU's state records of its latest stretch of virtual time."""

    running_sm_clock_mhz: float
    clock_event_reasons: int
    power_w: float
    virtual_time_s: float


class _SimulatedGpus(Protocol):
    """What the reads need of ``SimulatedGPUs``."""

    def state(self, index: int) -> _ClockState:
        """The live state of GPU ``index``."""
        ...

    def average_power_w(self, index: int) -> float:
        """GPU ``index``'s average power over the last second of virtual time."""
        ...


@dataclass
class FieldUnion:
    """NVML's value union, as far as the modelled fields fill it."""

    uiVal: int = 0  # noqa: N815 - NVML's name
    """An unsigned integer value."""


@dataclass
class FieldValue:
    """One field's value, as ``pynvml``'s ``c_nvmlFieldValue_t`` holds it."""

    fieldId: int  # noqa: N815 - NVML's name
    """The field asked for."""
    timestamp: int = 0
    """When the value was read: virtual time in microseconds."""
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_INT  # noqa: N815 - NVML's name
    """Which member of ``value`` holds it."""
    nvmlReturn: int = 0  # noqa: N815 - NVML's name
    """0 (success), or ``NVML_ERROR_NOT_SUPPORTED`` for a field not modelled."""
    value: FieldUnion = field(default_factory=FieldUnion)
    """The value."""


class SimulatedNvml:
    """The read-only NVML functions of simulated GPUs (the handle is the GPU's index)."""

    NVML_CLOCK_SM = NVML_CLOCK_SM
    INSTANT_POWER_REFRESH_S = 0.0
    """The modelled instant power is exact at any virtual time (NVML's field refreshes about every 0.1 s)."""

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

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802 - NVML's name
        """The model's average power over the last second of virtual time. Units: mW."""
        return round(self._gpus.average_power_w(handle) * 1000)

    def nvmlDeviceGetFieldValues(self, handle: int, field_ids: list[int]) -> list[FieldValue]:  # noqa: N802
        """Each field's value in mW: the instant power (186), the averaged one (185); others unsupported."""
        state = self._gpus.state(handle)
        stamp = round(state.virtual_time_s * 1e6)
        modelled = {
            INSTANT_POWER_FIELD: state.power_w,
            AVERAGE_POWER_FIELD: self._gpus.average_power_w(handle),
        }
        return [
            FieldValue(field_id, stamp, value=FieldUnion(round(modelled[field_id] * 1000)))
            if field_id in modelled
            else FieldValue(field_id, stamp, nvmlReturn=NVML_ERROR_NOT_SUPPORTED)
            for field_id in field_ids
        ]
