"""When to request each phase's clock, and the latency-aware simulation that checks no deadline is missed.

A requested clock lands some time within ``L`` (the switch latency) after the request, and a newer request
replaces a pending one (the rule of :mod:`megatron_energy.dvfs.clock_switch`). When to request, the
instruction-level post-pass's idea carried to phases:

- a switch **up** (to a higher clock than the one in force) is requested ``L`` before the phase's planned
  start, so it has landed when the phase starts; landing early only speeds up the end of the phase before;
- a switch **down** is requested at the phase's planned start; until it lands the phase runs faster.

Requested on the planned (periodic) timeline, switches then never make work slower than planned: at any time
the work done is at least the plan's (when the plan is in phase ``p`` the clock in force is ``p``'s or a
higher one, since time falls as the clock rises). The requests must land in order, which holds when every
phase lasts at least ``2 L`` (:mod:`.merge`). :func:`simulate` runs a phase sequence with each switch landing
anywhere in its window and returns its time and energy: tests drive it with random and extreme landings; the
planner predicts energy with up-switches landing early and down-switches late (the costlier end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.dvfs.clock_switch import is_due, landed_switches, lands_at_s
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile


@dataclass(frozen=True)
class SwitchRequest:
    """A clock request for one phase, on the planned timeline."""

    phase: int
    """Index of the phase the clock is for."""
    clock_mhz: int
    """The clock."""
    request_s: float
    """When to request it, seconds from the sequence's planned start (negative: before it)."""
    planned_start_s: float
    """The phase's planned start."""
    hook: int | None = None
    """The phase at whose start the request goes out (:func:`snap_to_phase_starts`); ``None``: any time."""

    @property
    def lead_s(self) -> float:
        """How long before the phase's planned start the request goes out (0 or the latency)."""
        return self.planned_start_s - self.request_s


def planned_starts(model: GpuPowerModel, works: Sequence[WorkProfile], clocks: Sequence[int]) -> list[float]:
    """Each phase's planned start, and the sequence's planned end last."""
    starts = [0.0]
    for work, clock in zip(works, clocks, strict=True):
        starts.append(starts[-1] + model.time_s(work, clock))
    return starts


def switch_requests(
    model: GpuPowerModel,
    works: Sequence[WorkProfile],
    clocks: Sequence[int],
    incoming_mhz: int,
    latency_s: float,
) -> list[SwitchRequest]:
    """The requests for a phase sequence entered at ``incoming_mhz`` (one per clock change).

    Args:
        model: Time and power of the phases.
        works: The phases' work, in order.
        clocks: Their planned clocks.
        incoming_mhz: The clock in force when the sequence starts.
        latency_s: The switch latency ``L``.
    """
    starts = planned_starts(model, works, clocks)
    requests = []
    current = incoming_mhz
    for phase, clock in enumerate(clocks):
        if clock != current:
            lead = latency_s if clock > current else 0.0
            requests.append(SwitchRequest(phase, clock, starts[phase] - lead, starts[phase]))
            current = clock
    return requests


@dataclass(frozen=True)
class SimulatedRun:
    """A simulated phase sequence (modelled)."""

    time_s: float
    """When its last phase finished."""
    energy_j: float
    """Energy of its work (busy power while each phase runs, at the clock in force)."""


def simulate(
    model: GpuPowerModel,
    works: Sequence[WorkProfile],
    incoming_mhz: int,
    requests: Sequence[SwitchRequest],
    landings: Sequence[float],
    latency_s: float,
) -> SimulatedRun:
    """Run the phases with each request landing ``landings[i] * latency_s`` after it goes out.

    A request overtaken by the next before it lands never lands (``dvfs.clock_switch.landed_switches``).

    Args:
        model: Time and power of the phases.
        works: The phases' work, in order.
        incoming_mhz: The clock in force at the start (unless a request landed before it).
        requests: The requests (:func:`switch_requests`), in order.
        landings: For each request, where in its window it lands (0: at once, 1: after the full latency).
        latency_s: The switch latency.

    Raises:
        ValueError: If a landing is outside [0, 1] or the counts differ.
    """
    if len(landings) != len(requests) or any(not 0.0 <= u <= 1.0 for u in landings):
        raise ValueError("one landing in [0, 1] per request is needed")
    changes = landed_switches(
        [
            (r.request_s, r.clock_mhz, lands_at_s(r.request_s, latency_s, u))
            for r, u in zip(requests, landings, strict=True)
        ]
    )
    clock = incoming_mhz
    while changes and is_due(changes[0][0], 0.0):
        clock = changes.pop(0)[1]
    now_s = energy_j = 0.0
    for work in works:
        remaining = 1.0  # fraction of the phase's work left
        while remaining > 1e-12:
            duration = model.time_s(work, clock)
            power = model.energy_j(work, clock) / duration if duration > 0 else 0.0
            finish = now_s + remaining * duration
            if changes and changes[0][0] < finish:
                at, next_clock = changes.pop(0)
                done = (at - now_s) / duration if duration > 0 else remaining
                energy_j += power * (at - now_s)
                remaining -= done
                now_s, clock = at, next_clock
            else:
                energy_j += power * (finish - now_s)
                now_s, remaining = finish, 0.0
    return SimulatedRun(now_s, energy_j)


def costliest_landings(requests: Sequence[SwitchRequest], incoming_mhz: int) -> list[float]:
    """Landings for the energy prediction: switches up land at once, switches down after the full latency."""
    landings = []
    current = incoming_mhz
    for request in requests:
        landings.append(0.0 if request.clock_mhz > current else 1.0)
        current = request.clock_mhz
    return landings


def snap_to_phase_starts(requests: Sequence[SwitchRequest], starts_s: Sequence[float]) -> list[SwitchRequest]:
    """The requests moved to hook times, the only times a hook can issue them (see the module docstring).

    Args:
        requests: The requests (:func:`switch_requests`, a restoring request for phase ``len(starts_s) - 1``
            last), in order.
        starts_s: Each phase's planned start, and the sequence's end last.

    Returns:
        The requests with ``request_s`` at a hook and ``hook`` its index into ``starts_s``, in order; a
        request overtaken by a later one issued at the same or an earlier hook is dropped. A restoring request
        goes out at the end (``hook == len(starts_s) - 1``): no hook lies inside the last phase, so it comes
        after the sequence (late by up to the latency) rather than give up the last phase's clock.

    Raises:
        ValueError: If there are no phases.
    """
    phases = len(starts_s) - 1
    if phases < 1:
        raise ValueError("a sequence without phases has no hooks")
    snapped: list[SwitchRequest] = []
    for request in requests:
        if request.phase >= phases:
            hook = phases
        elif request.lead_s > 0:  # a switch up: the latest start at or before it (early), else the first
            hook = max((i for i in range(phases) if starts_s[i] <= request.request_s + 1e-12), default=0)
        else:  # a switch down: the earliest start at or after it (late), else the last
            hook = min(
                (i for i in range(phases) if starts_s[i] >= request.request_s - 1e-12), default=phases - 1
            )
        while snapped and (snapped[-1].hook or 0) >= hook:  # overtaken: the later request holds from there
            snapped.pop()
        snapped.append(
            SwitchRequest(request.phase, request.clock_mhz, starts_s[hook], request.planned_start_s, hook)
        )
    return snapped
