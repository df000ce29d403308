"""Read-only reads of a GPU's SM clock and of why NVML holds it below the clock asked for (its event reasons).

Under heavy load a GPU lowers its own SM clock to stay within its power limit; NVML then sets the software
power-cap bit of its clock-event reasons (``nvmlClocksEventReasonSwPowerCap``, formerly
``nvmlClocksThrottleReasonSwPowerCap``). :func:`open_clock_events` opens a :class:`ClockEventReader` on GPU
``index`` of a zeus ``GPUs`` object, at the same NVML boundary zeus uses: zeus's GPU gives the NVML handle
and ``pynvml`` the reads (zeus has no getter for them). Simulated GPUs carry a stand-in with the same
functions (``SimulatedGPUs.nvml``, :mod:`~megatron_energy.dvfs.simulated_nvml`), so the reader cannot tell
them apart. Only two NVML functions are called, both reads: ``nvmlDeviceGetClockInfo`` and
``nvmlDeviceGetCurrentClocksEventReasons`` (or ``nvmlDeviceGetCurrentClocksThrottleReasons`` in a
``pynvml`` older than the rename). Nothing is ever set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from megatron_energy.errors import EnergyRuntimeError

if TYPE_CHECKING:
    from zeus.device.gpu.common import GPUs

GPU_IDLE = 0x1
"""NVML's ``nvmlClocksEventReasonGpuIdle``: nothing runs on the GPU."""
SW_POWER_CAP = 0x4
"""NVML's ``nvmlClocksEventReasonSwPowerCap``: the clock is held down to keep the power within the limit."""
SW_THERMAL_SLOWDOWN = 0x20
"""NVML's ``nvmlClocksEventReasonSwThermalSlowdown``: the clock is held down to cool the GPU."""

_REASON_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
"""The reasons call by its current name, then by its name before NVML 12.2 renamed it."""


class ClockEventsUnavailableError(EnergyRuntimeError):
    """The GPU's clock-event reasons cannot be read (no NVML handle, or a library without the call)."""


@dataclass(frozen=True)
class ClockEvent:
    """One read of the SM clock and its clock-event reasons (measured on a GPU, modelled on a simulated one).

    Attributes:
        sm_clock_mhz: The SM clock NVML reports now. Units: MHz.
        reasons: NVML's clock-event reasons bit mask (``GPU_IDLE``, ``SW_POWER_CAP``, ...).
    """

    sm_clock_mhz: int
    reasons: int

    def held_at_power_cap(self, requested_mhz: float) -> bool:
        """Whether the clock is below ``requested_mhz`` with the software power-cap reason set."""
        return bool(self.reasons & SW_POWER_CAP) and self.sm_clock_mhz < requested_mhz


class ClockEventReader:
    """Reads GPU's SM clock and clock-event reasons through NVML functions (``pynvml`` or a stand-in).

    Args:
        nvml: The ``pynvml`` module, or an object with the same functions (simulated GPUs, tests).
        handle: The device handle those functions take.

    Raises:
        ClockEventsUnavailableError: ``nvml`` has no clock-event reasons call.
    """

    def __init__(self, nvml: Any, handle: object) -> None:
        calls = [getattr(nvml, name) for name in _REASON_CALLS if hasattr(nvml, name)]
        if not calls:
            raise ClockEventsUnavailableError(f"this NVML library has none of {', '.join(_REASON_CALLS)}")
        self._nvml = nvml
        self._handle = handle
        self._reasons = calls[0]

    def read(self) -> ClockEvent:
        """The SM clock and the reasons now (two NVML reads, tens of microseconds on a GPU).

        Raises:
            Exception: Whatever NVML raises (``pynvml.NVMLError``: e.g. a driver without the call).
        """
        clock = self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM)
        return ClockEvent(int(clock), int(self._reasons(self._handle)))


def open_clock_events(gpus: GPUs, index: int) -> ClockEventReader:
    """The reader of GPU ``index``: the simulated GPUs' stand-in, else ``pynvml`` on zeus's NVML handle.

    Raises:
        ClockEventsUnavailableError: No NVML handle (an AMD GPU, no GPU), or ``pynvml`` lacks the call.
    """
    stand_in = getattr(gpus, "nvml", None)
    if stand_in is not None:
        return ClockEventReader(stand_in, index)
    gpu = gpus.gpus[index] if index < len(gpus) else None
    handle = getattr(gpu, "handle", None)
    if handle is None:
        raise ClockEventsUnavailableError(f"GPU {index} has no NVML handle (not an NVIDIA GPU read by NVML)")
    import pynvml

    return ClockEventReader(pynvml, handle)
