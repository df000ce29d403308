"""The interfaces ``EnergySession`` needs from its GPU-side parts (the dvfs layer implements them)."""

from __future__ import annotations

from typing import Protocol

from megatron_energy.dvfs.controller import BoundaryEvent
from megatron_energy.dvfs.meter import EnergyWindow


class Controller(Protocol):
    """Changes this rank's SM clock at instruction boundaries (``dvfs.controller.FrequencyController``)."""

    def request(self, clock_mhz: float | None, boundary_event: BoundaryEvent | None = None) -> bool:
        """Ask for ``clock_mhz`` (``RESET`` for stock) once ``boundary_event`` completes on the GPU."""
        ...

    def close(self) -> None:
        """Stop switching and reset any clock this controller locked."""
        ...


class Meter(Protocol):
    """Measures this rank's GPU energy between laps (``dvfs.meter.EnergyMeter``)."""

    def lap(self, name: str = "iteration") -> EnergyWindow | None:
        """Close the current window and open the next; ``None`` when no counter is readable."""
        ...


class Guard(Protocol):
    """Resets locked clocks however the process ends (``dvfs.guard.ClockGuard``)."""

    def close(self) -> None:
        """Release the guard after a clean reset."""
        ...
