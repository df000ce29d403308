"""The one comparison table every report uses: stock clocks against a plan, time and energy."""

from __future__ import annotations

from rich.table import Table


def stock_vs_plan_table(
    title: str, time_s: tuple[float, float], energy_j: tuple[float, float], energy_label: str
) -> Table:
    """A table of iteration time and energy at stock clocks and under a plan, with the relative change.

    Args:
        title: The table's title (says what is modelled or measured, and on which GPU).
        time_s: Iteration time ``(stock, plan)``.
        energy_j: Energy per iteration ``(stock, plan)``.
        energy_label: Row label for the energy, e.g. ``"energy per iteration, all GPUs (modelled)"``.
    """
    table = Table(title=title)
    for column in ("", "stock clocks", "plan", "change"):
        table.add_column(column, justify="right")
    rows = (("iteration time (modelled)", time_s, 1e3, "ms"), (energy_label, energy_j, 1.0, "J"))
    for label, (stock, planned), scale, unit in rows:
        table.add_row(
            label,
            f"{scale * stock:.1f} {unit}",
            f"{scale * planned:.1f} {unit}",
            f"{100 * (planned / stock - 1):+.2f}%",
        )
    return table
