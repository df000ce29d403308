"""Which collectives the runtime can retime on stock megatron-core 0.19, and where each may be launched.

A plan's :class:`~megatron_energy.plan.CollectiveAction` names a collective (``dp.all_reduce.bucket0``) and
a launch point (a :class:`~megatron_energy.plan.Boundary`). This module reads those names and checks the
launch points against one rank's executed instruction order, without torch or megatron, so plans are
refused before training starts and the rules are tested in milliseconds.

**Names.** ``<class>.<op>.bucket<k>`` for data-parallel gradient and parameter collectives:

- ``dp.all_reduce.bucket<k>`` / ``dp.reduce_scatter.bucket<k>``: the gradient reduction of DDP bucket group
  ``k`` (all-reduce without, reduce-scatter with ``--use-distributed-optimizer``);
- ``dp.all_gather.bucket<k>``: the parameter all-gather of bucket group ``k`` (``--overlap-param-gather``).

``k`` numbers the bucket groups of this rank's model chunks in chunk order, each chunk's groups in
megatron-core's order (``DistributedDataParallel.bucket_groups``): chunk 0's groups are ``0 .. n0-1``,
chunk 1's ``n0 ..``, and so on. Megatron buckets only the first chunk of pipeline rank 0 (later stages and
chunks get one bucket group each: ``distributed_data_parallel.py:99-106`` and ``get_model``'s
``disable_bucketing``).

**Launch points.** ``Boundary(instruction, None)`` launches when that instruction starts (its begin hook,
before its compute is issued); ``Boundary(instruction, INSTRUCTION_END)`` launches when it ends. A bucket's
gradients are complete only once this rank's last backward instruction of the bucket's chunk has ended
(gradients accumulate over every microbatch), so a gradient reduction may be launched at that
instruction's end or at any later boundary of the step; earlier is refused. Without an action Megatron
launches each bucket inside that last backward, as soon as its last gradient is accumulated (or, with
``--align-grad-reduce`` on pipeline ranks after the first, after the last backward): a planned point
*defers* or *forces* the launch relative to that.

**Not retimed** (refused with the reason): pipeline p2p (``pp.*``) is issued by the schedule where the
data dependency sits (its launch *is* the instruction boundary; ``--overlap-p2p-communication`` and batched
p2p are Megatron options, not per-instruction choices); TP/SP collectives (``tp.*``) run inside the layers'
autograd functions, and the only overlap megatron-core exposes for them, ``--tp-comm-overlap``, is
Transformer Engine's userbuffers, configured once per GEMM at start-up (``--tp-comm-overlap-cfg``), not per
instruction; CP collectives likewise live inside TE's attention.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.plan import Boundary

INSTRUCTION_END = "end"
"""The phase name of a boundary at an instruction's end (its end hook)."""

GRADIENT_OPS = ("all_reduce", "reduce_scatter")
"""Gradient reductions of a DDP bucket group."""

PARAMETER_OPS = ("all_gather",)
"""Parameter all-gathers of a DDP bucket group (``--overlap-param-gather``)."""

_DP_NAME = re.compile(r"^dp\.(?P<op>[a-z_]+)\.bucket(?P<bucket>\d+)$")

_NOT_RETIMED = {
    "pp": (
        "pipeline p2p is issued by megatron-core's schedule where the data dependency sits, so its launch is "
        "the instruction boundary itself; choose batched or overlapped p2p with Megatron's own flags "
        "(--overlap-p2p-communication, --no-overlap-p2p-communication, batch_p2p_comm) and give its SM "
        "budget through the 'pp' communicator config"
    ),
    "tp": (
        "TP/SP collectives run inside the layers' autograd functions; the only overlap megatron-core "
        "exposes is --tp-comm-overlap (Transformer Engine userbuffers, set once per GEMM by "
        "--tp-comm-overlap-cfg at start-up), so stock megatron-core cannot launch them at a planned "
        "instruction; give their SM budget through the 'tp' communicator config"
    ),
    "cp": (
        "context-parallel collectives run inside Transformer Engine's attention; stock megatron-core "
        "offers no launch point for them"
    ),
}


class CollectivePlanError(EnergyValueError):
    """A plan's collective actions cannot be honoured by this job; the message says what and how to fix."""


@dataclass(frozen=True)
class BucketCollective:
    """One data-parallel bucket-group collective named by a plan."""

    name: str
    """The plan's name, e.g. ``dp.all_reduce.bucket0``."""
    op: str
    """``all_reduce``, ``reduce_scatter`` or ``all_gather``."""
    bucket: int
    """Index of the bucket group over this rank's chunks (see the module docstring)."""

    @property
    def is_gradient(self) -> bool:
        """Whether it reduces gradients (else it gathers parameters)."""
        return self.op in GRADIENT_OPS


def bucket_collective_name(op: str, bucket: int) -> str:
    """The plan name of a bucket-group collective, e.g. ``dp.all_reduce.bucket0``."""
    return f"dp.{op}.bucket{bucket}"


def parse_collective(name: str) -> BucketCollective:
    """Read a collective name that the runtime can retime.

    Args:
        name: The plan's ``CollectiveAction.collective``.

    Returns:
        The bucket-group collective it names.

    Raises:
        CollectivePlanError: The name is malformed, or names a collective class whose launch stock
            megatron-core gives no point to move (pp, tp, cp), with the reason.
    """
    match = _DP_NAME.match(name)
    if match is None:
        group = name.split(".", 1)[0]
        if group in _NOT_RETIMED:
            raise CollectivePlanError(
                f"the plan launches {name!r} at a chosen point, which stock megatron-core 0.19 cannot do: "
                f"{_NOT_RETIMED[group]}. Drop that action from the plan (plan with the kareus optimiser "
                "for this megatron-core version)"
            )
        raise CollectivePlanError(
            f"the plan names an unknown collective {name!r}; known: dp.all_reduce.bucket<k>, "
            "dp.reduce_scatter.bucket<k>, dp.all_gather.bucket<k>. Rerun planning with this version"
        )
    op = match["op"]
    if op not in GRADIENT_OPS + PARAMETER_OPS:
        raise CollectivePlanError(
            f"the plan names {name!r}, but a DDP bucket group runs only "
            f"{', '.join(GRADIENT_OPS + PARAMETER_OPS)}: rerun planning"
        )
    return BucketCollective(name, op, int(match["bucket"]))


def boundary_label(at: Boundary) -> str:
    """``start of B3c1`` / ``end of B3c1``, for messages."""
    where = "end" if at.phase == INSTRUCTION_END else "start" if at.phase is None else f"phase {at.phase!r}"
    return f"{where} of {at.instruction.label}"


def boundary_position(order: Sequence[Instruction], at: Boundary) -> float:
    """Where a boundary falls in a rank's order: ``i`` at instruction ``i``'s start, ``i + 0.5`` at its end.

    Raises:
        CollectivePlanError: The instruction is not in the order, or the phase is not start or end.
    """
    try:
        index = list(order).index(at.instruction)
    except ValueError:
        raise CollectivePlanError(
            f"the plan launches a collective at {at.instruction.label}, which this rank does not run; "
            "it was made for another schedule: rerun planning"
        ) from None
    if at.phase is None:
        return float(index)
    if at.phase == INSTRUCTION_END:
        return index + 0.5
    raise CollectivePlanError(
        f"a collective can be launched at an instruction's start or end ({INSTRUCTION_END!r}), not at phase "
        f"{at.phase!r} inside it: megatron-core fires no hook there. Rerun planning"
    )


def last_backward(order: Sequence[Instruction], chunk: int) -> Instruction:
    """This rank's last backward instruction of a model chunk: where its gradients become complete.

    Raises:
        CollectivePlanError: The order has no backward of that chunk.
    """
    backwards = [i for i in order if i.kind == "backward" and i.chunk == chunk]
    if not backwards:
        raise CollectivePlanError(f"this rank runs no backward of model chunk {chunk}; rerun planning")
    return backwards[-1]


def earliest_gradient_launch(order: Sequence[Instruction], chunk: int) -> Boundary:
    """The earliest boundary at which a gradient reduction of ``chunk``'s buckets may start."""
    return Boundary(last_backward(order, chunk), INSTRUCTION_END)


def check_gradient_launch(order: Sequence[Instruction], chunk: int, name: str, at: Boundary) -> None:
    """Refuse a gradient-reduction launch point before the bucket's gradients exist.

    Args:
        order: This rank's executed instruction order.
        chunk: The model chunk of the bucket group.
        name: The collective's name (for the message).
        at: The planned launch point.

    Raises:
        CollectivePlanError: ``at`` precedes the end of the chunk's last backward, or is not a boundary
            the runtime can act at.
    """
    earliest = earliest_gradient_launch(order, chunk)
    if boundary_position(order, at) < boundary_position(order, earliest):
        raise CollectivePlanError(
            f"the plan launches {name} at the {boundary_label(at)}, before its gradients exist: they are "
            f"complete only at the {boundary_label(earliest)} (the last backward of model chunk {chunk} "
            "on this rank). Rerun planning; a gradient reduction can launch there or later"
        )


def check_parameter_launch(order: Sequence[Instruction], chunk: int, name: str, at: Boundary) -> None:
    """Refuse a parameter all-gather launch point after the chunk's first forward needs the parameters.

    Args:
        order: This rank's executed instruction order.
        chunk: The model chunk of the bucket group.
        name: The collective's name (for the message).
        at: The planned launch point.

    Raises:
        CollectivePlanError: ``at`` is after the start of the chunk's first forward (Megatron's forward
            pre-hook would have dispatched it already).
    """
    forwards = [i for i in order if i.kind == "forward" and i.chunk == chunk]
    if not forwards:
        raise CollectivePlanError(f"this rank runs no forward of model chunk {chunk}; rerun planning")
    latest = Boundary(forwards[0])
    if boundary_position(order, at) > boundary_position(order, latest):
        raise CollectivePlanError(
            f"the plan launches {name} at the {boundary_label(at)}, after the {boundary_label(latest)}, "
            "whose forward needs those parameters (megatron-core's forward pre-hook gathers them there "
            "itself). Rerun planning; a parameter all-gather can launch there or earlier"
        )
