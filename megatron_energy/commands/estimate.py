"""``megatron-energy estimate``: what each mode would save on a job, from its Megatron command line.

``megatron-energy estimate --gpu-spec NAME --gpus N -- <Megatron arguments>`` reads the arguments you train
with (``pretrain_gpt.py`` and its flags: parallel sizes, layers, hidden size, heads, sequence, micro and
global batch, MoE, virtual pipeline, recompute, dtype; every other flag is listed as ignored), places the job
on the GPUs and nodes given (``--gpus`` or ``--nodes``, ``--gpus-per-node``; groups that span nodes cross the
NIC at ``--inter-node-gbps``, the GPU spec's by default) and plans every mode (perseus, kareus, kernel, all)
at each ``--target`` on the offline planning path (no GPU, no torch, no Megatron). It prints each plan's
modelled saving against stock clocks with its band (the saving over the GPU spec's declared ranges); every
figure is *modelled* by the GPU spec's time/power model. ``--save-job FILE.yaml`` writes the job as a job
YAML, which ``plan --config`` and ``simulate --config`` read (``docs/reference/job-yaml.md``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml
from rich.table import Table

from megatron_energy.commands.arguments import fail, output_file, plain_text
from megatron_energy.commands.estimate_modes import DEFAULT_POINTS, ESTIMATE_MODES, JobEstimate, estimate_job
from megatron_energy.commands.megatron_command_line import MegatronJob, NodeLayout, read_megatron_job
from megatron_energy.config import positive_int
from megatron_energy.dvfs.model import GpuPowerModel
from megatron_energy.dvfs.spec import available_gpu_specs, load_gpu_spec
from megatron_energy.job import JobConfig, JobConfigError
from megatron_energy.optimisers.interface import SWITCH_EVALUATIONS
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.plan_outcome import banded_text, change_text
from megatron_energy.report.console import output_console
from megatron_energy.target import EnergyTarget, parse_target

DEFAULT_TARGETS = ("iso-time", "slowdown:0.05", "min-energy")
"""The targets estimated without ``--target``."""

DEFAULT_GPUS_PER_NODE = 8
"""GPUs per node without ``--gpus-per-node`` (a DGX/HGX node)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``estimate`` subcommand.

    Args:
        subparsers: The ``megatron-energy`` subcommand registry.
    """
    parser = subparsers.add_parser(
        "estimate",
        help="modelled saving of every mode and target on a job, from its Megatron command line",
        description=plain_text(__doc__ or ""),
        usage="megatron-energy estimate --gpu-spec NAME (--gpus N | --nodes N) [options] -- <Megatron args>",
    )
    parser.add_argument(
        "--gpu-spec",
        metavar="NAME|PATH",
        help="GPU spec: a name under configs/gpus/ or a spec YAML (required)",
    )
    layout = parser.add_mutually_exclusive_group()
    layout.add_argument(
        "--gpus", type=positive_int, metavar="N", help="GPUs of the job (Megatron's world size)"
    )
    layout.add_argument(
        "--nodes", type=positive_int, metavar="N", help="nodes of the job (x --gpus-per-node)"
    )
    parser.add_argument(
        "--gpus-per-node",
        type=positive_int,
        default=DEFAULT_GPUS_PER_NODE,
        metavar="G",
        help=f"GPUs per node (default {DEFAULT_GPUS_PER_NODE}): groups in a node use NVLink, others the NIC",
    )
    parser.add_argument(
        "--inter-node-gbps",
        type=_positive_float,
        metavar="GBPS",
        help="NIC bandwidth per GPU and direction in GB/s (default: the GPU spec's nic_bandwidth_gbps)",
    )
    parser.add_argument(
        "--target",
        type=parse_target,
        action="append",
        metavar="TARGET",
        help=f"a planning target, repeatable (default: {', '.join(DEFAULT_TARGETS)})",
    )
    parser.add_argument(
        "--trials",
        type=positive_int,
        default=24,
        help="Kareus's model-priced search trials per stage (default 24)",
    )
    parser.add_argument(
        "--points",
        type=positive_int,
        default=DEFAULT_POINTS,
        help=f"deadlines in Perseus's frontier sweep (default {DEFAULT_POINTS}, plan's)",
    )
    parser.add_argument(
        "--switch-evaluations",
        type=positive_int,
        default=SWITCH_EVALUATIONS,
        metavar="N",
        help="latency-aware simulations the switch-latency post-pass may run per point "
        f"(default {SWITCH_EVALUATIONS}, plan's)",
    )
    parser.add_argument(
        "--save-job", type=output_file, metavar="FILE.yaml", help="write the job as a job YAML"
    )
    parser.add_argument("megatron_args", nargs="*", metavar="-- <Megatron arguments>", help=argparse.SUPPRESS)
    parser.set_defaults(func=run)
    _require_separator(parser)


def _require_separator(parser: argparse.ArgumentParser) -> None:
    """Refuse Megatron flags given before ``--`` with one line that says where they go."""
    parse = parser.parse_known_args

    def parse_known_args(args: list[str] | None = None, namespace: object = None) -> tuple[object, list[str]]:
        parsed, extras = parse(args, namespace)
        if extras:
            parser.error(
                f"unrecognized arguments before --: {' '.join(extras)}; the Megatron arguments go after --, "
                "e.g. megatron-energy estimate --gpu-spec h100-sxm --gpus 8 -- --num-layers 24 ..."
            )
        return parsed, extras

    setattr(parser, "parse_known_args", parse_known_args)  # noqa: B010 (a method of this parser alone)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be a number > 0")
    return value


def run(args: argparse.Namespace) -> int:
    """Estimate and print the table.

    Args:
        args: Parsed ``estimate`` arguments.

    Returns:
        0 on success, 2 on invalid input.
    """
    try:
        megatron, config = _job(args)
    except (ValueError, OSError) as error:
        return fail("estimate", error)
    if args.save_job:
        Path(args.save_job).write_text(
            yaml.safe_dump(megatron.job.to_yaml_data(), sort_keys=False), encoding="utf-8"
        )
    targets = [*dict.fromkeys(args.target or [parse_target(text) for text in DEFAULT_TARGETS])]
    started = time.perf_counter()

    def progress(line: str) -> None:
        sys.stderr.write(f"estimate: {line} ({time.perf_counter() - started:.1f} s)\n")  # one write a line:
        sys.stderr.flush()  # the targets' workers print side by side

    try:
        estimate = estimate_job(
            config,
            targets,
            SearchBudget(trials=args.trials),
            args.points,
            progress,
            switch_evaluations=args.switch_evaluations,
        )
    except (ValueError, OSError) as error:
        return fail("estimate", error)
    progress("done")
    _print(estimate, megatron, targets, args)
    return 0


def _job(args: argparse.Namespace) -> tuple[MegatronJob, JobConfig]:
    """The Megatron command line read as a job on the given GPUs, and the job built from it."""
    if args.gpu_spec is None:
        raise ValueError(
            f"give --gpu-spec NAME or a spec YAML path; shipped specs: {', '.join(available_gpu_specs())}"
        )
    spec = load_gpu_spec(args.gpu_spec)
    if args.gpus is None and args.nodes is None:
        raise ValueError("give --gpus N (the job's GPU count) or --nodes N (x --gpus-per-node)")
    if not args.megatron_args:
        raise ValueError(
            "no Megatron arguments: add -- and the arguments you train with, e.g. -- --num-layers 24 ..."
        )
    layout = NodeLayout(
        num_gpus=args.gpus or args.nodes * args.gpus_per_node,
        gpus_per_node=args.gpus_per_node,
        inter_node_gbps=args.inter_node_gbps or spec.nic_bandwidth_gbps,
    )
    megatron = read_megatron_job(args.megatron_args, layout, args.gpu_spec, spec)
    try:
        return megatron, JobConfig.from_file(megatron.job)
    except JobConfigError as error:
        raise ValueError(f"the Megatron arguments: {error}") from None


def _print(
    estimate: JobEstimate, megatron: MegatronJob, targets: list[EnergyTarget], args: argparse.Namespace
) -> None:
    """The table, then what the job is, what was derived and ignored, and what every figure is."""
    console = output_console(min_width=120)
    job, spec = estimate.job, estimate.spec
    console.print(_table(estimate, targets))
    nodes = -(-job.num_gpus // args.gpus_per_node)
    virtual = f" (VPP={job.virtual_stages})" if job.virtual_stages > 1 else ""
    sequence = " (sequence parallel)" if job.sequence_parallel else ""
    experts = f" EP={job.shape.moe.expert_parallel}" if job.shape.moe else ""
    console.print(
        f"job: {job.num_gpus} x {spec.name} ({nodes} node(s) of up to {args.gpus_per_node}): "
        f"PP={job.pipeline_stages}{virtual} TP={job.tensor_parallel}{sequence} "
        f"DP={job.data_parallel}{experts}, "
        f"{job.num_microbatches} microbatches of {job.micro_batch_size} x {job.shape.seq_length} tokens per "
        "pipeline and iteration",
        markup=False,
    )
    for note in megatron.notes:
        console.print(f"derived: {note}", markup=False)
    flags = [argument for argument in megatron.ignored if argument.startswith("-")]
    if flags:
        console.print(
            f"ignored Megatron arguments (the model does not use them): {' '.join(flags)}", markup=False
        )
    console.print(
        f"every figure {GpuPowerModel(spec).describe()}; each mode's plan's target point against stock "
        f"clocks, executable under {1e3 * estimate.switch_latency_s:g} ms clock switches; a band spans the "
        "GPU spec's declared ranges (docs/concepts/saving-bands.md)",
        markup=False,
    )
    if args.save_job:
        console.print(f"job YAML written to {args.save_job} (plan --config / simulate --config read it)")


def _table(estimate: JobEstimate, targets: list[EnergyTarget]) -> Table:
    """One row per target and mode: iteration time and energy against stock clocks, the job's energy."""
    job = estimate.job
    table = Table(
        title=f"{job.name}: modelled saving per iteration against stock clocks "
        f"(GPU spec {estimate.spec.name}, {job.num_gpus} GPUs)"
    )
    for header in ("target", "mode", "time vs stock", "energy vs stock (band)", "job kJ/iteration"):
        table.add_column(header, justify="left" if header in ("target", "mode") else "right")
    pipelines = job.tensor_parallel * job.data_parallel
    for target in targets:
        for mode in ESTIMATE_MODES:
            row = estimate.row(target, mode)
            if row.plan is None:
                table.add_row(str(target), mode, "-", row.reason, "-")
                continue
            table.add_row(
                str(target),
                mode,
                change_text(row.time_change),
                banded_text(row.saving, row.plan.saving_band),
                f"{row.plan.target_point.energy_j * pipelines / 1e3:,.1f}",
            )
        table.add_section()
    return table
