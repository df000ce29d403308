"""EnergyMeter: energy per iteration and per named window from the GPUs' cumulative energy counters.

Energy comes from ``get_total_energy_consumption`` (mJ since driver load on NVIDIA; the simulated GPUs'
modelled counter otherwise): one read at each end of a window, the difference per GPU, summed over this
rank's GPUs and, given an ``all_reduce_sum`` callable, over all ranks.

**Where to call it.** Only at step or window boundaries, never per instruction or kernel: one counter read
costs ~3 ms on an H200 (measured: median ~2.8 ms for ``nvmlDeviceGetTotalEnergyConsumption``). A window
therefore spans whatever the GPU did between the two reads; the caller decides whether to synchronise the
device first (the meter never does).

**Resolution.** The counter only advances every ``counter_period_s`` (~100 ms on Hopper), so a window
shorter than ``RESOLVABLE_PERIODS`` (2) periods is marked ``resolved=False`` with the note "too short to
resolve": its energy may be off by up to a whole period's worth either way.

**Resets and wraps.** A reading lower than the previous one means the counter restarted (driver reload) or
wrapped. With ``counter_modulus_mj`` known the wrap is undone exactly; otherwise the counter is taken to have
restarted from zero (the energy before the restart is lost) and the window is flagged ``counter_reset``.

Every figure carries ``source``: ``"measured"`` for a real counter, ``"modelled"`` for simulated GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from megatron_energy.errors import EnergyRuntimeError
from megatron_energy.stats import RESOLVABLE_PERIODS

if TYPE_CHECKING:
    from zeus.device.gpu.common import GPUs

    from megatron_energy.dvfs.backends import GpuHandle

DEFAULT_COUNTER_PERIOD_S = 0.1
"""Counter period assumed for a GPU without a spec (NVML: 20-100 ms; measured ~100 ms on an H200)."""

AllReduceSum = Callable[[list[float]], list[float]]


class EnergyCounterUnavailableError(EnergyRuntimeError):
    """The GPUs have no cumulative energy counter (pre-Volta NVIDIA, or no GPU at all)."""


@dataclass(frozen=True)
class EnergyWindow:
    """Energy of one window.

    Attributes:
        name: The window's name (``"iteration"`` for :meth:`EnergyMeter.lap`).
        start_s: Window start (monotonic wall clock, or virtual time for simulated GPUs).
        end_s: Window end, same clock.
        energy_j_per_gpu: GPU index -> joules, this rank's GPUs.
        energy_j: Sum over this rank's GPUs.
        global_energy_j: Sum over all ranks (None without ``all_reduce_sum``).
        resolved: False if the window (on any rank, once reduced) was too short for the counter period.
        counter_reset: True if a counter went backwards during the window (on any rank, once reduced).
        source: ``"measured"`` (hardware counter) or ``"modelled"`` (simulated GPUs).
        note: Why the figure is not exact, or "".
    """

    name: str
    start_s: float
    end_s: float
    energy_j_per_gpu: dict[int, float]
    energy_j: float
    global_energy_j: float | None
    resolved: bool
    counter_reset: bool
    source: Literal["measured", "modelled"]
    note: str = ""

    @property
    def duration_s(self) -> float:
        """Window length in seconds."""
        return self.end_s - self.start_s

    @property
    def average_power_w(self) -> float:
        """This rank's average power over the window (0 for an empty window)."""
        return self.energy_j / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True)
class _OpenWindow:
    start_s: float
    totals_mj: dict[int, float]
    resets: int


class EnergyMeter:
    """Measures energy of named windows (and per iteration) on this rank's GPUs.

    Args:
        gpus: The zeus ``GPUs`` object (real or simulated).
        gpu_indices: This rank's GPUs (usually just its own: summing across ranks assumes no GPU is metered
            by two ranks).
        counter_period_s: The counter's update period (``spec.energy_counter_period_s``).
        all_reduce_sum: Element-wise sum of a list of floats across ranks (e.g. a wrapper around
            ``torch.distributed.all_reduce``); when given, every rank must end the same windows in the same
            order, as it is a collective.
        counter_modulus_mj: The counter's wrap-around value, if it has one; None = a decrease is a restart.
        source: Override for the figures' source; default ``gpus.energy_source`` if present, else
            ``"measured"``.
        clock: Time source; default virtual time for simulated GPUs, ``time.monotonic`` otherwise.

    Raises:
        EnergyCounterUnavailableError: If a GPU has no energy counter or no GPU is given.
    """

    def __init__(
        self,
        gpus: GPUs,
        gpu_indices: Sequence[int],
        *,
        counter_period_s: float = DEFAULT_COUNTER_PERIOD_S,
        all_reduce_sum: AllReduceSum | None = None,
        counter_modulus_mj: int | None = None,
        source: Literal["measured", "modelled"] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not gpu_indices:
            raise EnergyCounterUnavailableError("no GPU to meter")
        missing = [i for i in gpu_indices if not gpus.supports_get_total_energy_consumption(i)]
        if missing:
            raise EnergyCounterUnavailableError(f"GPU(s) {missing} have no cumulative energy counter")
        self.gpus = gpus
        self.gpu_indices = list(gpu_indices)
        self.counter_period_s = counter_period_s
        self.source: Literal["measured", "modelled"] = (
            source if source is not None else getattr(gpus, "energy_source", "measured")
        )
        self._all_reduce_sum = all_reduce_sum
        self._modulus_mj = counter_modulus_mj
        if clock is None:
            virtual_time_s = getattr(gpus, "virtual_time_s", None)
            first = self.gpu_indices[0]
            clock = (lambda: virtual_time_s(first)) if virtual_time_s is not None else time.monotonic
        self._clock = clock
        self._last_counters: dict[int, int] = {}
        self._open: dict[str, _OpenWindow] = {}
        self._total_mj: dict[int, float] = dict.fromkeys(self.gpu_indices, 0.0)
        """Reset/wrap-corrected energy since the first read, per GPU; windows take differences of it."""
        self._resets = 0

    @classmethod
    def from_handle(
        cls, handle: GpuHandle, gpu_indices: Sequence[int], all_reduce_sum: AllReduceSum | None = None
    ) -> EnergyMeter:
        """Build a meter for a :class:`~megatron_energy.dvfs.backends.GpuHandle` (its spec's counter period).

        Raises:
            EnergyCounterUnavailableError: As the constructor.
        """
        period_s = handle.spec.energy_counter_period_s if handle.spec else DEFAULT_COUNTER_PERIOD_S
        return cls(
            handle.gpus,
            gpu_indices,
            counter_period_s=period_s,
            all_reduce_sum=all_reduce_sum,
            source=handle.energy_source,
        )

    @property
    def min_resolvable_s(self) -> float:
        """Shortest window the counter resolves."""
        return RESOLVABLE_PERIODS * self.counter_period_s

    def begin_window(self, name: str) -> None:
        """Start (or restart) window ``name``. Reads the counters: call at boundaries only."""
        self._read()
        self._open[name] = _OpenWindow(self._clock(), dict(self._total_mj), self._resets)

    def end_window(self, name: str) -> EnergyWindow:
        """End window ``name`` and return its energy; a collective if ``all_reduce_sum`` was given.

        Raises:
            KeyError: If the window was not begun.
        """
        begin = self._open.pop(name)
        self._read()
        end_s = self._clock()
        per_gpu = {i: (self._total_mj[i] - begin.totals_mj[i]) / 1000.0 for i in self.gpu_indices}
        return self._window(name, begin.start_s, end_s, per_gpu, counter_reset=self._resets > begin.resets)

    def lap(self, name: str = "iteration") -> EnergyWindow | None:
        """End the running lap window and start the next one at the same reading (call once per step).

        Returns:
            The window since the previous ``lap`` call, or None on the first call.
        """
        if name not in self._open:
            self.begin_window(name)
            return None
        finished = self.end_window(name)
        self._open[name] = _OpenWindow(finished.end_s, dict(self._total_mj), self._resets)
        return finished

    def _read(self) -> None:
        """Read every counter once and fold the increments (reset/wrap-corrected) into the running totals."""
        for index in self.gpu_indices:
            counter = self.gpus.get_total_energy_consumption(index)
            last = self._last_counters.get(index)
            if last is not None:
                self._total_mj[index] += self._increment_mj(index, last, counter)
            self._last_counters[index] = counter

    def _increment_mj(self, index: int, last: int, counter: int) -> float:
        if counter >= last:
            return counter - last
        if self._modulus_mj is not None:
            return counter + self._modulus_mj - last
        self._resets += 1
        return counter

    def _window(
        self, name: str, start_s: float, end_s: float, per_gpu: dict[int, float], counter_reset: bool
    ) -> EnergyWindow:
        energy_j = sum(per_gpu.values())
        resolved = end_s - start_s >= self.min_resolvable_s
        global_energy_j = None
        if self._all_reduce_sum is not None:
            summed = self._all_reduce_sum([energy_j, float(not resolved), float(counter_reset)])
            global_energy_j, resolved, counter_reset = summed[0], summed[1] == 0.0, summed[2] > 0.0
        notes = []
        if not resolved:
            notes.append(
                f"too short to resolve: under {RESOLVABLE_PERIODS:g} x the {self.counter_period_s:g} s "
                "energy counter period (on this or another rank)"
            )
        if counter_reset:
            notes.append("energy counter went backwards (reset): energy before the reset is missing")
        return EnergyWindow(
            name=name,
            start_s=start_s,
            end_s=end_s,
            energy_j_per_gpu=per_gpu,
            energy_j=energy_j,
            global_energy_j=global_energy_j,
            resolved=resolved,
            counter_reset=counter_reset,
            source=self.source,
            note="; ".join(notes),
        )
