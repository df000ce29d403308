"""``megatron-energy plan``: per-instruction clocks for a pipeline job, by the optimiser training uses.

The job comes from a job YAML (``--config``: orders, pipeline transfers, iteration tail, GPU) or from
``--stages/--microbatches/--vpp``; the profile from a Perseus/lowtime CSV (``stage,instruction,frequency,
time,energy`` in seconds and joules, optional ``chunk`` and ``source`` columns) or, with ``--config`` alone,
from the GPU's time/power model. megatron-core's own schedule gives each rank's instruction order. The Perseus
optimiser solves the time–energy frontier and writes the plan (schema v3) for ``--target``. The
per-instruction figures are *measured*, *modelled* or *simulated* as the CSV's ``source`` column says (the
profiles the session writes have one); ``--profile-source`` says it for a CSV without one and is refused
when it contradicts the file. Every iteration figure printed is *modelled*: the pipeline is simulated with
those per-instruction figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
from pathlib import Path

from rich.table import Table

from megatron_energy.commands.accounting import Accounting, format_gap, row_warning_lines
from megatron_energy.commands.arguments import (
    fail,
    non_negative_float,
    non_negative_int,
    output_file,
    plain_text,
    readable_file,
)
from megatron_energy.config import known_gpu_spec, positive_int
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.interface import PlanningJob, planning_job
from megatron_energy.optimisers.memory_clock import MemoryClockLever
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.optimisers.saving_band import with_saving_band
from megatron_energy.pipeline.dag_nodes import CommSpec
from megatron_energy.pipeline.profile import PROFILE_SOURCES, Profile
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import Plan, fingerprint
from megatron_energy.plan_file import save_plan
from megatron_energy.plan_outcome import saving_text
from megatron_energy.plan_smoothing import smoothing_cost_text
from megatron_energy.report.console import output_console
from megatron_energy.report.frontier_plot import plot_frontier
from megatron_energy.target import EnergyTarget, parse_target


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plan`` subcommand.

    Args:
        subparsers: The ``megatron-energy`` subcommand registry.
    """
    parser = subparsers.add_parser(
        "plan",
        help="compute the time–energy frontier and a clock plan from a profile CSV",
        description=plain_text(__doc__ or ""),
    )
    parser.add_argument(
        "--config",
        type=readable_file,
        help="job YAML (configs/examples/*.yaml): orders, transfers, tail and GPU from the job, so "
        "simulate --config replays the plan exactly; without --profile the job's modelled profile",
    )
    parser.add_argument("--profile", type=readable_file, help="profile CSV (Perseus/lowtime columns)")
    parser.add_argument("--stages", type=positive_int, help="pipeline-parallel size (without --config)")
    parser.add_argument(
        "--microbatches", type=positive_int, help="microbatches per iteration (without --config)"
    )
    parser.add_argument(
        "--vpp", type=positive_int, default=1, help="virtual pipeline size (model chunks per stage)"
    )
    parser.add_argument(
        "--target",
        type=parse_target,
        default=EnergyTarget("iso-time"),
        help="iso-time (default: no slower than all-maximum clocks), min-energy, slowdown:X with 0<X<1, "
        "power:W[,peak:P] (fastest plan within W watts per GPU on average, P at peak), or "
        "smooth:floor=F,ramp=R,job-ramp=J@N[,slowdown=X] (a bound on the power swing, filler included)",
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
        choices=PROFILE_SOURCES,
        default=None,
        help="where the CSV's figures come from, for a CSV without a 'source' column (the session's profiles "
        "have one): measured on GPUs, modelled, or simulated GPUs",
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
    parser.add_argument(
        "--memory-clock",
        choices=("auto", "off"),
        default="auto",
        help="auto (default): lower a stage's memory clock for the run where the GPU spec offers a lower one "
        "and that saves energy without slowing the plan (modelled); off: every stage at the stock one",
    )
    parser.add_argument("--out", required=True, type=output_file, help="where to write the plan JSON")
    parser.add_argument("--plot", type=output_file, help="also plot the frontier (PNG)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Plan and print the summary.

    Args:
        args: Parsed ``plan`` arguments.

    Returns:
        0 on success, 2 on invalid input.
    """
    console = output_console()
    try:
        profile, job, source, accounting = _planning_inputs(args)
        job = dataclasses.replace(job, memory_clock=args.memory_clock == "auto")
        plan = with_saving_band(MemoryClockLever(PerseusOptimiser()).plan(profile, job), profile, job)
        save_plan(plan, args.out)
    except (ValueError, OSError) as error:
        return fail("plan", error)
    console.print(_summary(plan))
    if plan.smoothing is not None:
        energy_j, stock_j = plan.target_point.energy_j, plan.baseline.energy_j
        console.print(smoothing_cost_text(plan.smoothing, energy_j, stock_j), markup=False)
    console.print(
        f"modelled: the pipeline simulated from a {profile.source} profile ({source}, GPU "
        f"{profile.gpu_name}); the lower bound is the convex relaxation's optimum (instant switches), which "
        "no plan can beat"
    )
    console.print(accounting.describe(), markup=False)
    for line in row_warning_lines(profile):
        console.print(line, markup=False)
    console.print(f"plan written to {args.out} (job fingerprint {plan.fingerprint})")
    if args.plot:
        plot_frontier(plan, args.plot)
        console.print(f"frontier plot written to {args.plot}")
    return 0


def _planning_inputs(args: argparse.Namespace) -> tuple[Profile, PlanningJob, str, Accounting]:
    """The profile, the job to plan, a label of where the profile came from, and the energy accounting."""
    if args.config is not None:
        return _job_config_inputs(args)
    if args.profile is None or args.stages is None or args.microbatches is None:
        raise ValueError("give --config JOB.yaml, or --profile CSV with --stages and --microbatches")
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
    profile = _read_profile(args, gpu_name, blocked_w, idle_w)
    _check_profile_covers(
        args, profile, args.stages, args.vpp, f"--stages {args.stages} --vpp {args.vpp} was given"
    )
    comm = None
    if args.activation_bytes:
        comm = CommSpec(spec.p2p_latency_s, spec.p2p_bandwidth_gbps, args.activation_bytes)  # type: ignore[union-attr]
    job_fingerprint = fingerprint(
        profile_sha256=hashlib.sha256(Path(args.profile).read_bytes()).hexdigest(),
        parallelism={"pipeline": args.stages, "virtual": args.vpp},
        batch={"microbatches": args.microbatches, "activation_bytes": args.activation_bytes},
        gpu=gpu_name,
        powers_w=[blocked_w, idle_w],
    )
    latency_ms = args.switch_latency_ms
    if latency_ms is None:
        latency_ms = 1e3 * spec.switch_latency_s if spec is not None else 0.0
    from_spec = f"from --gpu-spec {spec.name}" if spec is not None else ""
    latency_from = from_spec or "no GPU spec given"
    accounting = Accounting(
        blocked_power_w=blocked_w,
        idle_power_w=idle_w,
        powers_from=_powers_origin(args, from_spec),
        switch_latency_s=latency_ms / 1e3,
        latency_from="from --switch-latency-ms" if args.switch_latency_ms is not None else latency_from,
    )
    job = planning_job(
        pipeline_orders(args.stages, args.microbatches, args.vpp),
        job_fingerprint,
        args.target,
        spec,
        switch_latency_s=latency_ms / 1e3,
        comm=comm,
        frontier_points=args.points,
    )
    return profile, job, str(args.profile), accounting


def _job_config_inputs(args: argparse.Namespace) -> tuple[Profile, PlanningJob, str, Accounting]:
    """Plan for a job YAML: its orders, transfers, tail, GPU and fingerprint, so ``simulate`` replays it."""
    given = [flag for flag, value in _JOB_FLAGS.items() if getattr(args, value) is not None]
    if given:
        raise ValueError(f"--config describes the job; drop {', '.join(given)}")
    config = JobConfig.load(args.config)
    spec = config.spec()
    if args.profile is None:
        profile, source = config.synthetic_profile(spec), f"the time/power model of {spec.name}"
    else:
        profile = _read_profile(args, spec.name, spec.blocked_power_w, spec.idle_power_w)
        _check_profile_covers(
            args,
            profile,
            config.pipeline_stages,
            config.virtual_stages,
            f"the job {args.config} has {config.pipeline_stages} stages x {config.virtual_stages} chunks",
        )
        source = str(args.profile)
    latency_ms = args.switch_latency_ms
    from_spec = f"from the job's GPU spec {spec.name}"
    accounting = Accounting(
        blocked_power_w=spec.blocked_power_w,
        idle_power_w=spec.idle_power_w,
        powers_from=from_spec,
        switch_latency_s=spec.switch_latency_s if latency_ms is None else latency_ms / 1e3,
        latency_from=from_spec if latency_ms is None else "from --switch-latency-ms",
    )
    job = config.planning_job(
        args.target, args.points, None if latency_ms is None else latency_ms / 1e3, spec=spec
    )
    return profile, job, source, accounting


_JOB_FLAGS = {
    "--stages": "stages",
    "--microbatches": "microbatches",
    "--gpu-spec": "gpu_spec",
    "--blocked-power-w": "blocked_power_w",
    "--idle-power-w": "idle_power_w",
}


def _check_profile_covers(
    args: argparse.Namespace, profile: Profile, stages: int, chunks: int, given: str
) -> None:
    """Refuse a profile CSV of another pipeline than the one planned for.

    Args:
        args: Parsed ``plan`` arguments (for the profile's path).
        profile: The profile read from ``args.profile``.
        stages: Pipeline stages of the job planned for.
        chunks: Model chunks per stage of the job planned for.
        given: What says the job has ``stages`` x ``chunks``, for the message.

    Raises:
        ValueError: If the profile covers another number of stages or chunks.
    """
    if (profile.num_stages, profile.num_chunks) != (stages, chunks):
        raise ValueError(
            f"{args.profile} covers {profile.num_stages} stages x {profile.num_chunks} chunks, but {given}; "
            "profile the job with this parallelism"
        )


def _powers_origin(args: argparse.Namespace, from_spec: str) -> str:
    """Where the blocked and idle power came from: flags, the GPU spec, or both."""
    given = (("--blocked-power-w", args.blocked_power_w), ("--idle-power-w", args.idle_power_w))
    flags = [flag for flag, value in given if value is not None]
    if len(flags) == 2 or not from_spec:
        return "from " + " and ".join(flags)
    return from_spec if not flags else f"from {flags[0]}, the other {from_spec}"


def _read_profile(args: argparse.Namespace, gpu_name: str, blocked_w: float, idle_w: float) -> Profile:
    """The CSV's profile; its provenance from its ``source`` column or ``--profile-source``, never assumed."""
    return Profile.from_csv(
        args.profile,
        gpu_name=gpu_name,
        source=args.profile_source,
        blocked_power_w=blocked_w,
        idle_power_w=idle_w,
    )


def _summary(plan: Plan) -> Table:
    """All-maximum clocks vs. planned figures, each labelled with where it comes from."""
    target = plan.target_point
    baseline = plan.baseline
    table = Table(title=f"plan for target {plan.target}: {plan.num_stages} pipeline stages")
    for header in ("figure", "all-maximum clocks", "plan", "change", "source"):
        table.add_column(header, justify="left" if header in ("figure", "source") else "right")
    time_change = target.iteration_time_s / baseline.iteration_time_s - 1
    table.add_row(
        "iteration time (s)",
        f"{baseline.iteration_time_s:.4f}",
        f"{target.iteration_time_s:.4f}",
        f"{100 * time_change:+.2f} %",
        "modelled",
    )
    table.add_row(
        "energy per iteration (J)",
        f"{baseline.energy_j:,.1f}",
        f"{target.energy_j:,.1f}",
        saving_text(plan),
        "modelled",
    )
    for stage, rank in enumerate(target.ranks):
        table.add_row(f"  stage {stage} energy (J)", "", f"{rank.energy_j:,.1f}", "", "modelled")
    table.add_row(
        f"lower bound at {target.deadline_s:.4f} s (J)",
        "",
        f"{target.lower_bound_j:,.1f}",
        f"plan {format_gap(target.gap)}",
        "modelled",
    )
    return table
