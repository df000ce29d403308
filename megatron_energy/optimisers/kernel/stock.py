"""The base plan of ``--energy-mode kernel`` alone: every instruction at its fastest profiled clock."""

from __future__ import annotations

from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.pipeline.profile import Profile
from megatron_energy.pipeline.stock_clocks import all_max_clocks
from megatron_energy.plan import Baseline, Plan, PlanPoint, RankPlan, clock_actions
from megatron_energy.sim.simulator import Simulator


def stock_plan(profile: Profile, job: PlanningJob) -> Plan:
    """One point (``iso-time``): the all-maximum-clocks iteration, simulated under the switch latency.

    Its baseline is the same iteration; the phase optimiser then refines the point.
    """
    dag = job.dag()
    clocks = all_max_clocks(dag, profile)
    result = Simulator(dag, profile, switch_latency_s=job.switch_latency_s).run(clocks)
    point = PlanPoint(
        label=str(job.target),
        iteration_time_s=result.iteration_time_s,
        deadline_s=result.iteration_time_s,
        lower_bound_j=result.total_energy_j,
        ranks=tuple(
            RankPlan(
                clock_actions(clocks, dag.stage_order(stage)),
                stage_result.total_energy_j,
                stage_result.busy_s,
            )
            for stage, stage_result in enumerate(result.stages)
        ),
    )
    return job.new_plan(
        profile,
        optimisers=(),
        baseline=Baseline(
            result.iteration_time_s,
            result.total_energy_j,
            tuple(stage.total_energy_j for stage in result.stages),
        ),
        points=(point,),
        measured_tail=job.measured_tail,
    )
