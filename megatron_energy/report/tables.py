"""The one comparison table every report uses: stock clocks against a plan, row by row, with the change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table

from megatron_energy.plan_outcome import change_text, energy_change


@dataclass(frozen=True)
class ComparisonRow:
    """One figure at stock clocks and under a plan."""

    label: str
    """What the figure is and where it comes from, e.g. ``"iteration time (modelled)"``."""

    stock: float
    """The figure at stock clocks, in base units (seconds, joules)."""

    planned: float
    """The figure under the plan."""

    unit: str
    """``"ms"`` (the figures are seconds, shown in milliseconds) or ``"J"``."""

    change: str | None = None
    """The relative change as text; when ``None``, ``planned / stock - 1``
    (:func:`~megatron_energy.plan_outcome.energy_change`) as ``change_text`` prints it."""

    def cells(self) -> tuple[str, str, str, str]:
        """The row's four cells."""
        scale = 1e3 if self.unit == "ms" else 1.0
        change = self.change or change_text(energy_change(self.stock, self.planned))
        return (
            self.label,
            f"{scale * self.stock:.1f} {self.unit}",
            f"{scale * self.planned:.1f} {self.unit}",
            change,
        )


def comparison_table(title: str, rows: Sequence[ComparisonRow]) -> Table:
    """A table of figures at stock clocks and under a plan, with the relative change.

    Args:
        title: The table's title (says what is modelled or measured, and on which GPU).
        rows: The figures.
    """
    table = Table(title=title)
    table.add_column("", justify="left")
    for column in ("stock clocks", "plan", "change"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row.cells())
    return table
