"""The memory clock of one GPU for the run phase: set once through zeus/NVML, restored at exit.

A plan gives each rank one memory clock for the whole run phase (``plan_memory``). The frequency controller
owns one :class:`MemoryClockSetter` and calls :meth:`MemoryClockSetter.apply` when a plan is adopted or
stock clocks return (a fallback, the safety net), from the training thread: a memory clock changes a few
times per run, never per instruction. It locks the clock with zeus's ``set_memory_locked_clocks`` (the same
permission as SM clocks: root, or zeusd) after arming the clock guard, so the guard, its watchdog and the
lease reset it however the process ends (``reset_memory_locked_clocks``), as they do the SM clock.

In dry-run mode it records what it would set and touches nothing. A GPU that refuses (a clock it does not
list, no memory clock locking, no permission) leaves the run at the stock memory clock: one warning, then
every later request is ignored; the SM clocks are unaffected.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    from zeus.device.gpu.common import GPUs

logger = logging.getLogger(__name__)


@runtime_checkable
class MemoryArmer(Protocol):
    """What the setter tells before a real setter call (:class:`~megatron_energy.dvfs.guard.ClockGuard`)."""

    def arm_memory(self, index: int, clock_mhz: int) -> None:
        """GPU ``index``'s memory clock is about to be locked at ``clock_mhz``."""
        ...


class MemoryClockRecord(NamedTuple):
    """One memory clock change (``None``: back to the stock one), applied or (dry run) recorded."""

    clock_mhz: int | None
    dry_run: bool


class MemoryClockSetter:
    """Sets and restores one GPU's memory clock (see the module docstring).

    Args:
        gpus: The zeus ``GPUs`` object (real or simulated).
        index: The GPU.
        dry_run: Record what would be set; call no setter.
        guard: Armed before the first real lock, so the clock is reset however the process ends.
    """

    def __init__(self, gpus: GPUs, index: int, dry_run: bool, guard: MemoryArmer | None = None) -> None:
        self.gpus = gpus
        self.index = index
        self.dry_run = dry_run
        self._guard = guard
        self._current: int | None = None
        self._locked = False
        self.refused: str | None = None
        """Why the GPU refused a memory clock (the run then stays at the stock one); ``None`` until then."""
        self.records: list[MemoryClockRecord] = []
        """Every change, applied or recorded, in order."""

    @property
    def current_mhz(self) -> int | None:
        """The memory clock set (or, in a dry run, recorded) now; ``None``: the stock one."""
        return self._current

    def apply(self, clock_mhz: int | None) -> None:
        """Run at ``clock_mhz`` from now on (``None``: the stock memory clock); repeats are dropped."""
        if self.refused is not None or clock_mhz == self._current:
            return
        if not self.dry_run:
            try:
                self._set(clock_mhz)
            except Exception as error:  # the GPU said no: stock memory clock for the rest of the run
                self._refuse(clock_mhz, error)
                return
        self._current = clock_mhz
        self.records.append(MemoryClockRecord(clock_mhz, self.dry_run))

    def restore(self) -> None:
        """Back to the stock memory clock (a dry run records it); idempotent, never raises."""
        if self.dry_run or not self._locked:
            if self._current is not None:
                self._current = None
                self.records.append(MemoryClockRecord(None, self.dry_run))
            return
        try:
            self.gpus.reset_memory_locked_clocks(self.index)
        except Exception as error:  # a failed reset must not mask the caller's own exit path
            logger.warning("could not reset the memory clock of GPU %d: %s", self.index, error)
            return
        self._locked = False
        self._current = None
        self.records.append(MemoryClockRecord(None, False))

    def _set(self, clock_mhz: int | None) -> None:
        """Lock ``clock_mhz`` (after checking the GPU lists it) or reset to the stock clock."""
        if clock_mhz is None:
            if self._locked:
                self.gpus.reset_memory_locked_clocks(self.index)
                self._locked = False
            return
        supported = self.gpus.get_supported_memory_clocks(self.index)
        if clock_mhz not in supported:
            raise ValueError(f"it lists {sorted(supported, reverse=True)} MHz")
        if self._guard is not None:
            self._guard.arm_memory(self.index, clock_mhz)
        self._locked = True
        self.gpus.set_memory_locked_clocks(self.index, clock_mhz, clock_mhz)

    def _refuse(self, clock_mhz: int | None, error: Exception) -> None:
        self.refused = (
            f"GPU {self.index} refused memory clock {clock_mhz} MHz ({error}); the run keeps the stock "
            "memory clock (SM clocks as planned)"
        )
        logger.warning(self.refused)
        if self._locked:  # the lock may have half happened: back to stock (the guard retries at exit)
            try:
                self.gpus.reset_memory_locked_clocks(self.index)
                self._locked = False
            except Exception as reset_error:
                logger.warning("could not reset the memory clock of GPU %d: %s", self.index, reset_error)
