"""The one identity of a pipeline instruction, shared by hooks, profiles, DAGs, plans and simulations.

An :class:`Instruction` is the forward or backward pass of one microbatch through one model chunk on one
pipeline stage: ``Instruction(stage, chunk, microbatch, kind)``. Its :class:`Work` drops the microbatch:
every microbatch of a (stage, chunk, kind) does the same work, so profiles are keyed by ``Work``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["forward", "backward"]
KINDS: tuple[Kind, ...] = ("forward", "backward")
SHORT_KIND = {"forward": "F", "backward": "B"}


class Work(NamedTuple):
    """What an instruction computes, the same for every microbatch: the key of a profile."""

    stage: int
    """Pipeline stage (0-based)."""
    chunk: int
    """Virtual-pipeline model chunk (0 without interleaving)."""
    kind: str
    """``"forward"`` or ``"backward"``."""


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
