"""One simulated GPU behind zeus's ``GPU`` interface: every query and setter goes to its owner.

:class:`~megatron_energy.dvfs.simulated.SimulatedGPUs` (the owner: the power model, the virtual clocks and the
state file) hands out one :class:`SimulatedGPU` per index, so the session, the controller and the meter call
zeus's methods on it as on a real GPU (clocks in MHz, power in mW, energy in mJ). All figures are *modelled*.
"""

from __future__ import annotations

import math
from typing import Protocol

from zeus.device.gpu.common import GPU, ZeusGPUNotSupportedError

from megatron_energy.dvfs.spec import GpuSpec

SIMULATED_TEMPERATURE_C = 50
"""Constant die temperature the simulated GPUs report (the power model has no thermal state)."""


class _Readings(Protocol):
    """What a simulated GPU's state records of its power and energy counter."""

    power_w: float
    counter_mj: float


class GpuOwner(Protocol):
    """What a :class:`SimulatedGPU` needs of the ``SimulatedGPUs`` it belongs to."""

    @property
    def spec(self) -> GpuSpec:
        """The GPU modelled."""
        ...

    def state(self, index: int) -> _Readings:
        """The live state of GPU ``index``."""
        ...

    def lock_clocks(self, index: int, min_clock_mhz: int, max_clock_mhz: int) -> None:
        """Lock GPU ``index``'s SM clock range."""
        ...

    def lock_memory_clock(self, index: int, min_clock_mhz: int | None, max_clock_mhz: int | None) -> None:
        """Lock GPU ``index``'s memory clock (``None``: the top one)."""
        ...

    def reset_clocks(self, index: int) -> None:
        """Return GPU ``index`` to its default SM clock."""
        ...

    def average_power_w(self, index: int) -> float:
        """GPU ``index``'s average power over the last second of virtual time."""
        ...


class SimulatedGPU(GPU):
    """One simulated GPU; every query and setter goes through its owner, ``SimulatedGPUs``."""

    def __init__(self, gpu_index: int, owner: GpuOwner) -> None:
        """GPU ``gpu_index`` of ``owner``."""
        super().__init__(gpu_index)
        self._owner = owner
        self._disable_sys_admin_warning = True

    @property
    def supports_nonblocking_setters(self) -> bool:
        """Return False: setters apply at once (in virtual time they still take the switch latency)."""
        return False

    def get_name(self) -> str:
        """Return the modelled GPU's name, marked as simulated."""
        return f"{self._owner.spec.display_name} (simulated)"

    def get_power_management_limit_constraints(self) -> tuple[int, int]:
        """Return the modelled power limit as both bounds (the model has one fixed limit). Units: mW."""
        limit_mw = self.get_power_management_limit()
        return (limit_mw, limit_mw)

    def get_power_management_limit(self) -> int:
        """Return the spec's power limit. Units: mW."""
        return round(self._owner.spec.power_limit_w * 1000)

    def set_power_management_limit(self, power_limit_mw: int, block: bool = True) -> None:
        """Refuse: the power model has a fixed power limit."""
        raise ZeusGPUNotSupportedError("the simulated GPU models a fixed power limit")

    def reset_power_management_limit(self, block: bool = True) -> None:
        """Do nothing: the power limit is always the default."""

    def set_persistence_mode(self, enabled: bool, block: bool = True) -> None:
        """Refuse: persistence mode is not modelled."""
        raise ZeusGPUNotSupportedError("the simulated GPU does not model persistence mode")

    def get_persistence_mode(self) -> bool:
        """Return True (a simulated GPU never unloads)."""
        return True

    def get_supported_memory_clocks(self) -> list[int]:
        """Return the spec's memory clocks. Units: MHz."""
        return list(self._owner.spec.memory_clocks_mhz)

    def set_memory_locked_clocks(self, min_clock_mhz: int, max_clock_mhz: int, block: bool = True) -> None:
        """Lock the memory clock at ``max_clock_mhz`` (one of the spec's) for work and waits. Units: MHz."""
        self._owner.lock_memory_clock(self.gpu_index, min_clock_mhz, max_clock_mhz)

    def reset_memory_locked_clocks(self, block: bool = True) -> None:
        """Return to the top (stock) memory clock."""
        self._owner.lock_memory_clock(self.gpu_index, None, None)

    def get_supported_graphics_clocks(self, memory_clock_mhz: int | None = None) -> list[int]:
        """Return the spec's SM clocks, highest first like NVML. Units: MHz."""
        return list(self._owner.spec.sm_clocks_mhz)

    def set_gpu_locked_clocks(self, min_clock_mhz: int, max_clock_mhz: int, block: bool = True) -> None:
        """Lock the SM clock range; the GPU runs at ``max_clock_mhz`` after the switch latency. Units: MHz."""
        self._owner.lock_clocks(self.gpu_index, min_clock_mhz, max_clock_mhz)

    def reset_gpu_locked_clocks(self, block: bool = True) -> None:
        """Return to the default SM clock after the switch latency."""
        self._owner.reset_clocks(self.gpu_index)

    def get_average_power_usage(self) -> int:
        """Return the average power over the last second of virtual time. Units: mW."""
        return round(self._owner.average_power_w(self.gpu_index) * 1000)

    def get_instant_power_usage(self) -> int:
        """Return the power of the latest stretch of virtual time. Units: mW."""
        return round(self._owner.state(self.gpu_index).power_w * 1000)

    def get_average_memory_power_usage(self) -> int:
        """Refuse: the model does not split memory power out."""
        raise ZeusGPUNotSupportedError("the simulated GPU does not model memory power separately")

    def supports_get_total_energy_consumption(self) -> bool:
        """Return True."""
        return True

    def get_total_energy_consumption(self) -> int:
        """Return the energy counter (it advances every ``spec.energy_counter_period_s``). Units: mJ."""
        return math.floor(self._owner.state(self.gpu_index).counter_mj)

    def get_gpu_temperature(self) -> int:
        """Return a constant temperature. Units: Celsius."""
        return SIMULATED_TEMPERATURE_C
