"""Plan v3: the one executable contract between the optimisers and the runtime, as checked JSON.

Every optimiser emits a :class:`Plan`; the session runs exactly what the file says (a cache hit loads the
cached file, the report reads the file that ran). A plan holds:

- a few executable **points** of the time–energy frontier (ascending iteration time), one of them the
  target's; the others let data-parallel replicas follow a straggler's pace without re-planning;
- per point and per pipeline rank, **actions** at **boundaries**: a boundary is one instruction (the shared
  identity ``Instruction(stage, chunk, microbatch, kind)``) and optionally a typed phase inside it (a
  :class:`~megatron_energy.pipeline.phase_labels.PhaseLabel` for a phase clock, a
  :class:`~megatron_energy.pipeline.collective_names.LaunchPoint` for a collective's launch); an action is a
  clock to lock there (:class:`ClockAction`) or a collective to launch there with an SM/CTA budget
  (:class:`CollectiveAction`, naming a :class:`~megatron_energy.pipeline.collective_names.CollectiveName`);
- per point and per rank, the predicted energy and busy time; per point the iteration time, the deadline
  it was solved for and the relaxed lower bound (all *modelled*);
- the all-maximum-clocks baseline and the instant-switch frontier curve (for reports and plots);
- the measured iteration tail (optional, :class:`MeasuredTail`): the time and energy of an iteration outside
  the pipeline instructions, measured while profiling, which the baseline's and every point's predictions
  include;
- the target saving's band (optional, :class:`~megatron_energy.plan_band.SavingBand`): its lowest and highest
  value over the GPU spec's declared ranges, checked to hold the plan's own saving;
- provenance: the job fingerprint, GPU, whether the profile was measured or modelled, the optimisers that
  made it, the switch latency it was made executable under, and the writing software's version;
- optionally, one memory clock per rank, locked for the whole run phase (:mod:`megatron_energy.plan_memory`);
  absent when every rank keeps the stock memory clock;
- for a ``smooth:`` target, the bound, the target point's filler windows per rank and the filler floor's cost
  (:mod:`megatron_energy.plan_smoothing`); absent for every other target.

The file (:mod:`megatron_energy.plan_file`) is plain JSON read and written through pydantic models, with the
checks declared on the fields (here, on the typed values, and there), versioned and checksummed (SHA-256 of
its canonical content), so a stale, foreign, hand-edited or truncated plan is refused with a message naming
the field and saying what to do. Files of another schema version are refused (an older cache profiles
again).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal, NamedTuple

from annotated_types import Ge

from megatron_energy import __version__
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.collective_names import CollectiveName, LaunchPoint
from megatron_energy.pipeline.instruction import FusedInstruction, Instruction, Step, StepKey
from megatron_energy.pipeline.phase_labels import PhaseLabel
from megatron_energy.plan_band import SavingBand
from megatron_energy.plan_smoothing import PlanSmoothing

SCHEMA_VERSION = 3
"""Version of the JSON layout written by :meth:`Plan.save`; bump it when the layout changes (3: phases and
collectives as objects)."""

Provenance = Literal["measured", "modelled", "simulated"]

BoundaryPhase = PhaseLabel | LaunchPoint
"""A point inside an instruction: a phase clock's label, or a collective's launch point."""

Seconds = Annotated[float, Ge(0)]
"""A non-negative time (the plan file refuses a negative one)."""

Joules = Annotated[float, Ge(0)]
"""A non-negative energy (the plan file refuses a negative one)."""


class PlanError(EnergyValueError):
    """A plan file cannot be used; the message says why and what to do."""


class Boundary(NamedTuple):
    """Where an action takes effect: the start of an instruction, or of a named phase inside it."""

    instruction: Instruction
    """The instruction (of a fused step: its forward, with which the step starts)."""
    phase: BoundaryPhase | None = None
    """A phase clock's label or a collective's launch point inside the instruction; ``None``: its start."""
    backward: Instruction | None = None
    """Combined 1F1B: the backward run with ``instruction`` as one fused step; ``None`` for a single pass."""

    @property
    def step(self) -> Step:
        """The DAG node the boundary belongs to: the instruction, or the fused step it starts."""
        return (
            self.instruction if self.backward is None else FusedInstruction(self.instruction, self.backward)
        )


def step_boundary(step: Step, phase: BoundaryPhase | None = None) -> Boundary:
    """The boundary at the start of a step (or of a phase inside it)."""
    if isinstance(step, FusedInstruction):
        return Boundary(step.forward, phase, step.backward)
    return Boundary(step, phase)


@dataclass(frozen=True)
class ClockAction:
    """Lock the SM clock at a boundary (until the next clock action of the rank)."""

    at: Boundary
    """Where the clock takes effect."""
    clock_mhz: int
    """SM clock to lock."""


@dataclass(frozen=True)
class CollectiveAction:
    """Launch a collective at a boundary, with a budget of SMs (CTAs) for its kernels."""

    at: Boundary
    """The launch point."""
    collective: CollectiveName
    """Which collective, e.g. ``CollectiveName("dp", "reduce_scatter", bucket=0)``."""
    max_ctas: int | None = None
    """CTAs (thread blocks, one per SM) the collective's kernels may use; ``None``: the library's default."""


Action = ClockAction | CollectiveAction


@dataclass(frozen=True)
class RankPlan:
    """What one pipeline rank does at one point, and what that is predicted to cost (modelled)."""

    actions: tuple[Action, ...]
    """Actions in execution order."""
    energy_j: float
    """Predicted energy of the rank's GPU per iteration (busy + blocked + idle)."""
    busy_s: float
    """Predicted time the rank's GPU computes per iteration."""


@dataclass(frozen=True)
class PlanPoint:
    """One executable point of the frontier: every rank's actions and the predicted iteration."""

    label: str
    """What the point was chosen for, e.g. ``iso-time``, ``min-energy`` or ``time:1.234000``."""
    iteration_time_s: float
    """Predicted iteration time (modelled, with the plan's switch latency)."""
    deadline_s: float
    """The iteration-time budget the point was solved for."""
    lower_bound_j: float
    """Relaxed (continuous-clock, instant-switch) optimum at ``deadline_s``: no plan can use less."""
    ranks: tuple[RankPlan, ...]
    """Per pipeline rank."""

    @property
    def energy_j(self) -> float:
        """Predicted energy of one iteration over all pipeline ranks."""
        return sum(rank.energy_j for rank in self.ranks)

    @property
    def gap(self) -> float:
        """Relative distance of the predicted energy above the relaxed lower bound."""
        return self.energy_j / self.lower_bound_j - 1.0

    def clock_table(self, stage: int) -> dict[Instruction, int]:
        """The clock locked at each instruction start of one rank (a fused step's under its forward)."""
        return {
            step.forward if isinstance(step, FusedInstruction) else step: clock
            for step, clock in self.step_clocks(stage).items()
        }

    def step_clocks(self, stage: int) -> dict[Step, int]:
        """The clock locked at each step start of one rank, keyed by DAG node (fused steps as such)."""
        return {
            action.at.step: action.clock_mhz
            for action in self.ranks[stage].actions
            if isinstance(action, ClockAction) and action.at.phase is None
        }


class FrontierSample(NamedTuple):
    """One point of the instant-switch frontier curve (modelled)."""

    time_s: Seconds
    """Iteration time of the instant-switch plan."""
    energy_j: Joules
    """Its energy over all ranks."""
    lower_bound_j: Joules
    """No plan meeting ``deadline_s`` uses less: the convex relaxation's energy there or, for a DAG of more
    than 8192 instructions where the sweep solves the relaxation at a few deadlines only, a dual bound of it
    (lower: the gap to it is overstated, never understated). Plan points always carry the relaxed optimum."""
    deadline_s: Seconds
    """The deadline the plan was solved for."""


@dataclass(frozen=True)
class Baseline:
    """Every instruction at its fastest clock (the all-maximum-clocks iteration; modelled)."""

    iteration_time_s: Seconds
    """Iteration time."""
    energy_j: Joules
    """Energy of one iteration over all ranks."""
    stage_energy_j: tuple[Joules, ...] = ()
    """Energy per rank; empty where a hand-made plan does not give it (then not written to the file)."""


@dataclass(frozen=True)
class MeasuredTail:
    """The part of an iteration outside the pipeline instructions, measured while profiling at stock clocks.

    Gradient sync, optimizer step, data loading, logging: the time from the end of the replica's pipeline
    span to the next iteration's first instruction, and each stage's GPU's energy over it. The baseline's and
    every point's predicted iteration time and rank energies already include it (counted once, as measured:
    ``sim.simulator``); the plan keeps it so a measured pipeline span can be set against a point's prediction.
    """

    time_s: Seconds
    """Its time, the same on every stage."""
    stage_energy_j: tuple[Joules, ...]
    """Each stage's GPU's energy over it."""


@dataclass(frozen=True)
class Plan:
    """A job's executable plan: frontier points with every rank's actions, and their predictions.

    Attributes:
        fingerprint: :func:`fingerprint` of the job and GPU the plan was computed for.
        gpu_name: GPU spec or device name the profile came from.
        provenance: The profile's source: ``"measured"`` on GPUs, ``"modelled"`` by the time/power model
            (extrapolated from the stock clock included), ``"simulated"`` on simulated GPUs.
        target: The planning target (``iso-time``, ``min-energy``, ``slowdown:X``).
        optimisers: The optimisers that made the plan, in the order they ran.
        switch_latency_s: SM-clock switch latency the points were made executable under.
        baseline: The all-maximum-clocks iteration.
        points: Executable points, ascending iteration time.
        target_index: The point chosen for ``target``.
        frontier: The instant-switch frontier curve the points were picked from.
        notes: What the optimisers want the log to say about how the plan was chosen (e.g. ``all`` left a
            part's refinement out); written to the file only when there are some.
        measured_tail: The measured time and energy outside the pipeline instructions that the predictions
            include; ``None`` when the profile had none (a CSV, a modelled job, an older plan).
        memory_clocks_mhz: The memory clock of each pipeline rank for the whole run phase (every point's
            predictions include it); empty when every rank keeps the stock (top) memory clock.
        saving_band: The target point's saving over the GPU spec's declared ranges
            (``optimisers.saving_band``); ``None`` for a plan made without it (an older plan, or before the
            band is priced); written to the file only when there is one.
        smoothing: A ``smooth:`` target's bound, the target point's filler (included in its rank energies) and
            the filler floor's cost; ``None`` for every other target (then not written to the file).
        created_by: Name and version of the software that wrote the plan.
        schema_version: Layout version of the file.
    """

    fingerprint: str
    gpu_name: str
    provenance: Provenance
    target: str
    optimisers: tuple[str, ...]
    switch_latency_s: float
    baseline: Baseline
    points: tuple[PlanPoint, ...]
    target_index: int
    frontier: tuple[FrontierSample, ...] = ()
    measured_tail: MeasuredTail | None = None
    notes: tuple[str, ...] = ()
    memory_clocks_mhz: tuple[int, ...] = ()
    saving_band: SavingBand | None = None
    smoothing: PlanSmoothing | None = None
    created_by: str = f"megatron_energy {__version__}"
    schema_version: int = SCHEMA_VERSION
    _tables: dict[tuple[int, int], dict[Instruction, int]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def num_stages(self) -> int:
        """Pipeline ranks the plan covers."""
        return len(self.points[self.target_index].ranks)

    @property
    def target_point(self) -> PlanPoint:
        """The point chosen for the target."""
        return self.points[self.target_index]

    def clock_for(self, stage: int, instruction: Instruction, point: int | None = None) -> int:
        """The clock locked at an instruction's start.

        Args:
            stage: Pipeline rank.
            instruction: The instruction.
            point: Index of the point; the target's when ``None``.

        Raises:
            PlanError: If the plan has no such rank or instruction (it was made for another schedule).
        """
        index = self.target_index if point is None else point
        if not 0 <= stage < self.num_stages:
            raise PlanError(f"the plan covers pipeline ranks 0..{self.num_stages - 1}, not rank {stage}")
        table = self._tables.get((index, stage))
        if table is None:
            table = self._tables[(index, stage)] = self.points[index].clock_table(stage)
        try:
            return table[instruction]
        except KeyError:
            raise PlanError(
                f"the plan has no clock for {instruction} on rank {stage}: it was made for another schedule "
                "(stages, microbatches, virtual pipeline size or group size); rerun planning"
            ) from None

    def memory_clock_for(self, stage: int) -> int | None:
        """The memory clock rank ``stage`` locks for the run phase; ``None``: the stock memory clock."""
        return self.memory_clocks_mhz[stage] if self.memory_clocks_mhz else None

    def index_for_time(self, time_s: float) -> int:
        """The least-energy point no slower than ``time_s`` (a straggler's pace).

        A pace faster than the target's keeps the target; past the minimum-energy point, that point.
        """
        if time_s <= self.target_point.iteration_time_s:
            return self.target_index
        feasible = [i for i, point in enumerate(self.points) if point.iteration_time_s <= time_s * (1 + 1e-9)]
        return min(feasible, key=lambda i: (self.points[i].energy_j, self.points[i].iteration_time_s))


FINGERPRINT_DIGITS = 16
"""Hex digits of a job fingerprint kept in plans and cache folder names."""


def fingerprint(**parts: object) -> str:
    """Return a stable identifier of a job and GPU: SHA-256 of the canonical JSON of ``parts``.

    Args:
        **parts: What identifies the job, e.g. ``model=...``, ``parallelism=...``, ``gpu=...``; the same
            parts in any keyword order give the same fingerprint.

    Returns:
        A 64-character hexadecimal digest.
    """
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str, allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def clock_actions(clocks: Mapping[StepKey, int], order: Sequence[StepKey]) -> tuple[Action, ...]:
    """One clock action at the start of every step of ``order`` (instructions, or fused steps), in order."""
    return tuple(ClockAction(step_boundary(step), clocks[step]) for step in order)
