"""The iterations an energy log line speaks for, never mixing phases, and their comparison with stock clocks.

Each rank keeps, for the phase it runs in (``profiling``, ``planned``, ``following straggler``, ``stock
(safety net)``, ...), two sets of its steps, both emptied when the phase changes:

* the **interval**: the steps since the last log line, whose means the line prints per stage;
* the **window**: the phase's steps after its first (which settles from the clocks in effect before it),
  the most recent ``WINDOW_ITERS`` of them, whose per-iteration figures are compared with the stock
  baseline's (``stats.relative_change``).

The ranks' windows are aligned on the steps every rank ran in its current phase, with energies summed over
ranks and the slowest rank's time per iteration, as the stock baseline does
(``runtime.energy_log.log_aggregate``: one slot per iteration in fixed-size reductions). Before a
comparison, per-iteration figures read from an energy counter are grouped into samples spanning at least
two counter periods (``stats.iterations_per_sample``, ``stats.block_means``); the interval includes the drift
the stock baseline shows between its halves (``stats.baseline_drift``), as everywhere a change is stated.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from megatron_energy.runtime.step_figures import StepFigures
from megatron_energy.stats import RelativeChange, Source, block_means, iterations_per_sample, relative_change

WINDOW_ITERS = 50
"""Most iterations in a window: enough to resolve a 1 % change at a few percent of noise per iteration, few
enough to follow what changes within a phase (a throttled GPU, drift)."""


@dataclass(frozen=True)
class RankWindow:
    """One rank's window, as its log vectors carry it (``runtime.energy_log.log_aggregate``)."""

    first_step: int
    """The step of the window's first iteration (0-based)."""
    energy_j: tuple[float, ...] = ()
    """This rank's GPU energy per iteration."""
    iteration_s: tuple[float, ...] = ()
    """Iteration time per iteration."""


@dataclass
class PhaseWindow:
    """One rank's interval and window of the current phase (see the module docstring)."""

    phase: str | None = None
    interval: list[StepFigures] = field(default_factory=list)
    window: deque[tuple[int, StepFigures]] = field(default_factory=lambda: deque(maxlen=WINDOW_ITERS))
    _settled: bool = False

    def add(self, step: int, phase: str, figures: StepFigures) -> None:
        """Record a finished step and the phase it ran in."""
        if phase != self.phase:
            self.phase, self._settled = phase, False
            self.interval.clear()
            self.window.clear()
        self.interval.append(figures)
        if self._settled:
            self.window.append((step, figures))
        self._settled = True

    def take_interval(self) -> list[StepFigures]:
        """The interval's steps; the next interval starts empty."""
        steps, self.interval = self.interval, []
        return steps

    def rank_window(self) -> RankWindow:
        """The window, as the log vectors carry it."""
        if not self.window:
            return RankWindow(first_step=-1)
        return RankWindow(
            self.window[0][0],
            tuple(figures.energy_j for _, figures in self.window),
            tuple(figures.iteration_s for _, figures in self.window),
        )


def compare_to_stock(
    stock: Sequence[float], window: Sequence[float], iterations_per_block: int, source: Source
) -> RelativeChange | None:
    """The window's change against the stock samples, both grouped in blocks; ``None`` if either is empty.

    Args:
        stock: Per-iteration stock figures (the baseline's steps).
        window: Per-iteration figures of the window.
        iterations_per_block: Consecutive iterations per sample (``stats.iterations_per_sample``).
        source: ``measured`` or ``modelled``.
    """
    stock_blocks = block_means(stock, iterations_per_block)
    window_blocks = block_means(window, iterations_per_block)
    if not stock_blocks or not window_blocks:
        return None
    return relative_change(stock_blocks, window_blocks, source=source)


def block_size(stock_iteration_s: Sequence[float], counter_period_s: float) -> int:
    """Iterations per sample for a counter of ``counter_period_s`` (0: exact energies) at the stock pace."""
    if not stock_iteration_s or counter_period_s <= 0:
        return 1
    return iterations_per_sample(sum(stock_iteration_s) / len(stock_iteration_s), counter_period_s)
