"""Make a per-instruction clock plan executable when a clock switch takes time (switch latency L).

The frontier solver picks a clock per pipeline instruction as if switches were instant. On a GPU a locked
clock takes effect L after the request (10 ms on H100/H200, 20 ms on A100), and a newer request replaces a
pending one, so a plan whose instructions last a few ms mostly runs at stale clocks: too slow where it
switches up (the iteration gets longer) and too fast where it switches down (the saving is lost).
:func:`make_switch_aware` turns such a plan into one that meets the deadline in the latency-aware simulation
(:class:`~megatron_energy.sim.simulator.Simulator` with ``switch_latency_s``) while keeping as much of the
saving as it can:

1. **Quantise.** Per stage, consecutive instructions with equal clocks form segments. A segment whose span
   (its first instruction's start to the next segment's, waits included) is shorter than L is merged into a
   neighbour, the merged run taking the faster (higher) clock of the two, so no instruction runs slower than
   planned; of the two neighbours, the one whose merge adds less busy energy. Merging repeats on the
   re-simulated timeline until every span is at least L, so every remaining request takes effect.
2. **Repair.** While the latency-aware iteration is over the deadline, each instruction on its critical path
   that took longer than planned (its up-switch came late) is fixed, by whichever adds less energy: ask for
   its clock one instruction earlier (the nearest earlier instruction of its stage with a slower clock gets
   it), or ask for a higher clock that makes up for the stale part. Clocks only rise, so this ends. If it
   does not meet the deadline, the stage with the most lateness runs at its fastest clock throughout (zero
   switches), then the next, and so on.
3. **Improve.** A first-improvement local search on the segments, each move judged by the latency-aware
   simulation: move a segment's clock down or up by 16, 4, then 1 grid steps, merge a segment into a
   neighbour, or shift a boundary between segments by one instruction. A move is kept when the iteration
   stays within the deadline and the energy drops.

The result is compared with every stage at its fastest clock (zero switches) and the better one returned, so
it never uses more energy than the all-fastest plan. With L = 0 the input clocks are returned unchanged. All
times and energies are *modelled*. Profiles are assumed to get no slower as the clock rises (as modelled ones
do, and measured ones up to noise), so a higher clock is a faster one. The steps are
:mod:`~megatron_energy.optimisers.perseus.switch_quantise`,
:mod:`~megatron_energy.optimisers.perseus.switch_repair` and
:mod:`~megatron_energy.optimisers.perseus.switch_improve`, on the shared
:class:`~megatron_energy.optimisers.perseus.switch_search.SwitchSearch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from megatron_energy.optimisers.interface import SWITCH_EVALUATIONS
from megatron_energy.optimisers.perseus.switch_improve import improve
from megatron_energy.optimisers.perseus.switch_quantise import quantise
from megatron_energy.optimisers.perseus.switch_repair import repair
from megatron_energy.optimisers.perseus.switch_search import REL_TOL, SwitchSearch
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Step
from megatron_energy.sim.simulator import (
    ProfileLike,
    SimResult,
    Simulator,
    StagePowers,
)


@dataclass(frozen=True)
class SwitchAwarePlan:
    """A clock plan that is executable with switch latency (all figures modelled).

    Attributes:
        clocks: SM clock every compute node asks for when it starts.
        result: Latency-aware simulation of ``clocks``.
        unadjusted: Latency-aware simulation of the input clocks, for comparison.
        deadline_s: Iteration-time budget.
        switch_latency_s: The switch latency planned for.
        switches_per_iteration: Clock requests per iteration, all stages (a stage asks when an instruction's
            clock differs from its predecessor's, its first instruction following the previous iteration's
            last).
        evaluations: Latency-aware simulations the post-pass ran.
    """

    clocks: dict[Step, int]
    result: SimResult
    unadjusted: SimResult
    deadline_s: float
    switch_latency_s: float
    switches_per_iteration: int
    evaluations: int

    @property
    def meets_deadline(self) -> bool:
        """Whether the latency-aware iteration time is within the deadline (up to rounding)."""
        return self.result.iteration_time_s <= self.deadline_s * (1.0 + REL_TOL)


def count_switches(dag: PipelineDag, clocks: Mapping[Step, int]) -> int:
    """Clock requests per iteration in the steady state.

    Per stage, the instructions whose clock differs from the previous instruction's (the first one compared
    with the last one, of the previous iteration).

    Args:
        dag: The iteration DAG.
        clocks: Clock of every compute node.
    """
    switches = 0
    for stage in range(dag.num_stages):
        order = [clocks[node] for node in dag.stage_steps(stage)]
        switches += sum(1 for i, clock in enumerate(order) if clock != order[i - 1])
    return switches


def make_switch_aware(
    dag: PipelineDag,
    profile: ProfileLike,
    clocks: Mapping[Step, int],
    switch_latency_s: float,
    deadline_s: float,
    powers: StagePowers | None = None,
    max_evaluations: int = SWITCH_EVALUATIONS,
) -> SwitchAwarePlan:
    """Turn an instant-switch clock plan into one that meets ``deadline_s`` with switch latency.

    Args:
        dag: The iteration DAG.
        profile: Time and energy per clock of every instruction.
        clocks: SM clock per compute node, planned for instant switches; a missing node runs its fastest
            option.
        switch_latency_s: Switch latency L (``GpuSpec.switch_latency_s``).
        deadline_s: The iteration time the plan was solved for (the all-maximum-clocks time for iso-time).
        powers: Blocked and idle power; the profile's when ``None``.
        max_evaluations: Budget of latency-aware simulations for the improvement search; quantise and repair
            always run to the end. The search usually converges well within it on small pipelines (hundreds
            of evaluations at PP=4, M=8); one evaluation costs about 40 ms at PP=16, M=256, VPP=2.

    Returns:
        The adjusted clocks and their latency-aware simulation. With L = 0 the input clocks, unchanged. If
        even the all-fastest plan misses the deadline (a deadline below the fastest iteration time), the
        all-fastest plan, with ``meets_deadline`` False.

    Raises:
        ValueError: If a clock is not among its instruction's profiled options, or L is negative.
    """
    simulator = Simulator(dag, profile, powers, switch_latency_s)
    unadjusted = simulator.run(clocks)
    if simulator.switch_latency_s == 0.0:
        switches = count_switches(dag, _filled(dag, profile, clocks))
        return SwitchAwarePlan(dict(clocks), unadjusted, unadjusted, deadline_s, 0.0, switches, 1)
    instant = simulator.run(clocks, switch_latency_s=0.0)
    planned_s = {piece.node: piece.end_s - piece.start_s for piece in instant.timeline}
    search = SwitchSearch(dag, profile, simulator, deadline_s)
    state = [[clocks.get(node, search.fastest_clock(node)) for node in order] for order in search.orders]
    state = repair(search, quantise(search, state), planned_s)
    state = improve(search, state, max_evaluations)
    fastest = search.all_fastest()
    if search.cost(fastest) <= search.cost(state):
        state = fastest
    adjusted = search.to_clocks(state)
    return SwitchAwarePlan(
        clocks=adjusted,
        result=simulator.run(adjusted),
        unadjusted=unadjusted,
        deadline_s=deadline_s,
        switch_latency_s=simulator.switch_latency_s,
        switches_per_iteration=count_switches(dag, adjusted),
        evaluations=search.evaluations + 2,
    )


def _filled(dag: PipelineDag, profile: ProfileLike, clocks: Mapping[Step, int]) -> dict[Step, int]:
    """``clocks`` with the fastest option's clock for every compute node it lacks."""
    filled = {}
    for node in dag.compute_steps():
        clock = clocks.get(node)
        filled[node] = clock if clock is not None else profile.fastest(node.work).clock_mhz
    return filled
