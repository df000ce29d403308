"""The switch-latency rule: when a requested SM clock takes effect, and how the work it cuts through runs.

One rule for every model of a clock switch: the simulator's latency-aware pass (``sim.switching_pass``), the
phase optimiser's check of its switch times (``optimisers.kernel.switch_times``) and the simulated GPU
(``dvfs.simulated``), so what a plan predicts is what the simulated GPU runs.

* A clock requested at time ``t`` lands (takes effect) at ``t + L``, ``L`` the GPU spec's switch latency
  (:func:`lands_at_s`); the phase optimiser also checks landings anywhere in ``[t, t + L]``.
* Until it lands the clock in effect runs on; a switch due within :data:`DUE_TOLERANCE_S` of now is in
  effect (:func:`is_due`: rounding never leaves one pending).
* A newer request replaces a pending one, which then never lands (:class:`SwitchState`,
  :func:`landed_switches`). The frequency controller drops a request for the clock it asked for last, so
  the simulator never issues one (:meth:`SwitchState.requested_at`).
* Work that the landing cuts through runs pro rata: the fraction of it done before the landing (the time
  elapsed over the work's time at the old clock) at the old clock, the rest at the new one (:func:`straddle`);
  time and energy add up the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

DUE_TOLERANCE_S = 1e-12
"""A pending switch this close to now is due (guards against rounding)."""


def lands_at_s(request_s: float, latency_s: float, landing: float = 1.0) -> float:
    """When a clock requested at ``request_s`` takes effect.

    Args:
        request_s: When the clock was requested.
        latency_s: The switch latency ``L``.
        landing: Where in its window ``[request_s, request_s + L]`` it lands: 1 (the full latency) on the
            simulated GPU and in the simulator; the phase optimiser checks the whole window.
    """
    return request_s + landing * latency_s


def is_due(due_s: float, now_s: float) -> bool:
    """Whether a switch landing at ``due_s`` is in effect at ``now_s``."""
    return due_s <= now_s + DUE_TOLERANCE_S


class SwitchState(NamedTuple):
    """A GPU's SM clock under the rule: the clock in effect, the one last requested, and when it lands."""

    effective_mhz: int
    """The clock work runs at now."""
    requested_mhz: int
    """The clock most recently requested (the one in effect when nothing is pending)."""
    due_s: float
    """When ``requested_mhz`` lands (past once it has)."""

    def requested_at(self, clock_mhz: int, now_s: float, latency_s: float) -> SwitchState:
        """This state once ``clock_mhz`` is requested at ``now_s``.

        A pending switch that is due by then is in effect; a clock other than the one last requested replaces
        any pending request and lands ``latency_s`` later; the one last requested is not asked for again
        (the frequency controller drops repeats).
        """
        effective, requested, due_s = self
        if requested != effective and is_due(due_s, now_s):
            effective = requested
        if clock_mhz != requested:
            return SwitchState(effective, clock_mhz, lands_at_s(now_s, latency_s))
        return self if effective == self.effective_mhz else SwitchState(effective, requested, due_s)


def landed_switches(requests: Sequence[tuple[float, int, float]]) -> list[tuple[float, int]]:
    """The switches that take effect, of requests in the order they were issued.

    Args:
        requests: ``(request_s, clock_mhz, lands_s)`` per request, in issue order.

    Returns:
        ``(lands_s, clock_mhz)`` of every request that lands before the next one is issued; one overtaken by
        a newer request never lands.
    """
    issued_next = [request_s for request_s, _, _ in requests[1:]] + [math.inf]
    return [
        (lands_s, clock_mhz)
        for (_, clock_mhz, lands_s), next_s in zip(requests, issued_next[: len(requests)], strict=True)
        if is_due(lands_s, next_s)
    ]


class Straddle(NamedTuple):
    """A piece of work the landing of a switch cut through (:func:`straddle`)."""

    time_s: float
    """Its whole time."""
    energy_j: float
    """Its whole energy."""
    stale_s: float
    """The time it ran at the old clock (all of it when the switch landed after it)."""
    stale_energy_j: float
    """The energy of that part."""


def straddle(
    elapsed_s: float, old_time_s: float, old_energy_j: float, new_time_s: float, new_energy_j: float
) -> Straddle:
    """Work started at an old clock whose switch to a new one lands ``elapsed_s`` after it started.

    Args:
        elapsed_s: From the work's start to the landing.
        old_time_s: The work's time at the old clock.
        old_energy_j: Its energy at the old clock.
        new_time_s: Its time at the new clock.
        new_energy_j: Its energy at the new clock.
    """
    if elapsed_s >= old_time_s:
        return Straddle(old_time_s, old_energy_j, old_time_s, old_energy_j)
    done = elapsed_s / old_time_s
    return Straddle(
        elapsed_s + (1.0 - done) * new_time_s,
        done * old_energy_j + (1.0 - done) * new_energy_j,
        elapsed_s,
        done * old_energy_j,
    )
