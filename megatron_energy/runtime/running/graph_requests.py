"""The clocks of a step replayed from a CUDA graph, as offsets from the replay's start.

With ``--cuda-graph-impl full_iteration`` no hook runs inside the training step (``megatron.full_iteration``),
so no clock can be requested at an instruction's boundary as it is reached. Every clock the running plan
point asks for inside the step is requested by time instead, by the phase switcher
(``runtime.running.phase_switcher``) anchored on the replay's start event:

- an instruction's clock at the instruction's start offset;
- the clocks of phases inside it at that offset plus their own (``PlanRunner.inside_requests``);
- the clocks planned at the gradient sync's hook (captured in the graph too) at the last instruction's end.

The instruction offsets are *measured*: the previous replay's captured markers (``runtime.cuda_timer``), taken
under the same plan point, so they follow the clocks the plan sets; the offsets inside an instruction stay the
plan's (modelled or from a kernel timeline). The optimizer step and what follows it run outside the graph,
where their hooks still request their clocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron_energy.runtime.running.plan_runner import InsideRequest, PlanRunner
from megatron_energy.runtime.timing import InstructionSample

GRAD_SYNC = "grad-sync"
"""The outside phase that runs inside the captured step (``events.OUTSIDE_PHASES``)."""


def graph_requests(
    runner: PlanRunner, offsets: Sequence[InstructionSample], *, inside: bool
) -> tuple[InsideRequest, ...]:
    """Every clock of the running plan point in one replayed step, in the order of their offsets.

    Args:
        runner: The running plan.
        offsets: The instructions of the previous replay, in execution order, with their measured start and
            end (seconds from the replay's start).
        inside: Also the clocks of phases inside instructions (``--energy-phase-switching`` on).

    Returns:
        The requests, sorted by offset (plan order among equal offsets).
    """
    requests: list[InsideRequest] = []
    for sample in offsets:
        clock = runner.clock_at(sample.instruction)
        if clock is not None:
            requests.append(InsideRequest(sample.start_s, clock))
        if inside:
            requests.extend(
                InsideRequest(sample.start_s + request.offset_s, request.clock_mhz)
                for request in runner.inside_requests(sample.instruction)
            )
    if offsets:
        last_end_s = max(sample.end_s for sample in offsets)
        requests.extend(InsideRequest(last_end_s, clock) for clock in runner.outside_clocks(GRAD_SYNC))
    return tuple(sorted(requests, key=lambda request: request.offset_s))
