"""``simulate --power-swing``: the job's power swing per GPU and at scale, stock against plan against a floor.

Tables of :mod:`megatron_energy.sim.swing_cases`: per GPU (the mean of one replica's GPUs, watts) and the
whole job at each size (megawatts), its data-parallel replicas in phase (the worst case) and, with
``--spread``, started at offsets spread over part of the iteration; optionally the plot
(:mod:`megatron_energy.report.power_swing_plot`). Every figure is *modelled*.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from megatron_energy.plan_outcome import change_text
from megatron_energy.power_swing import DEFAULT_RESOLUTION_S, GRID_BAND_HZ, SwingFigures
from megatron_energy.report.power_swing_plot import plot_power_swing
from megatron_energy.sim.job_power import JobScale
from megatron_energy.sim.swing_cases import ScaledCase, SwingCase, at_scales

SWING_ITERATIONS = 4
"""Iterations every figure is read over (whole ones: the band is read by an FFT)."""

_MW = 1e6


@dataclass(frozen=True)
class SwingOptions:
    """What ``simulate --power-swing`` was asked for.

    Attributes:
        gpus: The job sizes to show (each a whole number of replicas).
        spread: Replica start offsets uniform over this share of the iteration (0: in phase only).
        floor_share: The filler floor as a share of the busiest GPU's stock peak.
        plot: Where to draw a few iterations' job power at the largest size, or ``None``.
    """

    gpus: tuple[int, ...]
    spread: float
    floor_share: float
    plot: Path | None


def gpu_counts(text: str) -> tuple[int, ...]:
    """Comma-separated job sizes in GPUs, e.g. ``1024,16384`` (an ``argparse`` type)."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"'{text}' must be GPU counts >= 1 separated by commas, e.g. 1024,16384"
        )
    return counts


def share(text: str) -> float:
    """A share from 0 to 1, e.g. ``0.1`` (an ``argparse`` type)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"'{text}' must be a share from 0 to 1, e.g. 0.1")
    return value


def floor_share(text: str) -> float:
    """A share above 0 up to 1, e.g. ``0.8`` (an ``argparse`` type)."""
    value = share(text)
    if value == 0.0:
        raise argparse.ArgumentTypeError(f"'{text}' must be a share above 0 up to 1, e.g. 0.8")
    return value


def scales(options: SwingOptions) -> list[JobScale]:
    """Each job size in phase and, with a spread, spread; in the order the tables print them."""
    spreads = (0.0, options.spread) if options.spread > 0 else (0.0,)
    return [
        JobScale(gpus, spread, SWING_ITERATIONS) for gpus in sorted(set(options.gpus)) for spread in spreads
    ]


def print_power_swing(
    console: Console, job_name: str, cases: Sequence[SwingCase], options: SwingOptions, model: str
) -> None:
    """Print the per-GPU and job tables, what they are, and draw the plot when asked.

    Args:
        console: Where to print.
        job_name: The job's name, for the titles.
        cases: Stock, the plan (when given) and the filler floor (:func:`~megatron_energy.sim.swing_cases
            .swing_cases`).
        options: Sizes, spread, floor and plot.
        model: What the figures are: ``modelled, GPU spec ...`` with the switch latency.

    Raises:
        EnergyValueError: A size that is not a whole number of replicas (nothing printed then).
    """
    rows = at_scales(cases, scales(options))
    console.print(per_gpu_table(job_name, cases))
    console.print(job_table(job_name, rows))
    console.print(swing_label(cases, options, model), markup=False)
    if options.plot is not None:
        largest = [row for row in rows if row[0].job.scale.gpus == max(options.gpus)]
        path = plot_power_swing(largest, options.plot, f"{job_name} ({model})")
        console.print(f"power swing plot written to {path} ({model})", markup=False)


def swing_label(cases: Sequence[SwingCase], options: SwingOptions, model: str) -> str:
    """What every figure of the tables is and how it was read."""
    low, high = GRID_BAND_HZ
    floor = next(case for case in cases if case.floor_w is not None)
    spread = (
        f", or started at offsets uniform over [0, {options.spread:g} x iteration) (seed 0)"
        if options.spread > 0
        else ""
    )
    return (
        f"power swing ({model}): read in {1e3 * DEFAULT_RESOLUTION_S:g} ms bins over {SWING_ITERATIONS} "
        f"iterations; band = the share of fluctuation energy in {low:g}-{high:g} Hz; per GPU = the mean of "
        f"one replica's {floor.gpus_per_replica} GPUs; the job's replicas in phase (worst case: the gradient "
        f"sync aligns them){spread}; filler floor: every GPU held at {options.floor_share:g} x the busiest "
        f"GPU's stock peak = {floor.floor_w:,.0f} W by filler work"
    )


def per_gpu_table(job_name: str, cases: Sequence[SwingCase]) -> Table:
    """One row per case: the figures of the replica's mean GPU (watts), energy per iteration against stock."""
    table = Table(title=f"{job_name}: power per GPU over {SWING_ITERATIONS} iterations (modelled, W)")
    for header in ("case", "iteration s", *_FIGURE_HEADERS, "J / iter", "filler J", "energy vs stock"):
        table.add_column(header, justify="left" if header == "case" else "right")
    stock_j = cases[0].replica.energy_j
    for case in cases:
        gpus = case.gpus_per_replica
        table.add_row(
            case.name,
            f"{case.iteration_s:.4f}",
            *_figure_cells(case.per_gpu(SWING_ITERATIONS), 1.0, "{:,.1f}"),
            f"{case.replica.energy_j / gpus:,.1f}",
            f"{case.filler_j / gpus:,.1f}",
            change_text(case.replica.energy_j / stock_j - 1),
        )
    return table


def job_table(job_name: str, rows: Sequence[Sequence[ScaledCase]]) -> Table:
    """One row per size, offsets and case: the whole job's figures (megawatts), energy per iteration."""
    table = Table(
        title=f"{job_name}: the whole job's power over {SWING_ITERATIONS} iterations (modelled, MW)"
    )
    for header in ("GPUs", "replicas", "offsets", "case", *_FIGURE_HEADERS, "MJ / iter", "filler MJ"):
        table.add_column(header, justify="left" if header in ("offsets", "case") else "right")
    for scale_rows in rows:
        for row in scale_rows:
            scale = row.job.scale
            offsets = "in phase" if scale.in_phase else f"spread {scale.spread:g}"
            table.add_row(
                f"{scale.gpus:,}",
                f"{row.job.replicas:,}",
                offsets,
                row.case.name,
                *_figure_cells(row.job.figures, _MW, "{:,.3f}"),
                f"{row.job.trace.energy_j / scale.iterations / _MW:,.3f}",
                f"{row.filler_j / _MW:,.3f}",
            )
        table.add_section()
    return table


_FIGURE_HEADERS = ("mean", "peak", "trough", "swing", "ramp up /s", "ramp down /s", "band", "band rms")


def _figure_cells(figures: SwingFigures, unit: float, form: str) -> list[str]:
    """The swing figures in ``unit`` (1 W or 1 MW), the band share in percent."""
    values = (
        figures.mean_w,
        figures.peak_w,
        figures.trough_w,
        figures.swing_w,
        figures.ramp_up_w_per_s,
        figures.ramp_down_w_per_s,
    )
    return [
        *(form.format(value / unit) for value in values),
        f"{100 * figures.band_share:.1f} %",
        form.format(figures.band_rms_w / unit),
    ]
