"""What the collectives of an iteration do: the input of the overlap simulation (``sim.overlap``).

An :class:`OverlapSchedule` holds each stage's collective launches (:class:`CommLaunch`, anchored at a
fraction of an instruction's work, before an instruction, or after the optimizer step), the pipeline
transfers' durations at their CTA budget, and the tensor-parallel collectives inside each instruction
(:class:`InlineComm`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.sim.contention import CommLoad

Anchor = Literal["compute", "prefetch", "after_optimizer"]


@dataclass(frozen=True)
class CommLaunch:
    """One launch of a collective on a stage's collective stream.

    Attributes:
        name: What the launch is called in messages and traces (a collective's dotted name,
            ``str(CollectiveName)``; a benchmark's copy); never read back.
        stage: Pipeline stage.
        traffic_bytes: Bytes the GPU sends.
        load: Its CTA budget and link.
        anchor: Where it launches (the anchors: ``sim.overlap``'s module docstring).
        instruction: ``"compute"``: the instruction it launches in; ``"prefetch"``: the instruction that
            waits for it; ``None`` for ``"after_optimizer"``.
        fraction: ``"compute"``: the share of the instruction's work done at launch (0..1).
    """

    name: str
    stage: int
    traffic_bytes: float
    load: CommLoad
    anchor: Anchor
    instruction: Instruction | None = None
    fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.anchor != "after_optimizer" and self.instruction is None:
            raise EnergyValueError(f"launch {self.name}: anchor {self.anchor!r} needs an instruction")
        if not 0.0 <= self.fraction <= 1.0:
            raise EnergyValueError(f"launch {self.name}: fraction must lie in [0, 1], got {self.fraction}")

    @property
    def duration_s(self) -> float:
        """Its time alone (at the maximum SM clock)."""
        return self.load.duration_s(self.traffic_bytes)


@dataclass(frozen=True)
class InlinePart:
    """One tensor-parallel class's collectives inside an instruction.

    Attributes:
        comm_s: Their time per instruction at the schedule's budget, alone.
        load: Their CTA budget and link.
        overlapped: Beside the instruction's compute (TE userbuffers) rather than exposed.
    """

    comm_s: float
    load: CommLoad
    overlapped: bool = False


@dataclass(frozen=True)
class InlineComm:
    """Tensor-parallel collectives inside every instruction of one ``Work`` (module docstring).

    Attributes:
        parts: One per tensor-parallel class, in the order they run.
        profiled_s: Their time already inside the profile's instruction time (exposed, at idle power).
    """

    parts: tuple[InlinePart, ...]
    profiled_s: float


@dataclass(frozen=True)
class OverlapSchedule:
    """What the collectives of an iteration do (module docstring).

    Attributes:
        launches: Every launch, in each stage's launch order for launches reached at the same moment.
        transfer_s: Duration of a pipeline transfer sent by each stage; the DAG's own when absent.
        inline: Tensor-parallel collectives inside the instructions of each ``Work``; as profiled when absent.
    """

    launches: tuple[CommLaunch, ...] = ()
    transfer_s: Mapping[int, float] = field(default_factory=dict)
    inline: Mapping[Work, InlineComm] = field(default_factory=dict)
