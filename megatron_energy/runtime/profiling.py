"""Phase 1: walk a grid of clocks, a few steps each, and turn the samples into a ``Profile``.

Each clock is held for one settling step (discarded: the switch and the thermal transient land there)
and ``steps_per_clock`` measured steps; the stock clock, first, for as many steps as the stock baseline
needs (``runtime.baseline_length``: a pilot, then possibly more, decided once by the session). Per
instruction class (``Work``: stage, chunk, kind) the instruction time is the mean over microbatches and
steps. Energy per instruction comes from the backend when it can attribute it (simulated GPUs); otherwise
the energy of the step's pipeline span (measured apart from what ran between the two schedules), less the
blocked and idle time at the spec's powers, is split over the instructions in proportion to their time.

What the pipeline span leaves out of an iteration (gradient sync, optimizer step, data loading, logging) is
kept per step as measured (``StepRecord.outside_s`` and ``outside_j``), and its mean over the stock steps is
the measured iteration tail the plan's predictions carry (``runtime.planning.tail_from_profiling``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from megatron_energy.pipeline.instruction import Work
from megatron_energy.runtime.step_figures import StepFigures
from megatron_energy.runtime.timing import StepTiming


@dataclass(frozen=True)
class ProfileRow:
    """One instruction class's mean at one clock, ready to merge across ranks."""

    work: Work
    clock_mhz: int
    time_s: float
    energy_j: float
    samples: int


@dataclass
class StepRecord:
    """Step-level figures at one clock (for the stock-clock baseline)."""

    clock_mhz: int
    """The clock the step ran at."""
    iteration_s: float
    """The whole iteration."""
    energy_j: float
    """This GPU's energy over the whole iteration."""
    outside_s: float = 0.0
    """The part of the iteration outside the replica's pipeline span."""
    outside_j: float = 0.0
    """This GPU's energy over that part."""


@dataclass
class ProfileCollector:
    """Accumulates instruction samples over the clock grid for one rank.

    Args:
        clocks_mhz: The grid, highest first; the first clock is the stock baseline.
        steps_per_clock: Measured steps per clock (after one settling step).
        blocked_power_w: Power while blocked on communication (for energy attribution on real GPUs).
        idle_power_w: Power while idle at the end of the step.
        stock_iters: Measured steps at the stock clock until :meth:`set_stock_steps` says otherwise.
    """

    clocks_mhz: Sequence[int]
    steps_per_clock: int
    blocked_power_w: float
    idle_power_w: float
    stock_iters: int = 0
    _step: int = 0
    _times: dict[tuple[Work, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    _energies: dict[tuple[Work, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    steps: list[StepRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stock_iters = self.stock_iters or self.steps_per_clock

    @property
    def steps_needed(self) -> int:
        """Steps the whole grid takes (the stock clock's as decided so far)."""
        return (self.stock_iters + 1) + (len(self.clocks_mhz) - 1) * (self.steps_per_clock + 1)

    @property
    def done(self) -> bool:
        """Whether every clock of the grid has been measured."""
        return self._step >= self.steps_needed

    @property
    def stock_measured(self) -> int:
        """Measured steps at the stock clock so far."""
        return min(max(0, self._step - 1), self.stock_iters)

    def set_stock_steps(self, count: int) -> None:
        """Measure ``count`` steps at the stock clock (while it is measured; no fewer than so far).

        Raises:
            ValueError: The stock clock's steps are over, or ``count`` is below the steps already measured.
        """
        if self._step > self.stock_iters + 1 or count < self.stock_measured:
            raise ValueError(f"cannot measure {count} stock steps after step {self._step} of the grid")
        self.stock_iters = count

    def clock_for_next_step(self) -> int:
        """The clock the next step runs at."""
        block = min(self._step, self.steps_needed - 1) - (self.stock_iters + 1)
        return self.clocks_mhz[0 if block < 0 else 1 + block // (self.steps_per_clock + 1)]

    def _settling(self) -> bool:
        """Whether the next step is the first at its clock (its figures are discarded)."""
        block = self._step - (self.stock_iters + 1)
        return self._step == 0 or (block >= 0 and block % (self.steps_per_clock + 1) == 0)

    def add_step(self, figures: StepFigures) -> None:
        """Record one finished step that ran at ``clock_for_next_step()``.

        Args:
            figures: The step's timing and energies on this rank.
        """
        clock = self.clock_for_next_step()
        settling = self._settling()
        self._step += 1
        timing = figures.timing
        if settling or not timing.samples:
            return
        outside_j = figures.outside_j if figures.outside_j is not None else 0.0
        self.steps.append(
            StepRecord(clock, figures.iteration_s, figures.energy_j, figures.outside_s, outside_j)
        )
        energies = self._attribute(timing, figures.pipeline_energy_j, timing.intrinsic_s)
        for sample, energy in zip(timing.samples, energies, strict=True):
            key = (sample.instruction.work, clock)
            self._times[key].append(sample.duration_s)
            self._energies[key].append(energy)

    def _attribute(self, timing: StepTiming, step_energy_j: float, iteration_s: float) -> list[float]:
        """Each sample's energy: the timer's, or the pipeline span's energy less its waits, split by time."""
        if all(sample.energy_j is not None for sample in timing.samples):
            return [float(sample.energy_j) for sample in timing.samples]  # type: ignore[arg-type]
        busy = sum(sample.duration_s for sample in timing.samples)
        last_end = max(sample.end_s for sample in timing.samples)
        waiting_j = self.blocked_power_w * max(0.0, last_end - busy)
        waiting_j += self.idle_power_w * max(0.0, iteration_s - last_end)
        busy_j = max(0.0, step_energy_j - waiting_j)
        return [busy_j * sample.duration_s / busy for sample in timing.samples]

    def rows(self) -> list[ProfileRow]:
        """Mean time and energy per instruction class and clock of this stage."""
        return [
            ProfileRow(
                work=work,
                clock_mhz=clock,
                time_s=sum(times) / len(times),
                energy_j=sum(self._energies[(work, clock)]) / len(times),
                samples=len(times),
            )
            for (work, clock), times in sorted(self._times.items())
        ]

    def stock_steps(self) -> list[StepRecord]:
        """The measured steps at the grid's first (stock) clock, in the order they ran."""
        return [record for record in self.steps if record.clock_mhz == self.clocks_mhz[0]]

    def stock_baseline(self) -> StepRecord | None:
        """Mean iteration time and energy at the grid's first (stock) clock."""
        stock = self.stock_steps()
        return mean_record(stock) if stock else None


def mean_record(records: Sequence[StepRecord]) -> StepRecord:
    """The mean figures of steps at one clock (the first record's)."""
    count = len(records)
    return StepRecord(
        clock_mhz=records[0].clock_mhz,
        iteration_s=sum(r.iteration_s for r in records) / count,
        energy_j=sum(r.energy_j for r in records) / count,
        outside_s=sum(r.outside_s for r in records) / count,
        outside_j=sum(r.outside_j for r in records) / count,
    )


def merge_rows(rows_per_rank: Sequence[Sequence[ProfileRow]]) -> dict[Work, dict[int, tuple[float, float]]]:
    """Merge the rows of every rank into per-instruction-class options.

    Ranks that run the same stage (tensor- and data-parallel peers) are merged as the pipeline sees them:
    the slowest peer's time (the stage waits for it) and the mean energy per GPU.

    Args:
        rows_per_rank: Each rank's ``ProfileCollector.rows()``.

    Returns:
        ``{Work: {clock_mhz: (time_s, energy_j)}}``.
    """
    times: dict[tuple[Work, int], list[float]] = defaultdict(list)
    energies: dict[tuple[Work, int], list[float]] = defaultdict(list)
    for rows in rows_per_rank:
        for row in rows:
            key = (row.work, row.clock_mhz)
            times[key].append(row.time_s)
            energies[key].append(row.energy_j)
    merged: dict[Work, dict[int, tuple[float, float]]] = defaultdict(dict)
    for (row_key, clock), values in times.items():
        merged[row_key][clock] = (max(values), sum(energies[(row_key, clock)]) / len(values))
    return dict(merged)
