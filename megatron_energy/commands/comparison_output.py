"""Tables of a Perseus / Kareus / both comparison (``simulate --compare``); every figure is *modelled*."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from megatron_energy.commands.optimiser_comparison import MODES, Comparison
from megatron_energy.dvfs.model import GpuPowerModel
from megatron_energy.sim.overlap import PHASES


def comparison_label(comparison: Comparison) -> str:
    """What every figure of the comparison is: modelled, with the models' parameters."""
    spec = comparison.spec
    return (
        f"modelled: {GpuPowerModel(spec).describe()}; {comparison.model.simulator.contention.describe()}; "
        "instant clock switches; static = idle power x iteration time per GPU, dynamic = the rest"
    )


def modes_table(comparison: Comparison) -> Table:
    """One row per mode: iteration time, energy, static/dynamic split, changes against stock and Perseus."""
    job = comparison.job
    per_pipeline = job.pipelines
    table = Table(
        title=f"{job.name}: one iteration per mode (modelled; one pipeline = {job.pipeline_stages} GPUs)"
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
    stock = comparison.row("stock").result
    perseus = comparison.row("perseus").result
    for mode in MODES:
        row = comparison.row(mode)
        result = row.result
        table.add_row(
            mode,
            f"{row.deadline_s:.4f}",
            f"{result.iteration_time_s:.4f}",
            f"{result.total_energy_j:,.1f}",
            f"{result.static_j:,.1f}",
            f"{result.dynamic_j:,.1f}",
            f"{result.total_energy_j * per_pipeline / 1e3:,.2f}",
            f"{result.iteration_time_s / stock.iteration_time_s - 1:+.2%}",
            f"{result.total_energy_j / stock.total_energy_j - 1:+.2%}",
            f"{result.total_energy_j / perseus.total_energy_j - 1:+.2%}",
        )
    return table


def stage_split_table(comparison: Comparison, modes: tuple[str, ...] = ("perseus", "all")) -> Table:
    """Static and dynamic energy per GPU (stage) for ``modes``."""
    table = Table(title="static / dynamic energy per stage GPU (modelled, J)")
    table.add_column("stage", justify="right")
    for mode in modes:
        table.add_column(f"{mode} static", justify="right")
        table.add_column(f"{mode} dynamic", justify="right")
    stages = len(comparison.row(modes[0]).result.stages)
    for stage in range(stages):
        cells = []
        for mode in modes:
            energy = comparison.row(mode).result.stages[stage]
            cells += [f"{energy.static_j:,.1f}", f"{energy.dynamic_j:,.1f}"]
        table.add_row(str(stage), *cells)
    return table


def phase_table(comparison: Comparison) -> Table:
    """Time and dynamic energy per phase, summed over the pipeline's GPUs, for every mode."""
    table = Table(title="per phase, summed over stage GPUs (modelled): seconds / dynamic J")
    table.add_column("mode")
    for phase in PHASES:
        table.add_column(phase, justify="right")
    for mode in MODES:
        stages = comparison.row(mode).result.stages
        cells = []
        for phase in PHASES:
            time_s = sum(stage.phase(phase).time_s for stage in stages)
            dynamic_j = sum(stage.phase(phase).dynamic_j for stage in stages)
            cells.append(f"{time_s:.3f} / {dynamic_j:,.0f}")
        table.add_row(mode, *cells)
    return table


def choices_lines(comparison: Comparison, mode: str = "all") -> list[str]:
    """The collective choices of ``mode`` that differ from megatron-core's defaults, one line per class."""
    row = comparison.row(mode)
    defaults = comparison.model.choices_default()
    lines = []
    for (stage, key), choice in sorted(row.choices.items()):
        if choice == defaults.get((stage, key)):
            continue
        ctas = "NCCL default" if choice.max_ctas is None else f"{choice.max_ctas}"
        lines.append(
            f"  stage {stage} {key}: CTAs {ctas}, launch choice {choice.launch}, clock offset "
            f"{choice.clock_steps:+d} step(s)"
        )
    return lines or ["  (megatron-core's defaults everywhere)"]


def all_vs_perseus_line(comparison: Comparison) -> str:
    """``all`` against Perseus alone at iso-time: energy change and where it comes from (static, dynamic)."""
    perseus, both = comparison.row("perseus").result, comparison.row("all").result
    return (
        f"all vs perseus at iso-time: energy {both.total_energy_j / perseus.total_energy_j - 1:+.2%} "
        f"(static {both.static_j - perseus.static_j:+,.1f} J, "
        f"dynamic {both.dynamic_j - perseus.dynamic_j:+,.1f} J per pipeline), "
        f"time {both.iteration_time_s:.4f} s vs {perseus.iteration_time_s:.4f} s "
        f"({comparison_label(comparison)})"
    )


def print_comparison(console: Console, comparison: Comparison) -> None:
    """Every table and line of a comparison: modes, static/dynamic split per stage and phase, choices."""
    console.print(modes_table(comparison))
    console.print(stage_split_table(comparison))
    console.print(phase_table(comparison))
    console.print("collective choices of all (differences from megatron-core's defaults):")
    for line in choices_lines(comparison):
        console.print(line)
    console.print(all_vs_perseus_line(comparison))
