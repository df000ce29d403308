"""``megatron-energy demo``: the launcher's whole profile → plan → run loop on CPU, with simulated GPUs.

The demo runs the command a user would run on a GPU cluster, on this machine: ``torch.distributed.run``
starts one process per pipeline stage, each running the energy launcher (``python -m
megatron_energy.launch``) on the demo's training script (``megatron_energy.demo_model``): megatron-core's real
schedules over gloo, a tiny GPT on CPU, and the launcher's energy session on simulated GPUs that time every
instruction as a real model's stage would take on the chosen GPU. Every energy and time figure is therefore
modelled, and says so. The ranks' output streams as it comes; at the end one table compares stock clocks
with the plan, and the frontier plot and the plan's Perfetto timeline are written. With ``--energy-mode all``
the demo then compares Perseus only, Kareus only and both, planned again from the profile the run measured
(``commands.optimiser_comparison.compare_job_folder``; the tables of ``simulate --compare``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
from pathlib import Path

import megatron_energy
from megatron_energy.commands.arguments import INTERRUPTED_STATUS, fail
from megatron_energy.commands.comparison_output import print_comparison
from megatron_energy.commands.demo_job import DemoJob
from megatron_energy.commands.optimiser_comparison import compare_job_folder
from megatron_energy.commands.rank_processes import free_port, run_ranks
from megatron_energy.config import EnergyConfig, add_energy_args, positive_int
from megatron_energy.demo_model import python_warnings_filter
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.energy_dir import JobFiles
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.workload import KNOWN_SHAPES
from megatron_energy.report.console import output_console
from megatron_energy.report.demo_summary import SummaryError, load_summary, settling_note, summary_table
from megatron_energy.report.job_report import ReportError, latest_job_folder, write_job_report

DEMO_ENERGY_FLAGS = (
    "mode",
    "target",
    "gpu_spec",
    "dir",
    "profile_iters",
    "freq_grid",
    "trace",
    "safety_tolerance",
    "safety_steps",
    "overhead_check",
)
"""The launcher's ``--energy-*`` flags the demo takes (it always optimises, on simulated GPUs)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand."""
    parser = subparsers.add_parser(
        "demo",
        help="the launcher's whole loop on CPU: tiny GPT, real megatron-core schedules, simulated GPUs",
        description=(
            "Run the energy launcher on this machine as on a GPU cluster: torch.distributed.run starts one "
            "process per pipeline stage; megatron-core's real schedule trains a tiny GPT over gloo while "
            "simulated GPUs time every instruction as the chosen model's stage would take on the chosen GPU "
            "(all energy and time figures modelled). Profiles a clock grid, plans, runs the plan, and ends "
            "with one table of stock clocks against the plan, a frontier plot and a Perfetto timeline."
        ),
        allow_abbrev=False,
    )
    parser.add_argument(
        "--model",
        choices=tuple(KNOWN_SHAPES),
        default="gpt3-1.3b",
        help="model whose stage work the simulated GPUs time (default: %(default)s)",
    )
    parser.add_argument(
        "--pipeline-model-parallel-size",
        type=positive_int,
        default=4,
        metavar="N",
        help="pipeline stages, one CPU process each; must divide the model's layers (default: %(default)s)",
    )
    parser.add_argument(
        "--num-microbatches",
        type=positive_int,
        default=8,
        metavar="N",
        help="microbatches per iteration (default: %(default)s)",
    )
    parser.add_argument(
        "--run-iters",
        type=two_or_more,
        default=10,
        metavar="N",
        help="iterations with the plan after profiling; the first settles (default: %(default)s)",
    )
    add_energy_args(parser, only=DEMO_ENERGY_FLAGS, defaults={"gpu_spec": "h100-sxm"})
    parser.set_defaults(func=run, energy_optimise=True, energy_backend="simulated")


def two_or_more(text: str) -> int:
    """Parse a whole number >= 2 (an ``argparse`` type)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"'{text}': give 2 or more; the first iteration under the plan settles and is left out"
        )
    return value


def rank_environment() -> dict[str, str]:
    """The ranks' environment: this one, importing this ``megatron_energy``, without a CPU run's noise."""
    env = dict(os.environ)
    package_root = str(Path(megatron_energy.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), python_warnings_filter()]))
    env["PYTHONUNBUFFERED"] = "1"  # lines arrive as they are printed
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets anyway, without its banner about it
    return env


def run(args: argparse.Namespace) -> int:
    """Run the demo's ranks through the launcher, then print the summary and write the report."""
    console = output_console()
    job = DemoJob(
        model=args.model,
        pipeline_size=args.pipeline_model_parallel_size,
        num_microbatches=args.num_microbatches,
        run_iters=args.run_iters,
        energy=EnergyConfig.from_args(args),
        tensorboard=importlib.util.find_spec("tensorboard") is not None,
    )
    problem = job.problem()
    if problem is not None:
        return fail("demo", problem)
    gpu = load_gpu_spec(job.energy.gpu_spec or "").name
    log_start_byte = job.log_file.stat().st_size if job.log_file.is_file() else 0  # the log is appended
    print(
        f"megatron-energy demo: {job.pipeline_size} processes run megatron-core's pipeline schedule on CPU "
        f"(a tiny GPT over gloo); simulated {gpu} GPUs time every instruction as a {job.model} stage "
        "would take (modelled)",
        flush=True,
    )
    command = job.command(free_port())
    print(f"launcher command: {shlex.join(command)}", flush=True)
    try:
        status = run_ranks(command, rank_environment(), job.ranks_log, _echo)
    except KeyboardInterrupt:
        fail("demo", f"interrupted; the ranks were stopped (their output: {job.ranks_log})")
        return INTERRUPTED_STATUS
    if status != 0:
        fail("demo", f"the ranks exited with status {status}; every rank's output is in {job.ranks_log}")
        return status
    try:
        folder = latest_job_folder(job.energy.dir)
        if not JobFiles(folder).plan.is_file():
            return fail(
                "demo",
                "no plan ran: the ranks trained at stock clocks (the [energy] line above says why); "
                f"the job's profile is kept in {folder}, so a run with a reachable --energy-target re-plans "
                "from it without profiling",
            )
        summary = load_summary(folder, job.log_file, log_start_byte)  # this run's records only
        report = write_job_report(folder)
    except (ReportError, SummaryError) as problem:  # say what to do themselves
        return fail("demo", problem)
    title = (
        f"{job.model} stage work on {job.pipeline_size} simulated {gpu}, PP={job.pipeline_size}, "
        f"{job.num_microbatches} microbatches, target {job.energy.target}: every figure modelled"
    )
    console.print(summary_table(summary, title, num_gpus=job.pipeline_size))
    console.print(settling_note(summary))
    if job.energy.mode == "all":
        try:
            comparison = compare_job_folder(folder, f"{job.model} on {job.pipeline_size} simulated {gpu}")
        except EnergyValueError as problem:
            return fail("demo", problem)
        console.print(
            "Perseus only vs Kareus only vs both (--energy-mode all), each planned again from the profile "
            "this run measured on simulated GPUs with the job's own collective settings: every figure "
            "modelled"
        )
        print_comparison(console, comparison)
    console.print(report.frontier_line)
    console.print(
        f"Perfetto timeline of the plan (modelled; open in ui.perfetto.dev): {report.timeline_json}"
    )
    if job.tensorboard:
        console.print(f"TensorBoard scalars: {job.tensorboard_dir}")
    else:
        console.print("TensorBoard scalars: not written (the tensorboard package is not installed)")
    console.print(f"energy log (one JSON record per iteration): {job.log_file}")
    console.print(f"every rank's output: {job.ranks_log}")
    return 0


def _echo(line: str) -> None:
    print(line, flush=True)
