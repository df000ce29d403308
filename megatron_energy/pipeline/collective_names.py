"""A plan's collectives and their launch points, as typed values (the Kareus contract's vocabulary).

A :class:`CollectiveName` says which collective (``group``, ``op``, and for a DDP bucket its ``chunk`` and
``bucket``); a :class:`LaunchPoint` says where inside (or after) an instruction it launches: the start of a
layer, the instruction's end, after the optimizer step, or overlapped with GEMMs. What each means, and which
collective may launch where, is :mod:`megatron_energy.pipeline.collectives`'. The plan file holds both as
JSON objects of these fields (``plan_file``); ``str()`` gives the dotted forms of the contract
(``dp.reduce_scatter.chunk1.bucket0``, ``layer2``) for messages and logs only: nothing parses them back.

Pure Python: no torch, megatron or NVML imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Ge

from megatron_energy.errors import EnergyValueError

GroupName = Literal["dp", "pp", "tp", "ep"]
CollectiveOp = Literal["reduce_scatter", "all_gather", "all_reduce", "send_recv", "all_to_all"]
LaunchWhere = Literal["layer", "end", "after_optimizer", "gemm_overlap"]


class CollectiveNameError(EnergyValueError):
    """A collective name or launch point does not follow the contract's scheme."""


@dataclass(frozen=True)
class CollectiveName:
    """Which collective: its process group and operation, and for a DDP bucket its chunk and bucket.

    Raises:
        CollectiveNameError: A ``dp`` collective without a bucket, or another group's with a chunk or bucket.
    """

    group: GroupName
    """Process group name (``pipeline.collectives.PROCESS_GROUPS``)."""
    op: CollectiveOp
    """Collective operation."""
    chunk: Annotated[int, Ge(0)] | None = None
    """Model chunk (virtual pipeline only)."""
    bucket: Annotated[int, Ge(0)] | None = None
    """DDP bucket index inside the chunk (bucket classes only)."""

    def __post_init__(self) -> None:
        if (self.group == "dp") != (self.bucket is not None):
            raise CollectiveNameError(
                f"collective {self}: dp collectives name a bucket, pp, tp and ep ones do not"
            )
        if self.group != "dp" and self.chunk is not None:
            raise CollectiveNameError(f"collective {self}: only dp (bucket) collectives name a chunk")

    @property
    def class_key(self) -> str:
        """``<group>.<op>``: the class the collective belongs to (the key of ``CTA_BUDGETS``)."""
        return f"{self.group}.{self.op}"

    def __str__(self) -> str:
        chunk = "" if self.chunk is None else f".chunk{self.chunk}"
        bucket = "" if self.bucket is None else f".bucket{self.bucket}"
        return f"{self.class_key}{chunk}{bucket}"


@dataclass(frozen=True)
class LaunchPoint:
    """Where inside (or after) an instruction a collective launches.

    Raises:
        CollectiveNameError: A layer point without its layer, or another point with one.
    """

    where: LaunchWhere
    """``layer``: the start of the ``layer``-th transformer layer of the instruction's chunk in execution
    order; ``end``: the end of the instruction; ``after_optimizer``: after the optimizer step that follows
    the instruction (the rank's last); ``gemm_overlap``: split and overlapped with its GEMMs (TP classes)."""
    layer: Annotated[int, Ge(0)] | None = None
    """The layer (execution order, 0-based) of a ``layer`` point; ``None`` for the others."""

    def __post_init__(self) -> None:
        if (self.where == "layer") != (self.layer is not None):
            raise CollectiveNameError(
                f"a {self.where!r} launch point names a layer exactly when it is 'layer'"
            )
        if self.layer is not None and self.layer < 0:
            raise CollectiveNameError(f"layer index must not be negative, got {self.layer}")

    def layers_done(self, num_layers: int) -> int | None:
        """Layers of the instruction done before a launch here: ``k`` for layer ``k``, all for the end.

        Returns ``None`` for ``after_optimizer`` and ``gemm_overlap`` (no point inside the instruction).

        Raises:
            CollectiveNameError: A layer beyond the chunk's ``num_layers``.
        """
        if self.where == "end":
            return num_layers
        if self.layer is None:
            return None
        if self.layer >= num_layers:
            raise CollectiveNameError(
                f"launch point {self} is not one of layer0..layer{num_layers - 1} or end"
            )
        return self.layer

    def __str__(self) -> str:
        return f"layer{self.layer}" if self.layer is not None else self.where


END = LaunchPoint("end")
"""The end of the instruction."""

AFTER_OPTIMIZER = LaunchPoint("after_optimizer")
"""After the optimizer step that follows the named (last) instruction of the iteration."""

GEMM_OVERLAP = LaunchPoint("gemm_overlap")
"""A tensor-parallel class overlapped with its GEMMs by TE userbuffers (``pipeline.collectives``)."""


def layer_start(k: int) -> LaunchPoint:
    """The start of the ``k``-th layer (execution order) of an instruction."""
    return LaunchPoint("layer", k)
