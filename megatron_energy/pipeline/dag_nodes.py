"""The nodes of the pipeline DAG beside its instructions, and what they cost.

Besides the instructions (:mod:`~megatron_energy.pipeline.instruction`), a DAG
(:class:`~megatron_energy.pipeline.dag.PipelineDag`) holds a :class:`Transfer` on every cross-stage
dependency, each stage's :class:`TailStep` list and the dummy :data:`SOURCE` and :data:`SINK`. A transfer
takes :class:`CommSpec`'s time; the tail steps take the :class:`IterationTail`'s (modelled or measured).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.instruction import FusedInstruction, Instruction


class Transfer(NamedTuple):
    """The point-to-point transfer of what ``sender`` produced to the stage that consumes it."""

    sender: Instruction
    """The instruction whose output (activation or gradient) is sent."""


class TailStep(NamedTuple):
    """Work of one stage after its last backward pass."""

    name: str
    """``"dp_sync"`` (data-parallel gradient sync), ``"optimizer"`` (optimizer step) or ``"outside"`` (the
    measured time of an iteration outside the pipeline span)."""
    stage: int
    """Pipeline stage."""


NodeId = Instruction | FusedInstruction | Transfer | TailStep | str
"""A node of the DAG: an instruction or fused pair, a transfer, a tail step, or ``"source"`` / ``"sink"``."""

SOURCE = "source"
SINK = "sink"


@dataclass(frozen=True)
class CommSpec:
    """Point-to-point transfer between adjacent pipeline stages.

    Attributes:
        latency_s: Fixed cost of one transfer.
        bandwidth_gbps: Link bandwidth in GB/s (1e9 bytes per second).
        activation_bytes: Bytes of one transfer (activation forward, its gradient backward).
    """

    latency_s: float
    bandwidth_gbps: float
    activation_bytes: int

    @property
    def duration_s(self) -> float:
        """Time of one transfer: latency plus bytes over bandwidth."""
        return self.latency_s + self.activation_bytes / (self.bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class IterationTail:
    """What each stage does between its last backward pass and the next iteration's first instruction.

    Two kinds, whose energy the simulator counts differently (``sim.simulator``):

    * **modelled** (a job description, ``megatron-energy plan --config``): the data-parallel gradient sync
      and the optimizer step, timed by the job model; their energy is modelled at idle power;
    * **measured** (the session's profiling at stock clocks): ``outside_s``, the part of an iteration that
      lies outside the replica's pipeline span (gradient sync, optimizer step, data loading, logging, host
      gaps), measured as one span, and ``stage_energy_j``, each stage's GPU's energy over it as measured;
      the simulator carries that energy as is and charges no idle power over the span.

    The tail is the same length on every stage.

    Attributes:
        dp_sync_s: Data-parallel gradient synchronisation (modelled).
        optimizer_s: Optimizer step (modelled).
        outside_s: Measured time of an iteration outside the pipeline span (0 for a modelled tail).
        stage_energy_j: Measured energy of each stage's GPU over ``outside_s``; empty for a modelled tail.
    """

    dp_sync_s: float = 0.0
    optimizer_s: float = 0.0
    outside_s: float = 0.0
    stage_energy_j: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        values = (self.dp_sync_s, self.optimizer_s, self.outside_s, *self.stage_energy_j)
        if not all(math.isfinite(value) and value >= 0 for value in values):
            raise EnergyValueError(f"an iteration tail's times and energies must be finite and >= 0: {self}")

    @classmethod
    def measured(cls, outside_s: float, stage_energy_j: Sequence[float]) -> IterationTail:
        """A measured tail: ``outside_s`` on every stage, each stage's GPU using ``stage_energy_j[stage]``."""
        return cls(outside_s=outside_s, stage_energy_j=tuple(stage_energy_j))

    @property
    def is_measured(self) -> bool:
        """Whether the tail's energy was measured (else it is modelled at idle power)."""
        return bool(self.stage_energy_j)

    @property
    def time_s(self) -> float:
        """The whole tail of one stage."""
        return self.dp_sync_s + self.optimizer_s + self.outside_s

    def energy_j(self, stage: int, idle_power_w: float) -> float:
        """Energy of one stage's GPU over its tail: as measured, or (modelled) its time at idle power."""
        if self.is_measured:
            return self.stage_energy_j[stage]
        return self.time_s * idle_power_w
