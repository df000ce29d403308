"""``megatron-energy simulate``: modelled iteration time and per-stage energy of a job, optionally planned.

The job's instructions come from megatron-core's own schedule, their time and energy per clock from the time/
power model of the job's GPU spec (a synthetic profile), so every figure printed is *modelled*. Without
``--plan`` every instruction runs at its fastest clock; with ``--plan`` at the plan's clocks (a plan made for
this job: ``megatron-energy plan --config`` the same YAML), compared with that all-fastest baseline. Clock
switches take the GPU's switch latency, as on the GPU, unless ``--instant-switches`` is given.

With ``--compare`` it plans Perseus only, Kareus only and ``--energy-mode all`` and prints each plan's
latency-aware prediction against the stock iteration (static and dynamic energy apart), the figures each
mode's plan file carries: see ``commands/optimiser_comparison.py``.

With ``--power-swing`` it prints the job's power swing per GPU and at 1k-16k GPUs (``--gpus``): stock clocks
against the plan against a filler floor (``--floor``), replicas in phase and spread (``--spread``); with
``--plot`` it draws it (``commands/power_swing_output.py``; every figure modelled).

With ``--switch-latency-sweep 10ms,1ms,100us,10us`` it prints the iso-time saving of instruction-level
(Perseus) and phase-level (Perseus refined by the phase optimiser) plans at each switch latency, for the
``--config`` job or, without one, every example job (``commands/latency_sweep.py``; every figure modelled).
"""

import argparse
import dataclasses

from rich.console import Console
from rich.table import Table

from megatron_energy.commands.arguments import fail, output_file, plain_text, readable_file
from megatron_energy.commands.comparison_output import comparison_label, print_comparison
from megatron_energy.commands.latency_sweep import HEADER, example_jobs, latencies_argument, sweep_job
from megatron_energy.commands.optimiser_comparison import compare_optimisers
from megatron_energy.commands.power_swing_output import (
    SwingOptions,
    floor_share,
    gpu_counts,
    print_power_swing,
    share,
)
from megatron_energy.config import positive_int
from megatron_energy.job import JobConfig, JobConfigError
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.pipeline.instruction import Step
from megatron_energy.plan import Plan, PlanError
from megatron_energy.plan_file import load_plan
from megatron_energy.plan_outcome import banded_text, change_text, energy_change, run_band
from megatron_energy.plan_smoothing import smoothing_cost_text
from megatron_energy.report.console import output_console
from megatron_energy.sim.filler import filled_traces
from megatron_energy.sim.job_power import JobScale
from megatron_energy.sim.memory_clocks import MemoryClockPricing, plan_memory
from megatron_energy.sim.power_timeline import stage_power_traces
from megatron_energy.sim.simulator import SimResult, Simulator
from megatron_energy.sim.swing_cases import swing_cases
from megatron_energy.sim.trace import write_trace


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``simulate`` subcommand.

    Args:
        subparsers: The ``megatron-energy`` subcommand registry.
    """
    parser = subparsers.add_parser(
        "simulate",
        help="modelled iteration time and per-stage energy of a job (optionally under a plan)",
        description=plain_text(__doc__ or ""),
    )
    parser.add_argument(
        "--config",
        type=readable_file,
        help="job YAML, e.g. configs/examples/*.yaml (required, except with --switch-latency-sweep)",
    )
    parser.add_argument(
        "--plan", type=readable_file, help="plan JSON to simulate (default: every clock at its fastest)"
    )
    parser.add_argument(
        "--instant-switches",
        action="store_true",
        help="model clock switches as instant (default: the GPU spec's switch latency, as on the GPU)",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="print Perseus-only vs Kareus-only vs both (modelled: time, energy, static/dynamic split)",
    )
    parser.add_argument(
        "--trials",
        type=positive_int,
        default=24,
        help="with --compare: Kareus's model-priced search trials per pipeline stage (default 24)",
    )
    parser.add_argument(
        "--points",
        type=positive_int,
        default=40,
        help="with --compare: deadlines in Perseus's frontier sweep, each made executable under the switch "
        "latency (default 40; fewer plan faster, and the target point may move slightly)",
    )
    parser.add_argument(
        "--trace", type=output_file, help="write a Chrome/Perfetto trace JSON of the iteration here"
    )
    parser.add_argument(
        "--switch-latency-sweep",
        type=latencies_argument,
        metavar="LATENCIES",
        help="comma-separated switch latencies with units (e.g. 10ms,1ms,100us,10us): print the iso-time "
        "saving of instruction-level vs phase-level plans at each (modelled; the --config job, else every "
        "example job)",
    )
    parser.add_argument(
        "--power-swing",
        action="store_true",
        help="print the job's power swing per GPU and at scale: stock vs the plan vs a filler floor "
        "(modelled)",
    )
    parser.add_argument(
        "--gpus",
        type=gpu_counts,
        default=(1024, 16384),
        help="with --power-swing: job sizes, comma-separated (default 1024,16384)",
    )
    parser.add_argument(
        "--spread",
        type=share,
        default=0.1,
        help="with --power-swing: replica start offsets uniform over this share of the iteration, beside "
        "in phase (default 0.1; 0: in phase only)",
    )
    parser.add_argument(
        "--floor",
        type=floor_share,
        default=0.8,
        help="with --power-swing: the filler floor as a share of the busiest GPU's stock peak (default 0.8)",
    )
    parser.add_argument(
        "--plot", type=output_file, help="with --power-swing: draw a few iterations' job power to this PNG"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Simulate the job and print the table.

    Args:
        args: Parsed ``simulate`` arguments.

    Returns:
        0 on success, 2 on an invalid config or plan.
    """
    console = output_console()
    if args.power_swing and (args.compare or args.switch_latency_sweep is not None):
        return fail("simulate", "--power-swing simulates the job at stock clocks and --plan; drop --compare")
    if args.plot and not args.power_swing:
        return fail("simulate", "--plot draws the power swing; add --power-swing")
    if args.switch_latency_sweep is not None:
        return _run_latency_sweep(args)
    if args.config is None:
        return fail("simulate", "--config is required (only --switch-latency-sweep runs without it)")
    if args.compare:
        return _run_comparison(args, output_console(min_width=150))
    try:
        job = JobConfig.load(args.config)
        spec = job.spec()
        latency_s = 0.0 if args.instant_switches else spec.switch_latency_s
        dag, profile = job.build_dag(spec=spec), job.synthetic_profile(spec)
        simulator = Simulator(dag, profile, switch_latency_s=latency_s)
        baseline = simulator.run()
        plan = load_plan(args.plan, expected_fingerprint=job.fingerprint()) if args.plan else None
        planned = None
        if plan is not None:
            clocks = _plan_clocks(plan, spec.name)
            planned = (
                MemoryClockPricing(dag, profile, spec, latency_s).price(clocks, plan_memory(plan, spec))
                if plan.memory_clocks_mhz
                else simulator.run(clocks)
            )
        swing = _swing_options(args, job, plan) if args.power_swing else None
    except (JobConfigError, PlanError, ValueError, OSError) as error:
        return fail("simulate", error)
    result = planned or baseline
    switches = "instant clock switches" if args.instant_switches else f"{1e3 * latency_s:g} ms clock switches"
    label = f"modelled, GPU spec {spec.name}: {spec.display_name}, {switches}"
    scenario = "under the plan" if planned else "at the fastest clocks"
    if plan is not None and plan.memory_clocks_mhz:
        scenario += f" with memory clocks {', '.join(map(str, plan.memory_clocks_mhz))} MHz per stage"
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
            f"plan {args.plan} (target {plan.target}) predicts {plan.target_point.iteration_time_s:.4f} s, "
            f"{plan.target_point.energy_j:,.1f} J "
            f"(the plan's own prediction from a {plan.provenance} profile, "
            f"{1e3 * plan.switch_latency_s:g} ms clock switches)"
        )
        time_change = planned.iteration_time_s / baseline.iteration_time_s - 1
        filler_j = 0.0 if plan.smoothing is None else plan.smoothing.filler_j
        saving = energy_change(baseline.total_energy_j, planned.total_energy_j + filler_j)
        console.print(
            f"versus every instruction at its fastest clock ({baseline.iteration_time_s:.4f} s, "
            f"{baseline.total_energy_j:,.1f} J): time {change_text(time_change)}, energy "
            f"{banded_text(saving, run_band(plan, saving))} ({label}; a band is the plan file's, around "
            "this figure)"
        )
        if plan.smoothing is not None:
            console.print(
                f"with the plan's filler ({filler_j:,.1f} J, in the energy change above): "
                + smoothing_cost_text(
                    plan.smoothing, planned.total_energy_j + filler_j, baseline.total_energy_j
                )
            )
    if args.trace:
        path = write_trace(result, simulator.powers, args.trace)
        console.print(f"trace written to {path} (open in https://ui.perfetto.dev; {label})")
    if swing is not None:
        plan_traces = None if planned is None else stage_power_traces(planned, simulator.powers)
        smoothing = None if plan is None else plan.smoothing
        if plan_traces is not None and smoothing is not None:  # a smooth plan's power with its filler
            plan_traces = filled_traces(plan_traces, smoothing.filler)
        cases = swing_cases(
            stage_power_traces(baseline, simulator.powers),
            plan_traces,
            job.tensor_parallel,
            swing.floor_share,
        )
        if plan_traces is not None and smoothing is not None:
            cases[1] = dataclasses.replace(cases[1], filler_j=job.tensor_parallel * smoothing.filler_j)
        print_power_swing(console, job.name, cases, swing, label)
    return 0


def _swing_options(args: argparse.Namespace, job: JobConfig, plan: Plan | None) -> SwingOptions:
    """``--power-swing``'s options, checked against the job before anything is printed."""
    if plan is not None and plan.memory_clocks_mhz:
        raise PlanError(
            "--power-swing does not model a plan's memory clocks yet; simulate that plan without it"
        )
    for gpus in args.gpus:
        JobScale(gpus).replicas(job.pipeline_stages * job.tensor_parallel)
    return SwingOptions(args.gpus, args.spread, args.floor, args.plot)


def _run_comparison(args: argparse.Namespace, console: Console) -> int:
    """``--compare``: the four modes' tables, and the trace of ``all``'s clocks."""
    if args.plan:
        return fail("simulate", ValueError("--compare plans the job itself; drop --plan"))
    try:
        job = JobConfig.load(args.config)
        comparison = compare_optimisers(job, SearchBudget(trials=args.trials), points=args.points)
    except (JobConfigError, PlanError, ValueError, OSError) as error:
        return fail("simulate", error)
    print_comparison(console, comparison)
    if args.trace:
        spec = comparison.spec
        plan = comparison.row("all").plan
        simulator = Simulator(
            job.build_dag(spec=spec), job.synthetic_profile(spec), switch_latency_s=plan.switch_latency_s
        )
        path = write_trace(simulator.run(_plan_clocks(plan, spec.name)), simulator.powers, args.trace)
        console.print(
            f"trace of all's clocks written to {path} (its collective actions not drawn; "
            f"{comparison_label(comparison)})",
            markup=False,
        )
    return 0


def _run_latency_sweep(args: argparse.Namespace) -> int:
    """``--switch-latency-sweep``: one Markdown row per job and latency, printed as it is computed."""
    if args.plan or args.compare or args.trace:
        return fail(
            "simulate", "--switch-latency-sweep plans the job itself; drop --plan, --compare and --trace"
        )
    try:
        jobs = [JobConfig.load(args.config)] if args.config else example_jobs()
        print(HEADER, flush=True)
        for job in jobs:
            for row in sweep_job(job, args.switch_latency_sweep):
                print(row.markdown(), flush=True)
    except (JobConfigError, PlanError, ValueError, OSError) as error:
        return fail("simulate", error)
    print(
        "every figure modelled (GPU spec time/power model, per-class phase split, every 4th clock of the "
        "grid, 8 frontier deadlines); savings against stock clocks at iso-time"
    )
    return 0


def _plan_clocks(plan: Plan, gpu_name: str) -> dict[Step, int]:
    """The plan's clock per instruction at its target point, after checking it was made for this GPU."""
    if plan.gpu_name != gpu_name:
        raise PlanError(f"the plan was made for GPU {plan.gpu_name!r}, the job runs on {gpu_name!r}")
    return {
        instruction: clock
        for stage in range(plan.num_stages)
        for instruction, clock in plan.target_point.step_clocks(stage).items()
    }


def _stage_table(result: SimResult, title: str) -> Table:
    """Per-stage busy / blocked / tail / idle time and energy, with a total row."""
    table = Table(title=title)
    table.add_column("stage", justify="right")
    parts = ("busy", "blocked", "tail", "idle")
    for header in (*(f"{part} s" for part in parts), *(f"{part} J" for part in parts), "total J"):
        table.add_column(header, justify="right")
    for stage in result.stages:
        times = (stage.busy_s, stage.blocked_s, stage.tail_s, stage.idle_s)
        energies = (stage.busy_energy_j, stage.blocked_energy_j, stage.tail_energy_j, stage.idle_energy_j)
        table.add_row(
            str(stage.stage),
            *(f"{value:.4f}" for value in times),
            *(f"{value:,.1f}" for value in energies),
            f"{stage.total_energy_j:,.1f}",
        )
    table.add_section()
    totals = [sum(getattr(stage, f"{part}_energy_j") for stage in result.stages) for part in parts]
    table.add_row(
        "all", *[""] * len(parts), *(f"{value:,.1f}" for value in totals), f"{result.total_energy_j:,.1f}"
    )
    return table
