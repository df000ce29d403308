"""The one identity of a pipeline instruction, shared by hooks, profiles, DAGs, plans and simulations.

An :class:`Instruction` is the forward or backward pass of one microbatch through one model chunk on one
pipeline stage: ``Instruction(stage, chunk, microbatch, kind)``. Its :class:`Work` drops the microbatch:
every microbatch of a (stage, chunk, kind) does the same work, so profiles are keyed by ``Work``.

Megatron's combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``) runs the forward of one microbatch
and the backward of another as one step (``combined_forward_backward_step``), layer by layer, with the expert
all-to-all of each hidden behind the other's compute. That step is a :class:`FusedInstruction`: one node of
the DAG, timed and clocked as a whole. Its work is ``Work(stage, forward chunk, fused_kind(backward chunk))``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, TypeVar

Kind = Literal["forward", "backward"]
KINDS: tuple[Kind, ...] = ("forward", "backward")
SHORT_KIND = {"forward": "F", "backward": "B"}
FUSED = "fused"
"""The kind of a :class:`FusedInstruction` (its ``Work`` kind also names the backward chunk)."""


def fused_kind(backward_chunk: int) -> str:
    """The ``Work`` kind of a fused step whose backward runs on ``backward_chunk``: ``"fused+b1"``."""
    return f"{FUSED}+b{backward_chunk}"


def is_fused_kind(kind: str) -> bool:
    """Whether ``kind`` is a fused step's ``Work`` kind (``fused_kind``)."""
    head, _, chunk = kind.partition("+b")
    return head == FUSED and chunk.isdigit()


class Work(NamedTuple):
    """What an instruction computes, the same for every microbatch: the key of a profile."""

    stage: int
    """Pipeline stage (0-based)."""
    chunk: int
    """Virtual-pipeline model chunk (0 without interleaving)."""
    kind: str
    """``"forward"``, ``"backward"`` or a fused step's ``fused_kind(backward chunk)``."""


class Instruction(NamedTuple):
    """One forward or backward pass of one microbatch through one model chunk on one pipeline stage."""

    stage: int
    """Pipeline stage (0-based)."""
    chunk: int
    """Virtual-pipeline model chunk (0 without interleaving)."""
    microbatch: int
    """Microbatch index within the iteration."""
    kind: str
    """``"forward"`` or ``"backward"``."""

    @property
    def work(self) -> Work:
        """The instruction's work (its profile key)."""
        return Work(self.stage, self.chunk, self.kind)

    @property
    def label(self) -> str:
        """``F3c1``: kind, microbatch and chunk, as traces and logs show it."""
        return f"{SHORT_KIND[self.kind]}{self.microbatch}c{self.chunk}"


class FusedInstruction(NamedTuple):
    """One step of the combined 1F1B schedule: a forward and another microbatch's backward, run as one.

    Megatron-core's ``combined_forward_backward_step`` interleaves the two passes layer by layer (the expert
    all-to-all of one on a side stream behind the other's compute), so the pair has one duration and one
    clock. It carries ``stage``, ``chunk``, ``microbatch`` and ``kind`` like an :class:`Instruction`
    (``chunk`` and ``microbatch`` are the forward's) so the DAG, the planner and the simulator take it as a
    node like any other.
    """

    forward: Instruction
    """The forward pass of the pair."""
    backward: Instruction
    """The backward pass of the pair (same stage, another microbatch)."""

    @property
    def stage(self) -> int:
        """Pipeline stage (0-based)."""
        return self.forward.stage

    @property
    def chunk(self) -> int:
        """The forward's model chunk."""
        return self.forward.chunk

    @property
    def microbatch(self) -> int:
        """The forward's microbatch."""
        return self.forward.microbatch

    @property
    def kind(self) -> str:
        """``"fused"``."""
        return FUSED

    @property
    def parts(self) -> tuple[Instruction, Instruction]:
        """The forward and the backward pass."""
        return self.forward, self.backward

    @property
    def work(self) -> Work:
        """``Work(stage, forward chunk, fused_kind(backward chunk))``: pairs of the same chunks do alike."""
        return Work(self.stage, self.forward.chunk, fused_kind(self.backward.chunk))

    @property
    def label(self) -> str:
        """``F3c1+B1c0``: both passes' labels."""
        return f"{self.forward.label}+{self.backward.label}"


Step = Instruction | FusedInstruction
"""One node of a rank's order: a single pass, or (combined 1F1B) a fused pair."""

StepKey = TypeVar("StepKey", bound=Step)
"""The key type of a clock table: ``Instruction`` (every schedule but combined 1F1B) or ``Step``."""


def passes(step: Step) -> tuple[Instruction, ...]:
    """The forward and backward passes one step runs."""
    return step.parts if isinstance(step, FusedInstruction) else (step,)
