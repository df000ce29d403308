"""What the memory lever adds to each mode of a comparison (``simulate --compare``); every figure *modelled*.

One row per planned mode (``<mode>+memory``): the memory clock each stage's GPU runs at (the stock, top one
where the lever does not pay), and the mode's iteration and energy with the lever against the same mode
without it and against stock (``plan_outcome.energy_change``, as every saving is printed).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from megatron_energy.commands.optimiser_comparison import MODES, Comparison
from megatron_energy.plan_outcome import change_text, energy_change


def memory_lever_table(comparison: Comparison) -> Table:
    """One row per planned mode with the memory lever (module docstring)."""
    spec = comparison.spec
    table = Table(
        title=f"{comparison.job.name}: what the memory lever adds per mode (modelled; a memory clock per "
        f"stage for the run, of {spec.name}'s {', '.join(map(str, spec.memory_clocks_mhz))} MHz)"
    )
    for header in (
        "mode",
        "memory MHz per stage",
        "iteration s",
        "energy J",
        "time vs mode",
        "energy vs mode",
        "energy vs stock",
    ):
        table.add_column(header, justify="left" if header.startswith("m") else "right")
    stock = comparison.row("stock")
    for mode in MODES[1:]:
        without, row = comparison.row(mode), comparison.memory_row(mode)
        clocks = row.plan.memory_clocks_mhz or (spec.max_memory_clock_mhz,) * len(row.stage_energy_j)
        table.add_row(
            f"{mode}+memory",
            " ".join(map(str, clocks)),
            f"{row.iteration_time_s:.4f}",
            f"{row.total_energy_j:,.1f}",
            change_text(row.iteration_time_s / without.iteration_time_s - 1),
            change_text(energy_change(without.total_energy_j, row.total_energy_j)),
            change_text(energy_change(stock.total_energy_j, row.total_energy_j)),
        )
    return table


def print_memory_lever(console: Console, comparison: Comparison) -> None:
    """The memory lever's table, or why there is none (a GPU with one memory clock to try)."""
    if comparison.memory_rows:
        console.print(memory_lever_table(comparison))
        return
    spec = comparison.spec
    console.print(
        f"memory lever: {spec.name} offers no lower memory clock to try "
        f"({', '.join(map(str, spec.memory_clocks_mhz))} MHz), so every mode keeps the stock one",
        markup=False,
    )
