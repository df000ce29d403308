"""``megatron-energy plan``: per-instruction clocks for a pipeline job from a profile CSV.

The profile (Perseus/lowtime CSV: ``stage,instruction,frequency,time,energy`` in seconds and joules, optional
``chunk`` column) gives every instruction's time and energy per clock; megatron-core's own schedule gives each
rank's instruction order. The time–energy frontier is computed over the pipeline DAG and the point for
``--target`` is written as a plan JSON. The per-instruction figures are *measured* when the CSV came from a
profiling run (``--profile-source measured``, the default) or *modelled*; every iteration figure printed is
*modelled*: the pipeline is simulated with those per-instruction figures.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from rich.console import Console
from rich.table import Table

from megatron_energy.commands.arguments import (
    fail,
    non_negative_float,
    non_negative_int,
    output_file,
    readable_file,
)
from megatron_energy.config import EnergyTarget, known_gpu_spec, parse_target, positive_int
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.megatron.schedule import pipeline_orders
from megatron_energy.perseus.frontier import FrontierPoint
from megatron_energy.perseus.planner import Planner
from megatron_energy.pipeline.dag import CommSpec, PipelineDag
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan, fingerprint
from megatron_energy.report.frontier_plot import plot_frontier


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plan`` subcommand.

    Args:
        subparsers: The ``megatron-energy`` subcommand registry.
    """
    parser = subparsers.add_parser(
        "plan",
        help="compute the time–energy frontier and a clock plan from a profile CSV",
        description=__doc__,
    )
    parser.add_argument(
        "--profile", required=True, type=readable_file, help="profile CSV (Perseus/lowtime columns)"
    )
    parser.add_argument("--stages", required=True, type=positive_int, help="pipeline-parallel size")
    parser.add_argument("--microbatches", required=True, type=positive_int, help="microbatches per iteration")
    parser.add_argument(
        "--vpp", type=positive_int, default=1, help="virtual pipeline size (model chunks per stage)"
    )
    parser.add_argument(
        "--target",
        type=parse_target,
        default=EnergyTarget("iso-time"),
        help="iso-time (default: no slower than all-maximum clocks), min-energy, or slowdown:X with 0<X<1",
    )
    parser.add_argument(
        "--gpu-spec",
        type=known_gpu_spec,
        metavar="NAME",
        help="GPU spec (configs/gpus/NAME.yaml): blocked/idle power, P2P link",
    )
    parser.add_argument(
        "--blocked-power-w", type=non_negative_float, help="power while blocked on P2P (default: the spec's)"
    )
    parser.add_argument("--idle-power-w", type=non_negative_float, help="idle power (default: the spec's)")
    parser.add_argument(
        "--profile-source",
        choices=("measured", "modelled"),
        default="measured",
        help="where the CSV's figures come from (default measured)",
    )
    parser.add_argument(
        "--activation-bytes",
        type=non_negative_int,
        default=0,
        help="bytes of one pipeline transfer, timed over the spec's P2P link (default 0: transfers are free)",
    )
    parser.add_argument(
        "--points", type=positive_int, default=100, help="deadlines in the frontier sweep (default 100)"
    )
    parser.add_argument(
        "--switch-latency-ms",
        type=non_negative_float,
        help="SM-clock switch latency the plan must tolerate (default: the spec's, 0 without --gpu-spec)",
    )
    parser.add_argument("--out", required=True, type=output_file, help="where to write the plan JSON")
    parser.add_argument("--frontier", type=output_file, help="also write the frontier as CSV")
    parser.add_argument("--plot", type=output_file, help="also plot the frontier (PNG)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Plan and print the summary.

    Args:
        args: Parsed ``plan`` arguments.

    Returns:
        0 on success, 2 on invalid input.
    """
    console = Console()
    try:
        planner = _planner(args)
        point = planner.point(args.target)
        plan = planner.to_plan(point, str(args.target))
    except (ValueError, OSError) as error:
        return fail("plan", error)
    plan.save(args.out)
    frontier = planner.frontier
    console.print(_summary(plan, point))
    profile = planner.profile
    console.print(
        f"modelled: the pipeline simulated from a {profile.source} profile ({args.profile}, GPU "
        f"{profile.gpu_name}, blocked {profile.blocked_power_w:g} W, idle {profile.idle_power_w:g} W); the "
        "lower bound is the convex relaxation's optimum, which no plan can beat"
    )
    console.print(f"plan written to {args.out}")
    if args.frontier:
        frontier.to_csv(args.frontier)
        console.print(f"frontier ({len(frontier.points)} points, modelled) written to {args.frontier}")
    if args.plot:
        plot_frontier(frontier, point, planner.profile, args.plot)
        console.print(f"frontier plot written to {args.plot}")
    return 0


def _planner(args: argparse.Namespace) -> Planner:
    """Read the profile, build the DAG from Megatron's schedule and set up the planner."""
    spec = load_gpu_spec(args.gpu_spec) if args.gpu_spec else None
    blocked_w = (
        args.blocked_power_w if args.blocked_power_w is not None else getattr(spec, "blocked_power_w", None)
    )
    idle_w = args.idle_power_w if args.idle_power_w is not None else getattr(spec, "idle_power_w", None)
    if blocked_w is None or idle_w is None:
        raise ValueError(
            "give --gpu-spec NAME (for blocked and idle power) or both --blocked-power-w and --idle-power-w"
        )
    if args.activation_bytes and spec is None:
        raise ValueError("--activation-bytes needs --gpu-spec NAME for the P2P link's latency and bandwidth")
    gpu_name = spec.name if spec is not None else "unspecified"
    profile = Profile.from_csv(
        args.profile,
        gpu_name=gpu_name,
        source=args.profile_source,
        blocked_power_w=blocked_w,
        idle_power_w=idle_w,
    )
    if (profile.num_stages, profile.num_chunks) != (args.stages, args.vpp):
        raise ValueError(
            f"{args.profile} covers {profile.num_stages} stages x {profile.num_chunks} chunks, but --stages "
            f"{args.stages} --vpp {args.vpp} was given; profile the job with this parallelism"
        )
    comm = None
    if args.activation_bytes:
        comm = CommSpec(spec.p2p_latency_s, spec.p2p_bandwidth_gbps, args.activation_bytes)  # type: ignore[union-attr]
    dag = PipelineDag.build(pipeline_orders(args.stages, args.microbatches, args.vpp), args.vpp, comm=comm)
    job = fingerprint(
        profile_sha256=hashlib.sha256(Path(args.profile).read_bytes()).hexdigest(),
        parallelism={"pipeline": args.stages, "virtual": args.vpp},
        batch={"microbatches": args.microbatches, "activation_bytes": args.activation_bytes},
        gpu=gpu_name,
        powers_w=[blocked_w, idle_w],
    )
    latency_ms = args.switch_latency_ms
    if latency_ms is None:
        latency_ms = 1e3 * spec.switch_latency_s if spec is not None else 0.0
    return Planner(dag, profile, fingerprint=job, num_points=args.points, switch_latency_s=latency_ms / 1e3)


def _summary(plan: Plan, point: FrontierPoint) -> Table:
    """All-maximum-clocks vs. planned figures, each labelled with where it comes from."""
    prediction = plan.prediction
    table = Table(title=f"plan for target {plan.target}: {plan.num_stages} pipeline stages")
    for header in ("figure", "all-maximum clocks", "plan", "change", "source"):
        table.add_column(header, justify="left" if header in ("figure", "source") else "right")
    time_change = prediction.iteration_time_s / prediction.baseline_time_s - 1
    energy_change = prediction.energy_j / prediction.baseline_energy_j - 1
    table.add_row(
        "iteration time (s)",
        f"{prediction.baseline_time_s:.4f}",
        f"{prediction.iteration_time_s:.4f}",
        f"{100 * time_change:+.2f} %",
        "modelled",
    )
    table.add_row(
        "energy per iteration (J)",
        f"{prediction.baseline_energy_j:,.1f}",
        f"{prediction.energy_j:,.1f}",
        f"{100 * energy_change:+.2f} %",
        "modelled",
    )
    for stage, energy_j in enumerate(prediction.stage_energy_j):
        table.add_row(f"  stage {stage} energy (J)", "", f"{energy_j:,.1f}", "", "modelled")
    table.add_row(
        f"lower bound at {prediction.deadline_s:.4f} s (J)",
        "",
        f"{prediction.lower_bound_j:,.1f}",
        f"plan +{100 * point.gap:.3f} %",
        "modelled",
    )
    return table
