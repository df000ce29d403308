"""What makes simulated GPUs read like a real training job's GPUs: counter noise, hidden energies, a tail.

By default (``Emulation()``) simulated GPUs are exact, which keeps the demo's figures deterministic: the
instruction timer knows every instruction's and every step's modelled energy, the energy counter has no
noise, and nothing runs between two schedules. An :class:`Emulation` adds, one knob each, what the energy
session meets on real GPUs, so the statistics and the anchored predictions can be tested on CPU:

* counter noise: every update of the energy counter (every ``energy_counter_period_s``, as NVML's ~100 ms
  counter) adds its increment times ``1 + counter_noise · N(0, 1)`` (seeded), on top of the quantisation the
  counter period already gives;
* hidden energies (``exact_energy=False``): only the counter knows energy, as on real GPUs; the session then
  reads each step's energy from the meter and splits it over the instructions itself;
* the work between two schedules: a gradient sync and an optimizer step run at the clock in effect, and
  host time the GPU idles (data loading, logging). The timer runs the gradient sync when the ``grad-sync``
  hook ends (after the pipeline span) and the optimizer step when the ``optimizer`` hook ends, or, in a job
  whose optimizer step fires no hook, before the next schedule.

Every figure stays *modelled*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_energy.dvfs.model import WorkProfile


@dataclass(frozen=True)
class Emulation:
    """How simulated GPUs depart from exact (see the module docstring)."""

    counter_noise: float = 0.0
    """Relative standard deviation of each counter update's increment (0: a noiseless counter)."""

    seed: int = 0
    """Seed of the counter noise (each GPU draws from its own stream of it)."""

    exact_energy: bool = True
    """Whether the timer reports exact modelled energies; False: only the energy counter does."""

    between_steps: WorkProfile | None = None
    """Work each GPU runs between two schedules (an optimizer step), at the clock in effect."""

    grad_sync: WorkProfile | None = None
    """Work each GPU runs for the data-parallel gradient sync (``grad-sync`` hook), at the clock in effect."""

    idle_between_steps_s: float = 0.0
    """Time each GPU idles between two schedules (the host loading data, logging)."""

    def __post_init__(self) -> None:
        for name in ("counter_noise", "idle_between_steps_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"Emulation.{name} must be finite and non-negative, got {value!r}")
