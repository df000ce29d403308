r"""The workload model's activity scale that a measured stock profile asks for, per instruction class.

A training step's kernels draw less per clock than the large products a calibration measures its kernel
classes on. This prints, for each instruction class of a profile measured at the stock clock
(``profile.csv`` of a dry run's energy folder), the ``workload_activity_scale`` at which the workload
model's work for that class draws the measured power there (**modelled** against **measured**), and its
time beside the measured one:

    python lab/workload_activity.py --profile energy/<job>/profile.csv --spec h100-sxm \\
        --num-layers 8 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 --micro-batch-size 2

The spec's own scale is set aside (1 here), so the figure is the scale the spec should carry. A class measured
at its power limit draws the limit whatever its activity (``nan``): give ``--cap-clock-mhz``, the clock the
power-cap check read, to solve the scale at which the model caps there instead.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from pathlib import Path

from scipy.optimize import brentq

from megatron_energy.dvfs.model import GpuPowerModel
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.workload import TransformerShape, instruction_work

SCALE_RANGE = (0.02, 5.0)


def parse_args() -> argparse.Namespace:
    """The job's shape, its profile and the spec."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", type=Path, required=True, help="profile.csv of a dry run")
    parser.add_argument("--spec", default="h100-sxm")
    parser.add_argument("--num-layers", type=int, required=True)
    parser.add_argument("--hidden-size", type=int, required=True)
    parser.add_argument("--ffn-hidden-size", type=int, default=None, help="default: 4 x hidden")
    parser.add_argument("--num-attention-heads", type=int, required=True)
    parser.add_argument("--seq-length", type=int, required=True)
    parser.add_argument("--micro-batch-size", type=int, required=True)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    parser.add_argument(
        "--cap-clock-mhz",
        type=float,
        default=None,
        help="the clock the power-cap check read (measured): also the scale at which the model caps there",
    )
    return parser.parse_args()


def main() -> None:
    """Print the scale per instruction class at the stock clock."""
    args = parse_args()
    spec = dataclasses.replace(load_gpu_spec(args.spec), workload_activity_scale=1.0)
    model = GpuPowerModel(spec)
    shape = TransformerShape(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        ffn_hidden_size=args.ffn_hidden_size or 4 * args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size,
        vocab_size=args.vocab_size,
    )
    works = instruction_work(shape, spec, args.pipeline_model_parallel_size)
    stock = spec.max_sm_clock_mhz
    with args.profile.open() as rows:
        for row in csv.DictReader(rows):
            if int(row["frequency"]) != stock:
                continue
            work = works[Work(int(row["stage"]), int(row.get("chunk") or 0), row["instruction"])]
            time_s, energy_j = float(row["time"]), float(row["energy"])
            measured_w = energy_j / time_s

            def excess(scale: float, work: object = work, measured_w: float = measured_w) -> float:
                return model.power_w(dataclasses.replace(work, activity_scale=scale), stock) - measured_w

            low, high = SCALE_RANGE
            scale = brentq(excess, low, high) if excess(low) < 0 < excess(high) else float("nan")
            by_clock = ""
            if args.cap_clock_mhz is not None:

                def above(scale: float, work: object = work) -> float:
                    return (
                        model.effective_clock_mhz(dataclasses.replace(work, activity_scale=scale), stock)
                        - args.cap_clock_mhz
                    )

                solved = brentq(above, low, high) if above(low) > 0 > above(high) else float("nan")
                by_clock = (
                    f"; for the cap clock {args.cap_clock_mhz:.0f} MHz (measured) {solved:.3f} (modelled)"
                )
            print(
                f"stage {row['stage']} {row['instruction']:8s} measured {measured_w:5.0f} W over "
                f"{time_s * 1e3:6.1f} ms (measured); workload model "
                f"{model.time_s(work, stock) * 1e3:6.1f} ms (modelled); activity scale for the measured "
                "power "
                f"{scale:.3f} (modelled){by_clock}",
            )


if __name__ == "__main__":
    main()
