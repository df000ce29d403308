"""Read-only reads of a GPU's power (averaged and instant) and SM clock, as one :class:`PowerReading`.

Two NVML calls a read, each of tens to hundreds of microseconds that releases the GIL (``ctypes``):

- ``nvmlDeviceGetFieldValues`` with fields 185 and 186 at once: ``NVML_FI_DEV_POWER_AVERAGE``, the averaged
  power (over 1 s on Ampere, except GA100, and newer: what ``nvmlDeviceGetPowerUsage`` returns there), and
  ``NVML_FI_DEV_POWER_INSTANT``, the instant power, which the driver refreshes about every 100 ms on an H100
  (measured, read-only; the averaged power hides the swing of a training step); both in mW;
- ``nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)``: the SM clock, in MHz.

Where the driver does not support field 185 (GA100 and older GPUs), the averaged power is read with
``nvmlDeviceGetPowerUsage`` instead, from then on. Where it does not support the instant field (an older GPU
or driver: the call raises, or the value comes back with an error code), the averaged power stands in for
it and :attr:`PowerReader.instant_note` says so; nothing is retried. :func:`open_power_reader` opens a
reader at the same NVML boundary as :mod:`~megatron_energy.dvfs.clock_events`: ``pynvml`` on zeus's NVML
handle, or the simulated GPUs' stand-in (``SimulatedGPUs.nvml``, :mod:`~megatron_energy.dvfs.simulated_nvml`:
the model's instant and averaged power), so a reader cannot tell them apart. Nothing is ever set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from megatron_energy.errors import EnergyRuntimeError

if TYPE_CHECKING:
    from zeus.device.gpu.common import GPUs

AVERAGE_POWER_FIELD = 185
"""NVML's ``NVML_FI_DEV_POWER_AVERAGE`` field id: the power averaged over 1 s (Ampere, except GA100, and
newer), in mW."""
INSTANT_POWER_FIELD = 186
"""NVML's ``NVML_FI_DEV_POWER_INSTANT`` field id: the instant power, in mW."""
INSTANT_FIELD_REFRESH_S = 0.1
"""How often the driver refreshes the instant-power field: about every 100 ms on an H100 (measured, 10 ms
polling, read-only; ``reference/power-swing-and-calibration.md``)."""
AVERAGE_WINDOW_S = 1.0
"""The window of NVML's averaged power (1 s on Ampere and newer): what it resolves when it stands in."""
NVML_SUCCESS = 0
"""NVML's ``NVML_SUCCESS`` return code (a field value's ``nvmlReturn``)."""
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
"""The member of NVML's value union each ``nvmlValueType_t`` (0..6) is read from."""


class PowerReadingsUnavailableError(EnergyRuntimeError):
    """The GPU's power cannot be read through NVML (no NVML handle: an AMD GPU, no GPU)."""


@dataclass(frozen=True)
class PowerReading:
    """One read of a GPU's power and SM clock (measured on a GPU, modelled on a simulated one).

    Attributes:
        average_w: NVML's averaged power. Units: W.
        instant_w: The instant-power field (the averaged power where the field is unsupported). Units: W.
        sm_clock_mhz: The SM clock NVML reports now. Units: MHz.
    """

    average_w: float
    instant_w: float
    sm_clock_mhz: float


class PowerReader:
    """Reads one GPU's power and SM clock through NVML functions (``pynvml`` or a stand-in).

    Args:
        nvml: The ``pynvml`` module, or an object with the same functions (simulated GPUs, tests).
        handle: The device handle those functions take.
    """

    def __init__(self, nvml: Any, handle: object) -> None:
        self._nvml = nvml
        self._handle = handle
        self.instant_note = ""
        """Why the instant power is the averaged one (field 186 unsupported); empty while the field reads."""
        self._average_field = True
        """Whether the averaged power is read as field 185 (else with ``nvmlDeviceGetPowerUsage``)."""

    @property
    def refresh_s(self) -> float:
        """The time over which the instant figures hold still.

        The field's refresh, or the averaged power's window where it stands in; a stand-in's own
        ``INSTANT_POWER_REFRESH_S`` (0 for a simulated GPU's exact model).
        """
        if self.instant_note:
            return AVERAGE_WINDOW_S
        return float(getattr(self._nvml, "INSTANT_POWER_REFRESH_S", INSTANT_FIELD_REFRESH_S))

    @property
    def instant_source(self) -> str:
        """What the instant figures are read from: NVML's field 186, or the averaged power in its place."""
        return "averaged power (instant field unsupported)" if self.instant_note else "instant field 186"

    def read(self) -> PowerReading:
        """The averaged power, the instant power and the SM clock now (two NVML calls; three on GA100, older).

        Raises:
            Exception: Whatever NVML raises for the averaged power or the clock (``pynvml.NVMLError``).
        """
        nvml, handle = self._nvml, self._handle
        average_w, instant_w = self._fields_w()
        if average_w is None:
            average_w = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        clock = float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        return PowerReading(average_w, average_w if instant_w is None else instant_w, clock)

    def _fields_w(self) -> tuple[float | None, float | None]:
        """Fields 185 and 186 (those still read) in watts, in one call; ``None`` for one that is not read.

        On a field's first failure it is no longer asked for: field 185's place is taken by
        ``nvmlDeviceGetPowerUsage``, field 186's by the averaged power, with :attr:`instant_note` saying why.
        """
        fields = [AVERAGE_POWER_FIELD] if self._average_field else []
        if not self.instant_note:
            fields.append(INSTANT_POWER_FIELD)
        if not fields:
            return None, None
        reader = getattr(self._nvml, "nvmlDeviceGetFieldValues", None)
        if reader is None:
            self._average_field = False
            self.instant_note = "this NVML library has no nvmlDeviceGetFieldValues"
            return None, None
        try:
            values = reader(self._handle, fields)
        except Exception as problem:  # NVMLError, or a binding that rejects a field id
            self._average_field = False
            if INSTANT_POWER_FIELD in fields:
                self.instant_note = (
                    f"field {INSTANT_POWER_FIELD} unreadable: {type(problem).__name__}: {problem}"
                )
            return None, None
        watts: dict[int, float] = {}
        for field, value in zip(fields, values, strict=True):
            if value.nvmlReturn == NVML_SUCCESS:
                watts[field] = float(getattr(value.value, _VALUE_MEMBERS[value.valueType])) / 1000.0
            elif field == AVERAGE_POWER_FIELD:
                self._average_field = False
            else:
                self.instant_note = (
                    f"field {INSTANT_POWER_FIELD} unsupported (NVML return {value.nvmlReturn})"
                )
        return watts.get(AVERAGE_POWER_FIELD), watts.get(INSTANT_POWER_FIELD)


def open_power_reader(gpus: GPUs, index: int) -> PowerReader:
    """The power reader of GPU ``index``: the simulated GPUs' stand-in, else ``pynvml`` on zeus's handle.

    Raises:
        PowerReadingsUnavailableError: No NVML handle (an AMD GPU, no GPU).
    """
    stand_in = getattr(gpus, "nvml", None)
    if stand_in is not None:
        return PowerReader(stand_in, index)
    gpu = gpus.gpus[index] if index < len(gpus) else None
    handle = getattr(gpu, "handle", None)
    if handle is None:
        raise PowerReadingsUnavailableError(
            f"GPU {index} has no NVML handle (not an NVIDIA GPU read by NVML): no power trace"
        )
    import pynvml

    return PowerReader(pynvml, handle)
