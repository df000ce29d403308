"""``megatron-energy simulate``: modelled iteration time and per-stage energy of a job, optionally planned.

The job's instructions come from megatron-core's own schedule, their time and energy per clock from the time/
power model of the job's GPU spec (a synthetic profile), so every figure printed is *modelled*. Without
``--plan`` every instruction runs at its fastest clock; with ``--plan`` at the plan's clocks, compared with
that all-fastest baseline.
"""

import argparse

from rich.console import Console
from rich.table import Table

from megatron_energy.commands.arguments import fail, output_file, readable_file
from megatron_energy.job import JobConfig, JobConfigError
from megatron_energy.pipeline.dag import NodeId, RankOrder
from megatron_energy.plan import Plan, PlanError
from megatron_energy.sim.simulator import SimResult, Simulator
from megatron_energy.sim.trace import write_trace


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``simulate`` subcommand.

    Args:
        subparsers: The ``megatron-energy`` subcommand registry.
    """
    parser = subparsers.add_parser(
        "simulate",
        help="modelled iteration time and per-stage energy of a job (optionally under a plan)",
        description=__doc__,
    )
    parser.add_argument(
        "--config", required=True, type=readable_file, help="job YAML, e.g. configs/examples/*.yaml"
    )
    parser.add_argument(
        "--plan", type=readable_file, help="plan JSON to simulate (default: every clock at its fastest)"
    )
    parser.add_argument(
        "--trace", type=output_file, help="write a Chrome/Perfetto trace JSON of the iteration here"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Simulate the job and print the table.

    Args:
        args: Parsed ``simulate`` arguments.

    Returns:
        0 on success, 2 on an invalid config or plan.
    """
    console = Console()
    try:
        job = JobConfig.load(args.config)
        spec = job.spec()
        orders = job.orders()
        simulator = Simulator(job.build_dag(orders, spec), job.synthetic_profile(spec))
        baseline = simulator.run()
        plan = Plan.load(args.plan) if args.plan else None
        planned = simulator.run(_plan_clocks(plan, orders, spec.name)) if plan else None
    except (JobConfigError, PlanError, ValueError, OSError) as error:
        return fail("simulate", error)
    result = planned or baseline
    label = f"modelled, GPU spec {spec.name}: {spec.display_name}"
    scenario = "under the plan" if planned else "at the fastest clocks"
    console.print(_stage_table(result, f"{job.name}: one iteration {scenario} ({label})"))
    console.print(f"iteration time: {result.iteration_time_s:.4f} s ({label})")
    job_energy_kj = result.total_energy_j * job.tensor_parallel * job.data_parallel / 1e3
    console.print(
        f"energy per iteration: {result.total_energy_j:,.1f} J for one pipeline "
        f"({job.pipeline_stages} GPUs), {job_energy_kj:,.2f} kJ for the whole job ({job.num_gpus} GPUs) "
        f"({label})"
    )
    if plan is not None and planned is not None:
        console.print(
            f"plan {args.plan} (target {plan.target}) predicts {plan.prediction.iteration_time_s:.4f} s, "
            f"{plan.prediction.energy_j:,.1f} J (the plan's own prediction from a {plan.provenance} profile)"
        )
        time_change = planned.iteration_time_s / baseline.iteration_time_s - 1
        energy_change = planned.total_energy_j / baseline.total_energy_j - 1
        console.print(
            f"versus every instruction at its fastest clock ({baseline.iteration_time_s:.4f} s, "
            f"{baseline.total_energy_j:,.1f} J): time {time_change:+.2%}, energy {energy_change:+.2%} "
            f"({label})"
        )
    if args.trace:
        path = write_trace(result, simulator.powers, args.trace)
        console.print(f"trace written to {path} (open in https://ui.perfetto.dev; {label})")
    return 0


def _plan_clocks(plan: Plan, orders: list[RankOrder], gpu_name: str) -> dict[NodeId, int]:
    """The plan's clock per compute node, after checking it was made for this schedule and GPU."""
    if plan.gpu_name != gpu_name:
        raise PlanError(f"the plan was made for GPU {plan.gpu_name!r}, the job runs on {gpu_name!r}")
    if plan.num_stages != len(orders):
        raise PlanError(f"the plan covers {plan.num_stages} pipeline stages, the job has {len(orders)}")
    clocks: dict[NodeId, int] = {}
    for stage, order in enumerate(orders):
        planned = plan.rank_clocks(stage)
        if [(item.kind, item.microbatch, item.chunk) for item in planned] != list(order):
            raise PlanError(
                f"the plan's instruction order on stage {stage} differs from this job's schedule "
                "(microbatches or virtual stages changed); rerun planning"
            )
        for item in planned:
            clocks[(item.kind, stage, item.chunk, item.microbatch)] = item.clock_mhz
    return clocks


def _stage_table(result: SimResult, title: str) -> Table:
    """Per-stage busy / blocked / idle time and energy, with a total row."""
    table = Table(title=title)
    table.add_column("stage", justify="right")
    for header in ("busy s", "blocked s", "idle s", "busy J", "blocked J", "idle J", "total J"):
        table.add_column(header, justify="right")
    for stage in result.stages:
        table.add_row(
            str(stage.stage),
            f"{stage.busy_s:.4f}",
            f"{stage.blocked_s:.4f}",
            f"{stage.idle_s:.4f}",
            f"{stage.busy_energy_j:,.1f}",
            f"{stage.blocked_energy_j:,.1f}",
            f"{stage.idle_energy_j:,.1f}",
            f"{stage.total_energy_j:,.1f}",
        )
    table.add_section()
    table.add_row(
        "all",
        "",
        "",
        "",
        f"{sum(stage.busy_energy_j for stage in result.stages):,.1f}",
        f"{sum(stage.blocked_energy_j for stage in result.stages):,.1f}",
        f"{sum(stage.idle_energy_j for stage in result.stages):,.1f}",
        f"{result.total_energy_j:,.1f}",
    )
    return table
