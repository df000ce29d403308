"""Clock options of the combined 1F1B schedule's fused steps, where a profile has none measured.

A fused step (``FusedInstruction``) runs a forward and another microbatch's backward as one
``combined_forward_backward_step``; the session times it as a whole, so a *measured* profile of a combined
job carries its own options under ``Work(stage, forward chunk, fused_kind(backward chunk))``. A *modelled* or
*simulated* profile (the time/power model knows single passes) gets them here: at every clock both passes'
modelled time and energy added, i.e. the two passes one after the other on the SMs. What fusing gains (the
expert all-to-all of one pass hidden behind the other's compute) is not in that model; only a measured
profile shows it.
"""

from __future__ import annotations

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.instruction import FusedInstruction
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import ClockOption, Profile, Work


def fused_works(orders: PipelineOrders) -> dict[Work, FusedInstruction]:
    """The work of every fused step of ``orders``, with one step that does it."""
    return {step.work: step for step in orders.all_steps() if isinstance(step, FusedInstruction)}


def with_fused_steps(profile: Profile, orders: PipelineOrders) -> Profile:
    """``profile`` with options for every fused step of ``orders`` it lacks (modelled; see the module).

    Args:
        profile: The profile of the job's single passes (and, measured, of its fused steps).
        orders: The job's orders; nothing is added unless they are combined 1F1B ones.

    Returns:
        ``profile`` itself when nothing is missing, else a new profile of the same source.

    Raises:
        EnergyValueError: A measured profile lacks fused steps (modelled figures would pass for measured
            ones), or a fused step's two passes share no profiled clock.
    """
    missing = {work: step for work, step in fused_works(orders).items() if work not in set(profile)}
    if not missing:
        return profile
    if profile.source == "measured":
        raise EnergyValueError(
            f"the measured profile has no timing of the combined 1F1B steps {sorted(missing)[:3]}; profile "
            "the job with --overlap-moe-expert-parallel-comm on, as it will run"
        )
    options = {work: profile.options(work) for work in profile}
    for work, step in missing.items():
        forward = {option.clock_mhz: option for option in profile.options(step.forward.work)}
        backward = {option.clock_mhz: option for option in profile.options(step.backward.work)}
        clocks = sorted(forward.keys() & backward.keys())
        if not clocks:
            raise EnergyValueError(f"{step.forward.work} and {step.backward.work} share no profiled clock")
        options[work] = [
            ClockOption(
                clock,
                forward[clock].time_s + backward[clock].time_s,
                forward[clock].energy_j + backward[clock].energy_j,
            )
            for clock in clocks
        ]
    return Profile(options, profile.gpu_name, profile.source, profile.blocked_power_w, profile.idle_power_w)
