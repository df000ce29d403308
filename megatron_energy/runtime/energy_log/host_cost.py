"""The plugin's own cost per step: host seconds in its hooks on the training thread, CPU on its other threads.

*Measured* with ``time.perf_counter`` around every hook the session handles (:func:`host_timed`), summed
per step. In the run phase nothing the session does waits for the GPU (``runtime.cuda_timer``), so this host
time lengthens an iteration only when the host, not the GPU, is the bottleneck: with the host ahead of the
GPU (the usual case for a GPU-bound Megatron job) it is hidden, and ``host time / iteration time`` is an
upper bound on the slowdown the plugin causes on the training thread. It also counts time a hook spends
blocked behind a full CUDA launch queue (recording an event then waits for the GPU: ~820 µs per event
against ~2 µs on an idle queue, measured on an H200): such a wait means the host is ahead of the GPU and
costs the GPU nothing, so the figure is a loose bound.

The plugin's background threads (energy meter, frequency controller, phase switcher) are counted apart, as
the CPU time each used per run-phase step (``megatron_energy.plugin_threads``: the kernel's per-thread CPU
clock, *measured*). Their cost to the training thread is not their CPU time itself: every torch operation
the training thread launches releases the GIL and takes it back, so a plugin thread's Python work competes
with the launches, and CUDA calls from another thread can contend with them in the driver (on an H200, a
thread recording and querying an event every millisecond made a launch-bound loop's launches 14-21x
slower, measured). What neither figure sees is the device time of the CUDA events the timer
records (no kernels). Profiling steps are left out: they synchronise the device on purpose.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Concatenate, Protocol

from megatron_energy.plugin_threads import cpu_seconds
from megatron_energy.stats import MeanInterval, mean_interval


@dataclass
class HostCost:
    """Host seconds per step in the plugin's hooks (module docstring)."""

    step_s: float = 0.0
    """Seconds spent so far in the step running now."""
    run_steps_s: list[float] = field(default_factory=list)
    """Each finished run-phase step's host seconds."""
    step_by_hook_s: dict[str, float] = field(default_factory=dict)
    """Seconds per hook in the step running now."""
    run_by_hook_s: dict[str, float] = field(default_factory=dict)
    """Seconds per hook over the finished run-phase steps."""
    run_by_thread_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds of each background thread of the plugin over the finished run-phase steps."""
    _threads_at_s: dict[str, float] = field(default_factory=dict)
    """The background threads' CPU seconds at the previous step's end."""

    def add(self, seconds: float, hook: str = "") -> None:
        """Count ``seconds`` of hook time (spent in ``hook``) to the step running now."""
        self.step_s += seconds
        self.step_by_hook_s[hook] = self.step_by_hook_s.get(hook, 0.0) + seconds

    def end_step(self, run_phase: bool) -> None:
        """Close the step: keep its host time, and its background threads' CPU time, in the run phase."""
        threads_s = cpu_seconds()
        if run_phase:
            self.run_steps_s.append(self.step_s)
            for hook, seconds in self.step_by_hook_s.items():
                self.run_by_hook_s[hook] = self.run_by_hook_s.get(hook, 0.0) + seconds
            for name, seconds in threads_s.items():
                used_s = seconds - self._threads_at_s.get(name, 0.0)
                self.run_by_thread_s[name] = self.run_by_thread_s.get(name, 0.0) + used_s
        self._threads_at_s = threads_s
        self.step_s = 0.0
        self.step_by_hook_s.clear()

    def interval(self) -> MeanInterval | None:
        """Mean host seconds per run-phase step with its 95 % interval (None before two steps)."""
        return mean_interval(self.run_steps_s) if len(self.run_steps_s) >= 2 else None

    def summary(self, rank: int, iteration_s: float | None) -> str | None:
        """Rank ``rank``'s closing line: host ms per step, its share of ``iteration_s`` (None: < 2 steps).

        Args:
            rank: The global rank.
            iteration_s: The measured stock iteration time; ``None`` leaves the share out (on simulated GPUs
                the iteration time is modelled, and host time over a modelled time is no figure).
        """
        interval = self.interval()
        if interval is None:
            return None
        share = "" if not iteration_s else f", {100 * interval.mean / iteration_s:.3f} % of the iteration"
        return (
            f"[energy] rank {rank}: plugin host time on the training thread "
            f"{1e3 * interval.mean:.3f} ms per step "
            f"(95 % CI {1e3 * interval.low:.3f} to {1e3 * interval.high:.3f} ms, {len(self.run_steps_s)} "
            f"run-phase steps{share}; measured, perf_counter; the run phase never waits for the GPU, so this "
            f"bounds the slowdown only when the host, not the GPU, limits the step; by hook: "
            f"{self._per_step(self.run_by_hook_s)}); its background threads' CPU time "
            f"{1e3 * self.background_s_per_step():.3f} ms per step ({self._per_step(self.run_by_thread_s)}; "
            "measured, per-thread CPU clocks)"
        )

    def background_s_per_step(self) -> float:
        """Mean CPU seconds per run-phase step over all the plugin's background threads (0 before a step)."""
        steps = len(self.run_steps_s)
        return sum(self.run_by_thread_s.values()) / steps if steps else 0.0

    def _per_step(self, seconds_by_name: dict[str, float]) -> str:
        """Mean ms per run-phase step of each named cost, costliest first ("none" when there is none)."""
        steps = len(self.run_steps_s)
        ranked = sorted(seconds_by_name.items(), key=lambda item: -item[1])
        return ", ".join(f"{name} {1e3 * seconds / steps:.3f} ms" for name, seconds in ranked) or "none"


class HasHostCost(Protocol):
    """An object whose hooks are timed: it holds a :class:`HostCost`."""

    host_cost: HostCost


def host_timed[S: HasHostCost, **P, R](
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], R]:
    """Count the wrapped hook's wall time on the calling thread to ``self.host_cost``."""

    @functools.wraps(method)
    def timed(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        began = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.host_cost.add(time.perf_counter() - began, method.__name__)

    return timed
