"""Simulated GPUs behind zeus's ``GPUs``/``GPU`` interface, driven by ``GpuPowerModel`` and a virtual clock.

A :class:`SimulatedGPUs` object is what ``open_gpus("simulated", ...)`` returns when no real GPU is used. The
session, the controller and the meter call the same zeus methods on it as on real GPUs (locked clocks,
supported clocks, cumulative energy in mJ, power in mW; each GPU a
:class:`~megatron_energy.dvfs.simulated_gpu.SimulatedGPU`), so they cannot tell the two apart.

Time does not pass on its own: the owner advances each GPU's virtual clock with :meth:`SimulatedGPUs.execute`
(run a :class:`~megatron_energy.dvfs.model.WorkProfile` at the clock in effect) and :meth:`SimulatedGPUs.wait`
(spend time blocked in a communication wait or idle). A clock change asked for at virtual time ``t`` takes
effect at ``t + spec.switch_latency_s`` and replaces one still pending; work that straddles that instant runs
partly at each clock (the rule of :mod:`megatron_energy.dvfs.clock_switch`, the simulator's too).
:meth:`SimulatedGPUs.execute_sequence` runs an instruction as its phases one after another and calls back at
given offsets from its start (the GPU's own notion of the instruction's start), so clocks requested inside
an instruction change the rest of it piecewise, in virtual time. The
cumulative energy counter advances in steps of ``spec.energy_counter_period_s`` like NVML's, with the
seeded noise of an :class:`~megatron_energy.dvfs.emulation.Emulation` if one is given (which also says
whether the instruction timer may report exact energies, and what runs between two schedules). NVML's reads
of the SM clock and its clock-event reasons (the power-cap bit when the model's power limit lowers the clock)
come from ``SimulatedGPUs.nvml`` (:mod:`~megatron_energy.dvfs.simulated_nvml`). All figures are *modelled*.

Observable state (clock locks, clock in effect, virtual time, energy, setter call counts) lives in a small
JSON file written atomically, so another process (the clock watchdog, a test) can read it with
:func:`read_state` and reset it with :func:`reset_state_file`. Clock changes are written at once; time and
energy updates at most every ``state_write_interval_s`` of wall time (call :meth:`SimulatedGPUs.write_state`
to force one).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
from zeus.device.gpu.common import GPU, GPUs, ZeusGPUInvalidArgError

from megatron_energy.atomic import write_atomically
from megatron_energy.dvfs.clock_events import GPU_IDLE, SW_POWER_CAP, SW_THERMAL_SLOWDOWN
from megatron_energy.dvfs.clock_switch import is_due, lands_at_s
from megatron_energy.dvfs.emulation import Emulation
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.simulated_gpu import SimulatedGPU
from megatron_energy.dvfs.simulated_nvml import SimulatedNvml
from megatron_energy.dvfs.simulated_state import STATE_SCHEMA_VERSION, read_state, reset_state_file
from megatron_energy.dvfs.spec import GpuSpec

__all__ = ["STATE_SCHEMA_VERSION", "SimulatedGPUs", "read_state", "reset_state_file"]

AVERAGE_POWER_WINDOW_S = 1.0
"""Window of ``get_average_power_usage``, like NVML's 1 s average on Ampere and newer."""
_TIME_TOLERANCE_S = 1e-12
"""A timed callback this close to the current virtual time is due (guards against rounding)."""


_instances = itertools.count()


def default_state_path() -> Path:
    """Return a fresh default state file, ``<tmp>/megatron_energy_sim/gpus-<pid>-<n>.json``."""
    return Path(tempfile.gettempdir()) / "megatron_energy_sim" / f"gpus-{os.getpid()}-{next(_instances)}.json"


@dataclass
class _GpuState:
    """Mutable state of one simulated GPU (serialised into the state file as is)."""

    index: int
    sm_clock_mhz: int
    """Clock in effect now (default clock when nothing is locked)."""
    locked_sm_clock_mhz: int | None = None
    """Clock most recently locked (it may still be pending); None = stock clocks."""
    pending_sm_clock_mhz: int | None = None
    pending_at_s: float | None = None
    """Virtual time at which ``pending_sm_clock_mhz`` takes effect; None = no change pending."""
    virtual_time_s: float = 0.0
    energy_mj: float = 0.0
    """Exact modelled energy since creation."""
    counter_mj: float = 0.0
    """What the energy counter shows: ``energy_mj`` at the last counter update (plus the counter noise)."""
    counter_exact_mj: float = 0.0
    """``energy_mj`` at the last counter update (what a noiseless counter shows)."""
    power_w: float = 0.0
    """Power of the most recent segment of virtual time."""
    memory_clock_mhz: int | None = None
    """Memory clock locked now (in effect at once: the run phase sets it once); None = the top (stock) one."""
    throttle_sm_clock_mhz: int | None = None
    """Thermal throttling ceiling (``SimulatedGPUs.throttle``): work runs no faster than this; None = none."""
    running_sm_clock_mhz: float = 0.0
    """The clock the latest stretch of virtual time ran at (work: the model's effective clock)."""
    clock_event_reasons: int = GPU_IDLE
    """Why that clock is below the clock in effect, as NVML's bit mask (``dvfs.simulated_nvml``)."""
    set_calls: int = 0
    reset_calls: int = 0
    recent: deque[tuple[float, float]] = field(default_factory=deque, repr=False)
    """(virtual time, energy) samples covering the last ``AVERAGE_POWER_WINDOW_S``; not serialised."""


class SimulatedGPUs(GPUs):
    """A set of simulated GPUs of one spec, with a virtual clock each and a shared JSON state file.

    Thread-safe: a controller thread may change clocks while the training thread advances time.

    Args:
        spec: The GPU modelled.
        num_gpus: How many GPUs (CUDA-style indices ``0..num_gpus-1``).
        state_path: Where the JSON state file goes; default :func:`default_state_path`.
        state_write_interval_s: Least wall time between two writes caused by time advancing.
        emulation: How the GPUs depart from exact (counter noise, hidden energies, work between two
            schedules); exact by default.
    """

    energy_source = "modelled"
    """Where energy figures read from these GPUs come from (the meter labels its figures with this)."""

    def __init__(
        self,
        spec: GpuSpec,
        num_gpus: int = 1,
        state_path: str | os.PathLike[str] | None = None,
        state_write_interval_s: float = 0.05,
        emulation: Emulation | None = None,
    ) -> None:
        if num_gpus < 1:
            raise ValueError(f"num_gpus must be at least 1, got {num_gpus}")
        self.spec = spec
        self.emulation = emulation or Emulation()
        self._noise = [np.random.default_rng([self.emulation.seed, i]) for i in range(num_gpus)]
        self.model = GpuPowerModel(spec)
        self.state_path = Path(state_path) if state_path is not None else default_state_path()
        self._write_interval_s = state_write_interval_s
        self._lock = threading.RLock()
        self._last_write_s = -math.inf
        default_mhz = spec.default_sm_clock_mhz
        self._states = [
            _GpuState(index=i, sm_clock_mhz=default_mhz, running_sm_clock_mhz=default_mhz)
            for i in range(num_gpus)
        ]
        self._gpus = [SimulatedGPU(i, self) for i in range(num_gpus)]
        self.nvml = SimulatedNvml(self)
        """The NVML reads of these GPUs' clocks and clock-event reasons (``dvfs.clock_events``)."""
        self.write_state()

    def __del__(self) -> None:
        """Nothing to release (the state file stays for observers)."""

    @property
    def gpus(self) -> Sequence[GPU]:
        """Return the simulated GPU objects."""
        return self._gpus

    def state(self, index: int) -> _GpuState:
        """Return the live state record of GPU ``index`` (read-only use)."""
        return self._states[index]

    def virtual_time_s(self, index: int) -> float:
        """Return GPU ``index``'s virtual time in seconds."""
        return self._states[index].virtual_time_s

    def current_clock_mhz(self, index: int) -> int:
        """Return the SM clock in effect on GPU ``index`` now (before any pending switch). Units: MHz."""
        return self._states[index].sm_clock_mhz

    def lock_clocks(self, index: int, min_clock_mhz: int, max_clock_mhz: int) -> None:
        """Lock GPU ``index``'s SM clock range; it takes effect after the switch latency (virtual time).

        Raises:
            ZeusGPUInvalidArgError: If the range is empty or outside the supported clocks.
        """
        lowest, highest = self.spec.min_sm_clock_mhz, self.spec.max_sm_clock_mhz
        if not lowest <= min_clock_mhz <= max_clock_mhz <= highest:
            raise ZeusGPUInvalidArgError(
                f"locked clock range [{min_clock_mhz}, {max_clock_mhz}] MHz is not within the supported "
                f"[{lowest}, {highest}] MHz of {self.spec.name}"
            )
        with self._lock:
            state = self._states[index]
            state.set_calls += 1
            state.locked_sm_clock_mhz = self.spec.snap_sm_clock(max_clock_mhz)
            self._schedule_switch(state, state.locked_sm_clock_mhz)

    def lock_memory_clock(self, index: int, min_clock_mhz: int | None, max_clock_mhz: int | None) -> None:
        """Lock GPU ``index``'s memory clock at ``max_clock_mhz`` at once (``None``: back to the top one).

        Raises:
            ZeusGPUInvalidArgError: If the range is empty or its top is not one of the spec's memory clocks.
        """
        clocks = self.spec.memory_clocks_mhz
        if max_clock_mhz is not None and (
            max_clock_mhz not in clocks or min_clock_mhz is None or min_clock_mhz > max_clock_mhz
        ):
            raise ZeusGPUInvalidArgError(
                f"locked memory clock range [{min_clock_mhz}, {max_clock_mhz}] MHz does not end at one of "
                f"{self.spec.name}'s memory clocks {list(clocks)} MHz"
            )
        with self._lock:
            top = max_clock_mhz is None or max_clock_mhz == self.spec.max_memory_clock_mhz
            self._states[index].memory_clock_mhz = None if top else max_clock_mhz
            self._persist(force=True)

    def reset_clocks(self, index: int) -> None:
        """Return GPU ``index`` to its default SM clock after the switch latency."""
        with self._lock:
            state = self._states[index]
            state.reset_calls += 1
            state.locked_sm_clock_mhz = None
            self._schedule_switch(state, self.spec.default_sm_clock_mhz)

    def throttle(self, index: int, max_clock_mhz: int | None) -> None:
        """Emulate thermal throttling of GPU ``index``: its clock stays at or below ``max_clock_mhz``.

        The locked clock is unchanged (as on a real GPU, the firmware overrides it); ``None`` lifts the
        throttle. Used to inject a straggler into simulated runs.
        """
        with self._lock:
            self._states[index].throttle_sm_clock_mhz = max_clock_mhz
            self._persist(force=True)

    def execute(self, index: int, work: WorkProfile) -> tuple[float, float]:
        """Run ``work`` on GPU ``index`` at the clock in effect, advancing its virtual time and energy.

        A switch that falls due while the work runs splits it: the part done so far ran at the old clock,
        the rest runs at the new one.

        Returns:
            ``(time_s, energy_j)`` of this execution (modelled).
        """
        return self.execute_sequence(index, (work,))

    def execute_sequence(
        self,
        index: int,
        works: Sequence[WorkProfile],
        timed: Sequence[tuple[float, Callable[[], object]]] = (),
    ) -> tuple[float, float]:
        """Run ``works`` (one instruction's phases) one after another on GPU ``index``, calling back on time.

        Each work runs like :meth:`execute`'s, at the clock in effect, except for the power cap: it is the
        whole sequence's (the power controller's average over the instruction, as for an instruction run
        in one piece), so at one clock the phases take exactly the time and energy of their sum run in one
        piece. A callback ``(offset_s, call)`` is called (on this thread, under this object's lock, which it
        may take again: e.g. to lock a clock) when the virtual time reaches the sequence's start plus
        ``offset_s``; callbacks whose offset lies beyond the sequence's end are not called (their moment
        never came).

        Returns:
            ``(time_s, energy_j)`` of the whole sequence (modelled).
        """
        whole = works[0] if len(works) == 1 else sum(works[1:], works[0])
        with self._lock:
            state = self._states[index]
            start_s, start_mj = state.virtual_time_s, state.energy_mj
            pending = deque(sorted(timed, key=lambda entry: entry[0]))
            for work in works:
                remaining = 1.0  # fraction of the work still to do
                while remaining > 0.0:
                    while pending and start_s + pending[0][0] <= state.virtual_time_s + _TIME_TOLERANCE_S:
                        pending.popleft()[1]()
                    clock = _clock_in_effect(state)
                    full_time_s, power_w = self._rate(state, work, whole, clock)
                    needed_s = remaining * full_time_s
                    until_call_s = start_s + pending[0][0] - state.virtual_time_s if pending else math.inf
                    step_s = min(needed_s, self._time_to_switch(state), until_call_s)
                    self._note_running_clock(state, whole, clock)
                    self._advance(state, step_s, power_w)
                    remaining = 0.0 if step_s >= needed_s else remaining - step_s / full_time_s
            self._persist(force=False)
            return state.virtual_time_s - start_s, (state.energy_mj - start_mj) / 1000.0

    def _rate(
        self, state: _GpuState, work: WorkProfile, whole: WorkProfile, clock_mhz: float
    ) -> tuple[float, float]:
        """Time and power of ``work`` at ``clock_mhz`` and the memory clock, under ``whole``'s power cap."""
        model, memory_mhz = self.model, state.memory_clock_mhz
        if work is whole:
            return model.time_s(work, clock_mhz, memory_mhz), model.power_w(work, clock_mhz, memory_mhz)
        effective_mhz = model.effective_clock_mhz(whole, clock_mhz, memory_mhz)
        return model.uncapped_time_s(work, effective_mhz, memory_mhz), model.uncapped_power_w(
            work, effective_mhz, memory_mhz
        )

    def _note_running_clock(self, state: _GpuState, whole: WorkProfile, clock_mhz: float) -> None:
        """What NVML would report while ``whole`` runs at ``clock_mhz``: its effective clock, and why."""
        state.running_sm_clock_mhz = self.model.effective_clock_mhz(whole, clock_mhz)
        capped = self.model.power_cap_clock_mhz(whole) < clock_mhz
        throttled = clock_mhz < state.sm_clock_mhz
        reasons = (SW_POWER_CAP if capped else 0) | (SW_THERMAL_SLOWDOWN if throttled else 0)
        state.clock_event_reasons = reasons

    def wait(self, index: int, duration_s: float, blocked: bool) -> float:
        """Spend ``duration_s`` of virtual time on GPU ``index`` without work.

        Args:
            index: The GPU.
            duration_s: How long.
            blocked: True for a communication wait (a spinning kernel, ``spec.blocked_power_w``), False for
                plain idle (``spec.idle_power_w``); a lower memory clock saves its share of either.

        Returns:
            The modelled energy of the wait in joules.
        """
        if duration_s < 0:
            raise ValueError(f"duration_s must not be negative, got {duration_s}")
        with self._lock:
            state = self._states[index]
            memory_saving_w = self.model.static_power_w() - self.model.static_power_w(state.memory_clock_mhz)
            power_w = (self.spec.blocked_power_w if blocked else self.spec.idle_power_w) - memory_saving_w
            start_mj = state.energy_mj
            left_s = duration_s
            while left_s > 0.0:
                step_s = min(left_s, self._time_to_switch(state))
                state.running_sm_clock_mhz = _clock_in_effect(state)
                state.clock_event_reasons = 0 if blocked else GPU_IDLE
                self._advance(state, step_s, power_w)
                left_s -= step_s
            self._persist(force=False)
            return (state.energy_mj - start_mj) / 1000.0

    def average_power_w(self, index: int) -> float:
        """Return GPU ``index``'s average power over the last ``AVERAGE_POWER_WINDOW_S`` of virtual time."""
        with self._lock:
            state = self._states[index]
            if not state.recent:
                return state.power_w
            oldest_s, oldest_mj = state.recent[0]
            span_s = state.virtual_time_s - oldest_s
            return state.power_w if span_s <= 0 else (state.energy_mj - oldest_mj) / 1000.0 / span_s

    def write_state(self) -> None:
        """Write the state file now (atomically: a reader never sees a partial file)."""
        with self._lock:
            self._persist(force=True)

    def _schedule_switch(self, state: _GpuState, clock_mhz: int) -> None:
        """Request ``clock_mhz`` now: it lands after the switch latency and replaces a pending request."""
        state.pending_sm_clock_mhz = clock_mhz
        state.pending_at_s = lands_at_s(state.virtual_time_s, self.spec.switch_latency_s)
        self._apply_due_switch(state)
        self._persist(force=True)

    def _time_to_switch(self, state: _GpuState) -> float:
        if state.pending_at_s is None:
            return math.inf
        return max(0.0, state.pending_at_s - state.virtual_time_s)

    def _apply_due_switch(self, state: _GpuState) -> None:
        if state.pending_at_s is not None and is_due(state.pending_at_s, state.virtual_time_s):
            assert state.pending_sm_clock_mhz is not None
            state.sm_clock_mhz = state.pending_sm_clock_mhz
            state.pending_sm_clock_mhz = state.pending_at_s = None
            self._persist(force=True)

    def _advance(self, state: _GpuState, duration_s: float, power_w: float) -> None:
        """Advance ``state`` by ``duration_s`` at ``power_w``; update the counter; apply a due switch."""
        start_s = state.virtual_time_s
        end_s = start_s + duration_s
        period_s = self.spec.energy_counter_period_s
        last_update_s = math.floor(end_s / period_s) * period_s if period_s > 0 else end_s
        if last_update_s >= start_s:
            exact_mj = state.energy_mj + power_w * (last_update_s - start_s) * 1000.0
            updates = max(1, math.floor(end_s / period_s) - math.floor(start_s / period_s)) if period_s else 1
            state.counter_mj += (exact_mj - state.counter_exact_mj) * self._counter_factor(
                state.index, updates
            )
            state.counter_exact_mj = exact_mj
        state.energy_mj += power_w * duration_s * 1000.0
        state.virtual_time_s = end_s
        state.power_w = power_w
        state.recent.append((end_s, state.energy_mj))
        while len(state.recent) > 1 and state.recent[1][0] <= end_s - AVERAGE_POWER_WINDOW_S:
            state.recent.popleft()
        self._apply_due_switch(state)

    def _counter_factor(self, index: int, updates: int) -> float:
        """The counter noise of ``updates`` counter updates' increments summed (1 without noise)."""
        noise = self.emulation.counter_noise
        if noise == 0.0:
            return 1.0
        return 1.0 + noise / math.sqrt(updates) * float(self._noise[index].standard_normal())

    def _persist(self, force: bool) -> None:
        now_s = time.monotonic()
        if not force and now_s - self._last_write_s < self._write_interval_s:
            return
        self._last_write_s = now_s
        gpus = []
        for state in self._states:
            # the fields but ``recent`` are scalars: no deep copy (asdict's) of its samples at every write
            gpus.append({f.name: getattr(state, f.name) for f in fields(state) if f.name != "recent"})
        write_atomically(
            self.state_path,
            json.dumps(
                {
                    "schema_version": STATE_SCHEMA_VERSION,
                    "spec": self.spec.name,
                    "default_sm_clock_mhz": self.spec.default_sm_clock_mhz,
                    "owner_pid": os.getpid(),
                    "source": self.energy_source,
                    "gpus": gpus,
                }
            ),
            durable=False,
        )


def _clock_in_effect(state: _GpuState) -> int:
    """The clock work runs at before the power cap: the one in effect, or a thermal throttle's ceiling."""
    return min(state.sm_clock_mhz, state.throttle_sm_clock_mhz or state.sm_clock_mhz)
