"""``megatron-energy demo``: profile → plan → run on real megatron-core schedules with simulated GPUs."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from megatron_energy.commands.demo_run import DemoSettings, run_demo, summarise
from megatron_energy.config import parse_freq_grid, parse_target
from megatron_energy.report.demo_outputs import write_demo_outputs


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand."""
    defaults = DemoSettings()
    parser = subparsers.add_parser(
        "demo",
        help="the whole loop on CPU: tiny GPT, real megatron-core schedules, simulated GPUs (modelled)",
        description=(
            "Run a tiny GPT through megatron-core's real pipeline schedule over gloo, one process per stage, "
            "with simulated GPUs that time each instruction as a real model's stage would take on the "
            "chosen GPU (modelled). Profiles, plans and runs; writes a summary, a frontier plot and a "
            "Perfetto timeline under --energy-dir."
        ),
    )
    parser.add_argument("--stages", type=int, default=defaults.pipeline_size, help="pipeline stages")
    parser.add_argument("--microbatches", type=int, default=defaults.num_microbatches)
    parser.add_argument("--model", default=defaults.model, help="model whose stage work is simulated")
    parser.add_argument("--gpu-spec", default=defaults.gpu_spec, help="simulated GPU (configs/gpus)")
    parser.add_argument("--target", type=parse_target, default=defaults.target)
    parser.add_argument("--freq-grid", type=parse_freq_grid, default=None, metavar="MHZ,...|auto")
    parser.add_argument("--profile-iters", type=int, default=defaults.profile_iters)
    parser.add_argument("--run-steps", type=int, default=defaults.run_steps)
    parser.add_argument("--energy-dir", type=Path, default=defaults.energy_dir)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo and print its summary."""
    settings = DemoSettings(
        pipeline_size=args.stages,
        num_microbatches=args.microbatches,
        model=args.model,
        gpu_spec=args.gpu_spec,
        target=args.target,
        freq_grid=args.freq_grid,
        profile_iters=args.profile_iters,
        run_steps=args.run_steps,
        energy_dir=args.energy_dir,
    )
    with tempfile.TemporaryDirectory() as results:
        reports = run_demo(settings, Path(results))
    write_demo_outputs(settings, summarise(reports))
    return 0
