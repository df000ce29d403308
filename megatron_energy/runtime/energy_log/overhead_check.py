"""The in-process overhead check (``--energy-overhead-check N``): the session suspended vs active, paired.

**What it measures: the training-thread hooks' cost**, session active vs suspended in one process. The
plugin's background threads (the energy meter, the frequency controller, the phase switcher) keep running in
the suspended blocks too, and so would a profiler left running, so what they cost (host time, the GIL, the
GPU's queue) is on both sides and not in the change. ``lab/bench_overhead.py`` measures the plugin
against Megatron itself (the same job in separate processes, the plugin loaded or not), which includes them.

Comparing a run with the plugin against a separate run without it mixes the plugin's cost with what differs
from one process to the next (allocator state, cuBLAS choices, GPU temperature): on one H200 those moved an
iteration by several per cent, more than the overhead to resolve. The check compares inside one process.
Once the plan runs (the session's phase is neither ``profiling`` nor ``stock (planning)``) and one more
block of ``N`` active iterations has settled it, iterations go in blocks of ``N``, in pairs whose order
alternates (suspended then active, active then suspended, ...), so that a drift over the run weighs on both
sides alike:

- **suspended**: the session is told to stand aside (:meth:`EnergySession.suspend`: clocks back to stock,
  the step its timer holds read out) and no schedule event reaches it; the hooks themselves still fire and
  return at once (a Python call and a branch each, about 70 per step of a 16-microbatch job: well under
  0.01 % of an iteration);
- **active**: the session runs as always (:meth:`EnergySession.resume` first: its energy lap restarts, so
  the suspended iterations are not counted as its own).

The first iteration of every block is left out (it pays the switch: the held step's read-out, the clock
request); a block's figure is the mean over its other ``N - 1`` iterations of the wall time (``perf_counter``
from one step's start to the next's) and, on GPUs with a measured energy counter, of the energy (the session's
meter, in a window of its own). The change is stated twice over the pairs' ratios
``active / suspended - 1``, both *measured*: their median with its distribution-free (sign-test) 95 %
interval (:func:`megatron_energy.stats.paired_median_change`), and their mean with its Student-t interval
(:func:`megatron_energy.stats.paired_relative_change`). The median comes first because shared
GPU machines are disturbed from outside: on an H200 dry run, iterations of both kinds of block rose by 3-25 %
for several iterations at a time (from outside the job, in both kinds of block alike), so a few pairs set
the mean's interval (±1.2 % over 21 pairs) while most pairs agreed within a fraction of a per cent. The mean
is kept beside it, since an overhead the plugin paid only in some iterations would show there, not in the
median. On such a machine short blocks (``N = 2``) pair iterations seconds apart, where a disturbance hits
both sides of most pairs. In a dry run (or
wherever clocks are not set) the clocks are the same in both blocks, so the change is the hooks' cost; with
clocks applied it is the plan's effect, that cost included. On simulated GPUs only the session
drives the simulated device, so only the time is compared (the host's own cost of the plugin on that machine).

The session's listener writes each rank's pairs to ``--energy-dir`` (``energy_dir.overhead_pairs_path``) when
the run ends; runs of one job and one version of the code can then be pooled (:func:`pooled`,
``lab/bench_overhead.py --pool``), since a pair is compared only with itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from megatron_energy.dvfs.meter import EnergyWindow
from megatron_energy.runtime.session_phase import SessionPhase
from megatron_energy.stats import RelativeChange, paired_median_change, paired_relative_change

WINDOW = "overhead-check"
"""The name of the check's energy window on the session's meter (apart from the session's own laps)."""


class Suspendable(Protocol):
    """What the check needs of the session (``runtime.session.EnergySession``)."""

    phase: str

    def suspend(self) -> None:
        """Stand aside from the next step on."""
        ...

    def resume(self) -> None:
        """Take part again from the next step on."""
        ...

    def energy_window(self) -> Future[EnergyWindow | None]:
        """The energy since the previous call (its own window on the meter), read off the training thread."""
        ...


@dataclass
class _Block:
    suspended: bool
    times_s: list[float] = field(default_factory=list)
    energies: list[Future[EnergyWindow | None]] = field(default_factory=list)

    def energies_j(self) -> list[float]:
        """The energies of the windows read (a window the counter could not give is left out)."""
        windows = [window.result() for window in self.energies]
        return [window.energy_j for window in windows if window is not None]


Pair = tuple[float, float]
"""One pair of blocks' figures: ``(suspended, active)``, each the mean over its block's kept iterations."""


@dataclass(frozen=True)
class OverheadResult:
    """The check's pairs and the changes they give (all *measured*).

    The pairs are kept, not only their statistics, so that runs of the same job and code can be pooled
    (:func:`pooled`): on a shared GPU one run's interval may be too wide to resolve a small overhead.
    """

    block_steps: int
    """Iterations per block (the first of each left out)."""
    time_pairs_s: tuple[Pair, ...]
    """Mean iteration time of each pair's suspended and active block."""
    energy_pairs_j: tuple[Pair, ...] | None
    """Mean energy per iteration of each pair's blocks; ``None`` where the counter is not measured."""

    @property
    def pairs(self) -> int:
        """Complete (suspended, active) block pairs."""
        return len(self.time_pairs_s)

    @property
    def time(self) -> RelativeChange:
        """Mean change of the iteration time, active over suspended."""
        return paired_relative_change(*_sides(self.time_pairs_s))

    @property
    def time_median(self) -> RelativeChange:
        """Median change of the iteration time over the pairs."""
        return paired_median_change(*_sides(self.time_pairs_s))

    @property
    def energy(self) -> RelativeChange | None:
        """Mean change of the energy per iteration; ``None`` where the counter is not measured."""
        return None if self.energy_pairs_j is None else paired_relative_change(*_sides(self.energy_pairs_j))

    @property
    def energy_median(self) -> RelativeChange | None:
        """Median change of the energy per iteration; ``None`` where the counter is not measured."""
        return None if self.energy_pairs_j is None else paired_median_change(*_sides(self.energy_pairs_j))

    def to_json(self) -> dict[str, Any]:
        """The pairs as a JSON object (:meth:`from_json` reads it back)."""
        energy = None if self.energy_pairs_j is None else [list(pair) for pair in self.energy_pairs_j]
        return {
            "block_steps": self.block_steps,
            "time_pairs_s": [list(pair) for pair in self.time_pairs_s],
            "energy_pairs_j": energy,
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> OverheadResult:
        """Read :meth:`to_json`'s object back.

        Raises:
            ValueError: If a field is missing or malformed (what is wrong is named).
        """
        try:
            block_steps = int(document["block_steps"])
            times = tuple(_pair(pair) for pair in document["time_pairs_s"])
            energies = document["energy_pairs_j"]
            energy = None if energies is None else tuple(_pair(pair) for pair in energies)
        except (KeyError, TypeError, ValueError) as problem:
            raise ValueError(f"not an overhead-check result: {problem!r}") from problem
        if energy is not None and len(energy) != len(times):
            raise ValueError(f"{len(energy)} energy pairs for {len(times)} time pairs")
        return cls(block_steps, times, energy)

    def describe(self, clocks_set: bool) -> str:
        """One log line (``clocks_set``: whether the plan's clocks were really applied in active blocks).

        It names what the check measures (the training-thread hooks' cost, or the plan's effect) and what it
        cannot see (the background threads, running in both kinds of block).
        """
        what = "plan vs stock clocks" if clocks_set else "the training-thread hooks' cost (clocks not set)"
        energy = ""
        if self.energy is not None and self.energy_median is not None:
            energy = f"; energy per iteration {_changes(self.energy_median, self.energy)}"
        return (
            f"overhead check, in process, {what}: session active vs suspended in {self.pairs} pairs of "
            f"{self.block_steps}-iteration blocks (the plugin's background threads keep running in both; "
            "lab/bench_overhead.py compares against Megatron itself): "
            f"iteration time {_changes(self.time_median, self.time)}"
            f"{energy} (measured: wall clock{'' if self.energy is None else ', energy counter'})"
        )


def pooled(results: Sequence[OverheadResult]) -> OverheadResult:
    """The pairs of several runs of one job as one result (energy only where every run measured it).

    Raises:
        ValueError: If there is no result or their block sizes differ (their pairs would not compare alike).
    """
    if not results:
        raise ValueError("nothing to pool")
    sizes = {result.block_steps for result in results}
    if len(sizes) > 1:
        raise ValueError(
            f"the runs used different blocks ({sorted(sizes)} iterations): pool runs of one size"
        )
    energies = [result.energy_pairs_j for result in results]
    return OverheadResult(
        results[0].block_steps,
        tuple(pair for result in results for pair in result.time_pairs_s),
        None
        if any(pairs is None for pairs in energies)
        else tuple(p for pairs in energies for p in pairs or ()),
    )


def _sides(pairs: Sequence[Pair]) -> tuple[list[float], list[float]]:
    """The suspended and the active figures of ``pairs``, in pair order."""
    return [pair[0] for pair in pairs], [pair[1] for pair in pairs]


def _pair(values: Sequence[float]) -> Pair:
    """A (suspended, active) pair of positive numbers."""
    suspended, active = (float(value) for value in values)
    if not (suspended > 0 and active > 0):
        raise ValueError(f"pair {list(values)} is not two positive figures")
    return suspended, active


def _changes(median: RelativeChange, mean: RelativeChange) -> str:
    """Median then mean: each point estimate, its interval, and the verdict of ``RelativeChange.format``."""
    return f"median of pairs {_change(median)}, mean {_change(mean)}"


def _change(change: RelativeChange) -> str:
    """The point estimate, its interval, and the verdict of ``RelativeChange.format``."""
    return (
        f"{100 * change.change:+.2f} % (95 % CI {100 * change.low:+.2f} to {100 * change.high:+.2f} %): "
        f"{change.format()}"
    )


class OverheadCheck:
    """Decides, step by step, whether the session takes part, and keeps the blocks' figures.

    Args:
        block_steps: Iterations per block (>= 2).
        measured_energy: Whether the meter reads a real counter (else only time is compared).
        clock: Wall clock (seconds).
    """

    def __init__(
        self, block_steps: int, measured_energy: bool, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if block_steps < 2:
            raise ValueError(f"a block needs at least 2 iterations, got {block_steps}")
        self.block_steps = block_steps
        self.measured_energy = measured_energy
        self._clock = clock
        self._first_step: int | None = None  # the first step of the first block
        self._blocks: list[_Block] = []
        self._last: tuple[int, float] | None = None  # the previous step and its start
        self.suspended = False

    def _block_of(self, step: int) -> tuple[int, bool] | None:
        """The block index of ``step`` and whether it is suspended (``None`` before the first block)."""
        if self._first_step is None or step < self._first_step:
            return None
        index = (step - self._first_step) // self.block_steps
        pair, position = divmod(index, 2)
        return index, (position == 0) == (pair % 2 == 0)

    def before_step(self, step: int, session: Suspendable) -> bool:
        """At a step's start, before the session sees it: suspend or resume it; return whether it takes part.

        The same on every rank (it depends on the step number and the phase, which every rank shares).
        """
        now = self._clock()
        if self._first_step is None and session.phase not in (SessionPhase.PROFILING, SessionPhase.PLANNING):
            self._first_step = step + self.block_steps  # one active block lets the plan settle
        self._record(step, now, session)
        placed = self._block_of(step)
        suspend = placed is not None and placed[1]
        if suspend != self.suspended:
            if suspend:
                session.suspend()
            else:
                session.resume()
            self.suspended = suspend
        return not suspend

    def _record(self, step: int, now: float, session: Suspendable) -> None:
        """Close the previous step: its wall time (and energy) joins its block unless it opened the block."""
        previous = self._last
        self._last = (step, now)
        window = session.energy_window() if self.measured_energy and self._first_step is not None else None
        if previous is None:
            return
        placed = self._block_of(previous[0])
        if placed is None:
            return
        index, suspended = placed
        if index == len(self._blocks):
            self._blocks.append(_Block(suspended))
            return  # a block's first step pays the switch: left out
        block = self._blocks[index]
        block.times_s.append(now - previous[1])
        if window is not None:
            block.energies.append(window)

    def result(self) -> OverheadResult | None:
        """The paired change over the complete pairs; ``None`` before two pairs."""
        complete = [b for b in self._blocks if len(b.times_s) == self.block_steps - 1]
        pairs = [complete[i : i + 2] for i in range(0, len(complete) - 1, 2)]
        pairs = [p for p in pairs if p[0].suspended != p[1].suspended]
        if len(pairs) < 2:
            return None

        def mean(values: list[float]) -> float:
            return sum(values) / len(values)

        ordered = [(first, second) if first.suspended else (second, first) for first, second in pairs]

        def figures(pick: Callable[[_Block], list[float]]) -> tuple[Pair, ...]:
            return tuple((mean(pick(off)), mean(pick(on))) for off, on in ordered)

        energies = None
        if self.measured_energy and all(len(b.energies_j()) == len(b.times_s) for p in pairs for b in p):
            energies = figures(_Block.energies_j)
        return OverheadResult(self.block_steps, figures(lambda b: b.times_s), energies)
