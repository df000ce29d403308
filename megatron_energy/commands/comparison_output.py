"""Tables of a Perseus / Kareus / all comparison (``simulate --compare``, the demo); every figure *modelled*.

Each row is a mode's plan file's prediction (``commands.optimiser_comparison``); its change against stock is
the one saving every output prints (``plan_outcome.energy_change``, as ``change_text`` writes it).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from megatron_energy.commands.memory_lever_output import print_memory_lever
from megatron_energy.commands.optimiser_comparison import MODES, Comparison, ModeResult
from megatron_energy.dvfs.model import GpuPowerModel
from megatron_energy.plan_outcome import banded_text, change_text, energy_change


def comparison_label(comparison: Comparison) -> str:
    """What every figure of the comparison is: modelled, with the model's parameters and switch latency."""
    return (
        f"modelled: {GpuPowerModel(comparison.spec).describe()}; each mode's plan file's prediction, "
        f"executable under {1e3 * comparison.switch_latency_s:g} ms clock switches; "
        "static = idle power x iteration time per GPU, dynamic = the rest"
    )


def modes_table(comparison: Comparison) -> Table:
    """One row per mode: deadline, iteration time, energy, static/dynamic split, changes against stock."""
    job = comparison.job
    per_pipeline = job.pipelines
    table = Table(
        title=f"{job.name}: one iteration per mode, as its plan file predicts it (modelled; "
        f"one pipeline = {job.pipeline_stages} GPUs)"
    )
    for header in (
        "mode",
        "deadline s",
        "iteration s",
        "energy J",
        "static J",
        "dynamic J",
        "job kJ",
        "time vs stock",
        "energy vs stock",
        "energy vs perseus",
    ):
        table.add_column(header, justify="left" if header == "mode" else "right")
    exchanges = comparison.row("stock").all_to_all is not None
    if exchanges:
        table.add_column("all-to-all (share)", justify="right")
    stock = comparison.row("stock")
    perseus = comparison.row("perseus")
    for mode in MODES:
        row = comparison.row(mode)
        share = [row.all_to_all.text() if row.all_to_all is not None else "-"] if exchanges else []
        table.add_row(
            mode,
            f"{row.deadline_s:.4f}",
            f"{row.iteration_time_s:.4f}",
            f"{row.total_energy_j:,.1f}",
            f"{row.static_j:,.1f}",
            f"{row.dynamic_j:,.1f}",
            f"{row.total_energy_j * per_pipeline / 1e3:,.2f}",
            change_text(row.iteration_time_s / stock.iteration_time_s - 1),
            _versus_stock(stock.total_energy_j, row),
            _versus_perseus(perseus.total_energy_j, row),
            *share,
        )
    return table


def _versus_stock(stock_j: float, row: ModeResult) -> str:
    """A mode's energy change against stock clocks with its plan's band; the stock row's alone."""
    change = energy_change(stock_j, row.total_energy_j)
    return change_text(change) if row.mode == "stock" else banded_text(change, row.plan.saving_band)


def _versus_perseus(perseus_j: float, row: ModeResult) -> str:
    """A mode's energy change against Perseus alone with its band; the Perseus row's alone."""
    change = energy_change(perseus_j, row.total_energy_j)
    return change_text(change) if row.mode == "perseus" else banded_text(change, row.versus_perseus)


def all_to_all_line(comparison: Comparison) -> str | None:
    """What the all-to-all column is (``None`` on a job without an expert all-to-all)."""
    if comparison.row("stock").all_to_all is None:
        return None
    return (
        "all-to-all (share): the expert-parallel all-to-all (ep.all_to_all: MoE dispatch and combine, "
        "forward and backward) per iteration on the busiest stage at the CTA budget each mode's plan gives "
        "it, and its part of that mode's iteration (modelled: Kareus's contention model; on the critical "
        "path, not overlapped)"
    )


def stage_split_table(comparison: Comparison, modes: tuple[str, ...] = ("perseus", "all")) -> Table:
    """Static and dynamic energy per GPU (stage) for ``modes``."""
    table = Table(title="static / dynamic energy per stage GPU (modelled, J)")
    table.add_column("stage", justify="right")
    for mode in modes:
        table.add_column(f"{mode} static", justify="right")
        table.add_column(f"{mode} dynamic", justify="right")
    stages = len(comparison.row(modes[0]).stage_energy_j)
    for stage in range(stages):
        cells = []
        for mode in modes:
            row = comparison.row(mode)
            static_j = row.stage_static_j(stage)
            cells += [f"{static_j:,.1f}", f"{row.stage_energy_j[stage] - static_j:,.1f}"]
        table.add_row(str(stage), *cells)
    return table


def all_vs_perseus_line(comparison: Comparison) -> str:
    """``all`` against Perseus alone: energy change and where it comes from (static, dynamic)."""
    perseus, both = comparison.row("perseus"), comparison.row("all")
    return (
        f"all vs perseus: energy {_versus_perseus(perseus.total_energy_j, both)} "
        f"(static {both.static_j - perseus.static_j:+,.1f} J, "
        f"dynamic {both.dynamic_j - perseus.dynamic_j:+,.1f} J per pipeline), "
        f"time {both.iteration_time_s:.4f} s vs {perseus.iteration_time_s:.4f} s "
        f"({comparison_label(comparison)})"
    )


def print_comparison(console: Console, comparison: Comparison) -> None:
    """Every table and line of a comparison: modes, static/dynamic split per stage, what ``all`` kept."""
    console.print(modes_table(comparison))
    exchanges = all_to_all_line(comparison)
    if exchanges is not None:
        console.print(exchanges, markup=False)
    console.print(stage_split_table(comparison))
    for note in comparison.row("all").plan.notes:  # what `all` left out, or which part alone it is
        console.print(f"all: {note}", markup=False)
    console.print(all_vs_perseus_line(comparison), markup=False)
    print_memory_lever(console, comparison)
