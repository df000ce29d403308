"""What the overlap simulation (:mod:`megatron_energy.sim.overlap`) gives: each stage's phases (*modelled*).

A stage's iteration is partitioned into the :data:`PHASES`; each holds its time and its static and dynamic
energy (the simulator's module docstring says what each phase draws), so a stage's phase times add up to the
iteration time and its static plus dynamic energy is its total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from megatron_energy.sim.simulator import SimResult, SimulatedStage, Slice

PHASES: tuple[str, ...] = ("compute", "overlap", "comm", "blocked", "tail", "idle")
"""The phases of a stage's iteration, in the order reports list them."""


class PhaseEnergy(NamedTuple):
    """Time and energy of one phase of one stage (modelled)."""

    phase: str
    """One of :data:`PHASES`."""
    time_s: float
    """Seconds of the iteration in this phase."""
    static_j: float
    """``P_idle`` x ``time_s``."""
    dynamic_j: float
    """Energy above ``P_idle`` over those seconds."""


class CommSlice(NamedTuple):
    """One collective's interval on a stage's collective stream (modelled)."""

    stage: int
    """Pipeline stage."""
    name: str
    """Collective name."""
    start_s: float
    """Start."""
    end_s: float
    """End."""
    ctas: int
    """CTA budget."""
    overlapped_s: float
    """Seconds of it beside compute."""


@dataclass(frozen=True)
class StageOverlapEnergy:
    """One stage GPU over one iteration: its phases (modelled)."""

    stage: int
    phases: tuple[PhaseEnergy, ...]
    """One per :data:`PHASES` entry, in that order."""

    def phase(self, name: str) -> PhaseEnergy:
        """The phase called ``name``."""
        return self.phases[PHASES.index(name)]

    @property
    def static_j(self) -> float:
        """Static energy of the stage GPU (``P_idle`` x iteration time)."""
        return sum(p.static_j for p in self.phases)

    @property
    def dynamic_j(self) -> float:
        """Dynamic energy of the stage GPU."""
        return sum(p.dynamic_j for p in self.phases)

    @property
    def total_j(self) -> float:
        """Static plus dynamic."""
        return self.static_j + self.dynamic_j


@dataclass(frozen=True)
class OverlapResult:
    """A simulated iteration with collectives (modelled).

    Attributes:
        iteration_time_s: The iteration time.
        stages: Per stage GPU, its phases.
        timeline: Compute, transfer and tail slices (compute slices carry their energy).
        comm: Collective slices per stage stream.
        gpu_name: GPU spec name.
        profile_source: Where the instruction figures came from.
    """

    iteration_time_s: float
    stages: tuple[StageOverlapEnergy, ...]
    timeline: tuple[Slice, ...]
    comm: tuple[CommSlice, ...]
    gpu_name: str
    profile_source: str

    @property
    def total_energy_j(self) -> float:
        """Energy of one pipeline (one GPU per stage)."""
        return sum(stage.total_j for stage in self.stages)

    @property
    def static_j(self) -> float:
        """Static energy of one pipeline."""
        return sum(stage.static_j for stage in self.stages)

    @property
    def dynamic_j(self) -> float:
        """Dynamic energy of one pipeline."""
        return sum(stage.dynamic_j for stage in self.stages)

    def as_sim_result(self) -> SimResult:
        """The same iteration in the plain simulator's terms (busy = compute + overlap, blocked + comm)."""
        stages = []
        for stage in self.stages:
            part = {p.phase: p for p in stage.phases}

            def energy(*names: str, part: dict[str, PhaseEnergy] = part) -> float:
                return sum(part[n].static_j + part[n].dynamic_j for n in names)

            stages.append(
                SimulatedStage(
                    stage=stage.stage,
                    busy_s=part["compute"].time_s + part["overlap"].time_s,
                    blocked_s=part["blocked"].time_s + part["comm"].time_s,
                    idle_s=part["idle"].time_s,
                    busy_energy_j=energy("compute", "overlap"),
                    blocked_energy_j=energy("blocked", "comm"),
                    idle_energy_j=energy("idle"),
                    tail_s=part["tail"].time_s,
                    tail_energy_j=energy("tail"),
                )
            )
        return SimResult(
            self.iteration_time_s, stages, list(self.timeline), self.gpu_name, self.profile_source
        )
