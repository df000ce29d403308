"""Phase 1: walk a grid of clocks, a few steps each, and turn the samples into a ``Profile``.

Each clock is held for one settling step (discarded: the switch and the thermal transient land there)
and ``steps_per_clock`` measured steps. The stock clock comes first and its steps are of two kinds, in
this order (:meth:`ProfileCollector.begin_step` says which kind each step is):

1. **Baseline steps**, in the run phase's timing mode: lagged, no device synchronisation at the step's
   begin or end (``runtime.cuda_timer``), one energy-counter lap per step covering the whole iteration.
   They are the stock baseline every measured change is compared with (``runtime.planning_round.planning.
   baseline_from_profiling``), so baseline and planned windows are measured the same way: a per-step sync
   leaves GPU bubbles (+1.4 % iteration time measured on an H200), which a baseline measured with syncs
   against windows measured without would print as a saving. As many as the baseline needs
   (``runtime.profiling.baseline_length``: a pilot, then possibly more, decided once by the session).
2. **Synchronous profile steps** (``steps_per_clock`` of them), like every measured step at the other
   clocks: the device is synchronised at the step's begin and end, so the counter laps separate the pipeline
   span's energy from the rest of the iteration. They alone give the profile rows and the measured
   iteration tail, which stay exact; they are never part of the comparison baseline.

With a kernel-timeline recorder (``record_kernels``: the phase planner's measured timelines on CUDA), each
clock's block ends with one more synchronous step, a **recorded step**, run under ``torch.profiler``. The
profiler's work on every launch makes that step slower than the others, so its figures feed the kernel
timeline only: never the profile rows, the measured tail or the stock baseline.

Per instruction class (``Work``: stage, chunk, kind) the instruction time is the mean over microbatches and
steps (device events are exact in both kinds). Energy per instruction comes from the backend when it can
attribute it (simulated GPUs); otherwise the energy of the step's pipeline span, less the blocked and idle
time at the spec's powers, is split over the instructions in proportion to their time. A synchronous step
measured its pipeline span's energy apart from what ran between the two schedules; a baseline step's is its
whole iteration's less the mean of that outside part over the synchronous steps at the same clock, so the
stock rows average every stock step (:meth:`ProfileCollector.rows`).

What the pipeline span leaves out of an iteration (gradient sync, optimizer step, data loading, logging) is
kept per synchronous step as measured (``StepRecord.outside_s`` and ``outside_j``), and its mean over the
stock clock's synchronous steps is the measured iteration tail the plan's predictions carry
(``runtime.planning_round.planning.tail_from_profiling``). The outside phases' own durations (gradient sync,
optimizer step, parameter all-gather, from their hooks) are read at the next synchronous step's start and
kept with the step they followed (``StepRecord.outside_phases``), for the phase planner's tail.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

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


@dataclass(frozen=True)
class PlannedStep:
    """What one profiling step is: its clock and its kind (see the module docstring)."""

    clock_mhz: int
    """The clock the step runs at."""
    kind: Literal["settling", "baseline", "profile", "recorded"]
    """``settling`` (discarded), ``baseline`` (lagged, no sync), ``profile`` (synchronous) or ``recorded``
    (synchronous, under the kernel-timeline recorder; discarded here)."""

    @property
    def synchronised(self) -> bool:
        """Whether the device is synchronised at the step's begin and end (every kind but ``baseline``)."""
        return self.kind != "baseline"


@dataclass
class StepRecord:
    """Step-level figures at one clock (for the stock-clock baseline and the measured tail)."""

    clock_mhz: int
    """The clock the step ran at."""
    iteration_s: float
    """The whole iteration."""
    energy_j: float
    """This GPU's energy over the whole iteration."""
    outside_s: float = 0.0
    """The part of the iteration outside the replica's pipeline span."""
    outside_j: float = 0.0
    """This GPU's energy over that part (0 when not measured apart: a baseline step)."""
    synchronised: bool = True
    """``True``: a synchronous profile step (exact outside split); ``False``: a baseline step, timed as the
    run phase times its steps (lagged, no sync), the kind the comparison baseline is made of."""
    outside_phases: tuple[tuple[str, float], ...] = ()
    """Measured durations of the outside phases after this step (``events.OUTSIDE_PHASES`` names), in the
    order they ran; empty when not measured (a step not followed by a synchronous one, or no hooks)."""


def baseline_records(records: Sequence[StepRecord]) -> list[StepRecord]:
    """The steps measured in the run phase's timing mode: the comparison baseline, in the order they ran."""
    return [record for record in records if not record.synchronised]


def synchronised_records(records: Sequence[StepRecord]) -> list[StepRecord]:
    """The synchronous steps: the ones whose energy outside the pipeline span was measured apart."""
    return [record for record in records if record.synchronised]


@dataclass
class ProfileCollector:
    """Accumulates instruction samples over the clock grid for one rank.

    Steps are numbered as they begin (:meth:`begin_step`) and recorded in the same order as their figures
    come (:meth:`add_step`), which under the lagged timer is one step later.

    Args:
        clocks_mhz: The grid, highest first; the first clock is the stock baseline.
        steps_per_clock: Measured synchronous steps per clock (after one settling step; at least 1).
        blocked_power_w: Power while blocked on communication (for energy attribution on real GPUs).
        idle_power_w: Power while idle at the end of the step.
        stock_iters: Baseline steps at the stock clock until :meth:`set_stock_steps` says otherwise.
        record_kernels: End each clock's block with a recorded step (module docstring).
    """

    clocks_mhz: Sequence[int]
    steps_per_clock: int
    blocked_power_w: float
    idle_power_w: float
    stock_iters: int = 0
    record_kernels: bool = False
    _begun: int = 0
    _added: int = 0
    _times: dict[tuple[Work, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    _energies: dict[tuple[Work, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    steps: list[StepRecord] = field(default_factory=list)
    _unsplit: list[tuple[int, StepTiming, float]] = field(default_factory=list)
    """Baseline steps' timings and whole-iteration energies, split over instructions in :meth:`rows`."""

    def __post_init__(self) -> None:
        self.steps_per_clock = max(1, self.steps_per_clock)
        self.stock_iters = self.stock_iters or self.steps_per_clock

    @property
    def steps_needed(self) -> int:
        """Steps the whole grid takes (the stock clock's baseline as decided so far)."""
        return 1 + self.stock_iters + self._block_steps * len(self.clocks_mhz) - 1

    @property
    def _block_steps(self) -> int:
        """Steps of one clock's block after its baseline: settling, profile steps, the recorded step."""
        return 1 + self.steps_per_clock + int(self.record_kernels)

    @property
    def done(self) -> bool:
        """Whether every step of the grid has been recorded."""
        return self._added >= self.steps_needed

    def clocks_complete_after(self, steps: int) -> list[int]:
        """The clocks whose block's profile steps are all recorded once ``steps`` steps are, in grid order.

        A block completes with its last synchronous profile step (its recorded step, if any, feeds no row);
        the stock clock's comes after its baseline steps as decided so far.
        """
        ends = (
            self.stock_iters + block * self._block_steps + self.steps_per_clock + 1
            for block in range(len(self.clocks_mhz))
        )
        return [clock for clock, end in zip(self.clocks_mhz, ends, strict=True) if steps >= end]

    def completed_rows(self) -> list[ProfileRow]:
        """:meth:`rows` of the clocks whose block is complete (all of them once the grid is :attr:`done`)."""
        complete = set(self.clocks_complete_after(self._added))
        return [row for row in self.rows() if row.clock_mhz in complete]

    @property
    def stock_measured(self) -> int:
        """Baseline steps recorded so far."""
        return min(max(0, self._added - 1), self.stock_iters)

    @property
    def stock_begun(self) -> int:
        """Baseline steps begun so far (recorded or not)."""
        return min(max(0, max(self._begun, self._added) - 1), self.stock_iters)

    def set_stock_steps(self, count: int) -> None:
        """Measure ``count`` baseline steps (while they are measured; no fewer than begun so far).

        Raises:
            ValueError: The baseline steps are over, or ``count`` is below the baseline steps already begun.
        """
        if max(self._begun, self._added) > self.stock_iters + 1 or count < self.stock_begun:
            raise ValueError(f"cannot measure {count} stock steps after step {self._begun} of the grid")
        self.stock_iters = count

    def planned(self, index: int) -> PlannedStep:
        """The clock and kind of the step numbered ``index`` (the last step's once the grid is done)."""
        index = min(index, self.steps_needed - 1)
        if index == 0:
            return PlannedStep(self.clocks_mhz[0], "settling")
        if index <= self.stock_iters:
            return PlannedStep(self.clocks_mhz[0], "baseline")
        # the stock block's settling step is the grid's first, before the baseline: its block resumes after it
        block, within = divmod(index - self.stock_iters, self._block_steps)
        clock = self.clocks_mhz[block]
        if within == 0:
            return PlannedStep(clock, "settling")
        return PlannedStep(clock, "profile" if within <= self.steps_per_clock else "recorded")

    def begin_step(self) -> PlannedStep:
        """The next step begins: what it is (its clock, and whether it is synchronised)."""
        planned = self.planned(self._begun)
        self._begun += 1
        return planned

    def clock_for_next_step(self) -> int:
        """The clock of the next step to be recorded."""
        return self.planned(self._added).clock_mhz

    def add_step(self, figures: StepFigures) -> None:
        """Record the oldest step not recorded yet, which ran as :meth:`planned` said.

        Args:
            figures: The step's timing and energies on this rank.
        """
        planned = self.planned(self._added)
        self._added += 1
        timing = figures.timing
        if planned.kind in ("settling", "recorded") or not timing.samples:
            return
        synchronised = planned.synchronised
        outside_j = figures.outside_j if figures.outside_j is not None and synchronised else 0.0
        outside_s = figures.outside_s if synchronised else 0.0
        self.steps.append(
            StepRecord(
                planned.clock_mhz, figures.iteration_s, figures.energy_j, outside_s, outside_j, synchronised
            )
        )
        if not synchronised:
            self._unsplit.append((planned.clock_mhz, timing, figures.energy_j))
            return
        self._add_samples(planned.clock_mhz, timing, figures.pipeline_energy_j)

    def add_outside_phases(self, durations: dict[str, float]) -> None:
        """The outside phases measured after the last step, read at the start of the step just begun.

        They join the last step's record when every begun step before this one is recorded and the last
        was a synchronous profile step (the clock in effect over them was that step's).
        """
        if not durations or self._added != self._begun - 1 or not self.steps or self._added == 0:
            return
        if self.planned(self._added - 1).kind != "profile":
            return
        self.steps[-1].outside_phases = tuple(durations.items())

    def _add_samples(self, clock_mhz: int, timing: StepTiming, pipeline_energy_j: float) -> None:
        """Add one step's instruction samples with their energies (the pipeline span's, split)."""
        energies = self._attribute(timing, pipeline_energy_j, timing.intrinsic_s)
        for sample, energy in zip(timing.samples, energies, strict=True):
            key = (sample.instruction.work, clock_mhz)
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
        """Mean time and energy per instruction class and clock of this stage.

        The baseline steps count too: their instruction times are exact (device events) and their pipeline
        span's energy is the whole iteration's less the mean energy the synchronous steps at the same clock
        measured between two schedules (the only steps that measured it apart); without such steps they
        are left out.
        """
        times, energies = self._times, self._energies
        if self._unsplit:
            times = defaultdict(list, {key: list(values) for key, values in self._times.items()})
            energies = defaultdict(list, {key: list(values) for key, values in self._energies.items()})
            outside = {clock: synchronised_records(self.steps_at(clock)) for clock, _, _ in self._unsplit}
            for clock, timing, energy_j in self._unsplit:
                if outside[clock]:
                    outside_j = mean_record(outside[clock]).outside_j
                    split = self._attribute(timing, energy_j - outside_j, timing.intrinsic_s)
                    for sample, energy in zip(timing.samples, split, strict=True):
                        times[(sample.instruction.work, clock)].append(sample.duration_s)
                        energies[(sample.instruction.work, clock)].append(energy)
        return [
            ProfileRow(
                work=work,
                clock_mhz=clock,
                time_s=sum(values) / len(values),
                energy_j=sum(energies[(work, clock)]) / len(values),
                samples=len(values),
            )
            for (work, clock), values in sorted(times.items())
        ]

    def steps_at(self, clock_mhz: int) -> list[StepRecord]:
        """The measured steps at ``clock_mhz``, both kinds, in the order they ran."""
        return [record for record in self.steps if record.clock_mhz == clock_mhz]

    def stock_steps(self) -> list[StepRecord]:
        """The measured steps at the grid's first (stock) clock, both kinds, in the order they ran."""
        return self.steps_at(self.clocks_mhz[0])

    def baseline_steps(self) -> list[StepRecord]:
        """The stock clock's baseline steps (run-phase timing mode), in the order they ran."""
        return baseline_records(self.stock_steps())

    def stock_baseline(self) -> StepRecord | None:
        """Mean iteration time and energy of the baseline steps."""
        stock = self.baseline_steps()
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
