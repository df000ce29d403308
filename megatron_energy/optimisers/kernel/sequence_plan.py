"""One phase sequence's plan: merge under the latency, allocate the budget, schedule the switches.

A sequence is an instruction's phases or the iteration tail's. The plan keeps the sequence within its time
budget (the instruction's time at its clock in the base plan: a Perseus frontier point or stock clocks), so
the iteration is never slower than the base plan. Two constraints keep the base plan's instruction-level
switching intact (its latency-aware post-pass already made the instruction boundaries executable):

- an instruction's first phase keeps the base clock (the base plan's boundary action is unchanged);
- its last phase runs at most at the base clock, so the base plan's request for the next instruction (an
  early one when it switches up) can only speed that phase up.

The tail (gradient sync, optimizer step) has no base action of its own: its phases are free, and when its
last phase runs below the next iteration's first clock a restoring request goes out ``L`` before its end.
Its requests can only go out where the runtime has a hook, at the start of a tail phase or its end
(``hooked``): :func:`~megatron_energy.optimisers.kernel.switch_times.snap_to_phase_starts` moves them there
(a switch up early, a restore to the end), and the latency-aware energy is that of the moved requests. A
restore at the end lands up to ``L`` later, in the idle gap after the tail if there is one and else in the
next iteration's first instruction: when that delay does not fit in the tail's slack, the last phase runs at
the next iteration's clock instead (no restore, no late switch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.optimisers.kernel.allocate import PhaseOption, allocate, phase_options
from megatron_energy.optimisers.kernel.merge import merge_short_phases, min_phase_s
from megatron_energy.optimisers.kernel.switch_times import (
    SwitchRequest,
    costliest_landings,
    planned_starts,
    simulate,
    snap_to_phase_starts,
    switch_requests,
)
from megatron_energy.pipeline.phase_timeline import Phase


@dataclass(frozen=True)
class SequencePlan:
    """The clocks of one phase sequence and what they are predicted to cost (modelled)."""

    phases: tuple[Phase, ...]
    """The phases after merging, in order."""
    clocks_mhz: tuple[int, ...]
    """One clock per phase."""
    requests: tuple[SwitchRequest, ...]
    """When each clock change is requested (a restoring request last, for the tail)."""
    planned_s: float
    """Planned time of the sequence (never above its budget unless even the fastest clocks exceed it)."""
    energy_j: float
    """Latency-aware energy of its work (switches landing at the costlier end of their windows)."""


def plan_sequence(
    model: GpuPowerModel,
    phases: Sequence[Phase],
    budget_s: float,
    clocks_mhz: Sequence[int],
    incoming_mhz: int,
    latency_s: float,
    base_mhz: int | None = None,
    outgoing_mhz: int | None = None,
    hooked: bool = False,
    gap_after_s: float = 0.0,
) -> SequencePlan:
    """Plan one sequence (see the module docstring).

    Args:
        model: Time and power per class (the GPU spec's model).
        phases: The sequence's phases at the maximum clock, in order.
        budget_s: The time the sequence may take.
        clocks_mhz: The clocks phases may use.
        incoming_mhz: The clock in force when the sequence starts.
        latency_s: The switch latency.
        base_mhz: The instruction's base-plan clock (first phase keeps it, last runs at most at it); ``None``
            for the tail (free phases).
        outgoing_mhz: For the tail: the clock the next iteration starts at (restored before its end).
        hooked: Requests go out only at phase starts (the tail's runtime hooks); ``False``: at any time.
        gap_after_s: For a hooked tail: how long the GPU idles after it before the next iteration's work
            (measured host time: data loading, logging), during which a restore requested at its end lands.
    """
    merged = merge_short_phases(phases, min_phase_s(latency_s))
    works = [phase.work for phase in merged]
    option_sets = [
        _allowed(phase_options(model, work, clocks_mhz), i, len(works), base_mhz)
        for i, work in enumerate(works)
    ]
    chosen = allocate(option_sets, budget_s)
    if (
        hooked
        and outgoing_mhz is not None
        and not _restore_affordable(model, works, chosen, budget_s, outgoing_mhz, latency_s, gap_after_s)
    ):
        option_sets[-1] = [o for o in option_sets[-1] if o.clock_mhz >= outgoing_mhz] or option_sets[-1]
        chosen = allocate(option_sets, budget_s)
    clocks = [option.clock_mhz for option in chosen]
    requests = switch_requests(model, works, clocks, incoming_mhz, latency_s)
    starts = planned_starts(model, works, clocks)
    end_s = starts[-1]
    if outgoing_mhz is not None and outgoing_mhz > clocks[-1]:
        requests.append(SwitchRequest(len(works), outgoing_mhz, end_s - latency_s, end_s))
    if hooked:
        requests = snap_to_phase_starts(requests, starts)
    run = simulate(
        model, works, incoming_mhz, requests, costliest_landings(requests, incoming_mhz), latency_s
    )
    return SequencePlan(tuple(merged), tuple(clocks), tuple(requests), end_s, run.energy_j)


def _restore_affordable(
    model: GpuPowerModel,
    works: Sequence[WorkProfile],
    chosen: Sequence[PhaseOption],
    budget_s: float,
    outgoing_mhz: int,
    latency_s: float,
    gap_after_s: float,
) -> bool:
    """Whether a restore requested at the tail's end keeps the next iteration on time.

    The restored clock lands up to ``L`` after the end; what of ``L`` the idle gap after the tail does not
    cover, the next iteration's first instruction runs at the tail's last clock, at worst compute-bound
    (time inversely proportional to the clock). That delay must fit in the tail's slack under its budget.
    """
    last_mhz = chosen[-1].clock_mhz
    if last_mhz >= outgoing_mhz:
        return True
    end_s = planned_starts(model, works, [option.clock_mhz for option in chosen])[-1]
    delay_s = max(0.0, latency_s - gap_after_s) * (outgoing_mhz / last_mhz - 1.0)
    return delay_s <= budget_s - end_s + 1e-12


def _allowed(options: list[PhaseOption], index: int, count: int, base_mhz: int | None) -> list[PhaseOption]:
    """The options phase ``index`` of ``count`` may use under the base clock's constraints."""
    if base_mhz is None:
        return options
    if index == 0 or count == 1:
        kept = [o for o in options if o.clock_mhz == base_mhz]
    elif index == count - 1:
        kept = [o for o in options if o.clock_mhz <= base_mhz]
    else:
        kept = options
    return kept or options
