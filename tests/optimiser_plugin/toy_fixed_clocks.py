"""A toy second optimiser, installed as a plugin: a fixed clock per phase kind.

Forward instructions run at the lowest profiled clock, backward instructions at the highest. It exists to
prove the optimiser seam: it plugs in through the ``megatron_energy.optimisers`` entry-point group, without
touching the session, and its plan runs end to end (``tests/test_optimiser_plugin.py``).
"""

from __future__ import annotations

from megatron_energy.optimisers.interface import PlanningJob, ProfileRequest
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Baseline, Plan, PlanPoint, RankPlan, clock_actions
from megatron_energy.sim.simulator import SimResult, Simulator


class FixedClockPerKind:
    """Forward at the lowest profiled clock, backward at the highest (see the module docstring)."""

    name = "toy"
    request = ProfileRequest(clock_grid=True)

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        """One point: the fixed clocks, predicted by the simulator with the job's switch latency."""
        dag = job.dag()
        simulator = Simulator(dag, profile, switch_latency_s=job.switch_latency_s)
        clocks = {node: self.clock_of(profile, node) for node in dag.compute_nodes()}
        stock = simulator.run(None, switch_latency_s=0.0)
        planned = simulator.run(clocks)
        point = PlanPoint(
            label=str(job.target),
            iteration_time_s=planned.iteration_time_s,
            deadline_s=planned.iteration_time_s,
            lower_bound_j=planned.total_energy_j,
            ranks=tuple(
                RankPlan(clock_actions(clocks, dag.stage_order(stage)), energy_j, busy_s)
                for stage, (energy_j, busy_s) in enumerate(stage_figures(planned))
            ),
        )
        return job.new_plan(
            profile,
            optimisers=(self.name,),
            baseline=Baseline(
                stock.iteration_time_s, stock.total_energy_j, tuple(e for e, _ in stage_figures(stock))
            ),
            points=(point,),
            measured_tail=None,
        )

    @staticmethod
    def clock_of(profile: Profile, node: Instruction) -> int:
        """The fixed clock of one instruction: lowest for a forward, highest for a backward."""
        clocks = [option.clock_mhz for option in profile.options(node.work)]
        return min(clocks) if node.kind == "forward" else max(clocks)


def stage_figures(result: SimResult) -> list[tuple[float, float]]:
    """(energy, busy time) of every stage of a simulated iteration, in stage order."""
    return [(stage.total_energy_j, stage.busy_s) for stage in sorted(result.stages, key=lambda s: s.stage)]
