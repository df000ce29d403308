"""Where this job can launch each collective a plan names: the runtime's checks of the Kareus contract.

Names, launch points and classes are :mod:`megatron_energy.pipeline.collectives`' (the contract with the
planner), typed (``pipeline.collective_names``): a ``CollectiveName`` (``dp.<op>[.chunk<c>].bucket<b>`` for
DDP bucket collectives, ``pp.send_recv`` and ``tp.*`` for inline ones); a launch point is a
:class:`~megatron_energy.plan.Boundary` whose phase is ``None`` (the instruction's start) or a
``LaunchPoint``: ``layer<k>`` (the start of the ``k``-th layer of the instruction's chunk in execution
order), ``end`` or ``after_optimizer``. The planner derives launch points from a *modelled* bucket layout;
this module checks them against the job's *real* one (which parameters megatron-core put in each bucket), and
against the rank's executed order, without torch or megatron, so a plan is refused before training.

A gradient reduction (``dp.all_reduce`` / ``dp.reduce_scatter``) may launch once its bucket's gradients
are complete: during this rank's last backward instruction of the bucket's chunk (gradients accumulate over
every microbatch, megatron-core reduces only after the last), at ``layer<k>`` once every layer holding one
of the bucket's parameters has run its backward (:func:`ready_point`), at ``end``, or at a boundary of a
later instruction of the step (an extension of the contract: the runtime honours it, the planner does not
emit it yet). Earlier is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.collective_names import (
    AFTER_OPTIMIZER,
    END,
    CollectiveName,
    LaunchPoint,
    layer_start,
)
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.plan import Boundary

EMBEDDING = "embedding"
"""Where a parameter sits, besides a layer index: the input embedding (its gradient is ready last)."""

HEAD = "head"
"""The final norm and output layer (their gradients are ready before the first layer's backward starts)."""


class CollectivePlanError(EnergyValueError):
    """A plan's collective actions cannot be honoured by this job; the message says what and how to fix."""


def boundary_label(at: Boundary) -> str:
    """``start of B3c1``, ``end of B3c1``, ``layer2 of B3c1``, for messages."""
    where = "start" if at.phase is None else str(at.phase)
    return f"{where} of {at.instruction.label}"


def boundary_position(order: Sequence[Instruction], at: Boundary, num_layers: int) -> tuple[int, int]:
    """Where a boundary falls in a rank's step: ``(instruction index, layers of it done)``.

    Args:
        order: This rank's executed order.
        at: The boundary.
        num_layers: Transformer layers of the instruction's chunk on this rank.

    Raises:
        CollectivePlanError: The instruction is not in the order, or the phase is no launch point inside
            the step (``after_optimizer``, ``gemm_overlap``, a phase label) or beyond the chunk's layers.
    """
    try:
        index = list(order).index(at.instruction)
    except ValueError:
        raise CollectivePlanError(
            f"the plan launches a collective at {at.instruction.label}, which this rank does not run; it was "
            "made for another schedule: rerun planning"
        ) from None
    if at.phase is None:
        return index, -1
    if at.phase == AFTER_OPTIMIZER:
        raise CollectivePlanError(
            f"'{AFTER_OPTIMIZER}' is no point inside the step; only parameter all-gathers launch there"
        )
    try:
        done = at.phase.layers_done(num_layers) if isinstance(at.phase, LaunchPoint) else None
    except EnergyValueError as error:
        raise CollectivePlanError(f"{error} (this chunk has {num_layers} layers); rerun planning") from None
    if done is None:
        raise CollectivePlanError(f"{at.phase} is no launch point of a gradient reduction; rerun planning")
    return index, done


def last_backward(order: Sequence[Instruction], chunk: int) -> Instruction:
    """This rank's last backward instruction of a model chunk: where its gradients become complete.

    Raises:
        CollectivePlanError: The order has no backward of that chunk.
    """
    backwards = [i for i in order if i.kind == "backward" and i.chunk == chunk]
    if not backwards:
        raise CollectivePlanError(f"this rank runs no backward of model chunk {chunk}; rerun planning")
    return backwards[-1]


def ready_point(places: Iterable[int | str], num_layers: int) -> LaunchPoint:
    """The earliest point of a backward at which every gradient of a bucket is complete.

    A backward runs the chunk's head first, then layers ``L-1 .. 0`` (``layer<k>`` starts model layer
    ``L-1-k``), the embedding last. A parameter of model layer ``i`` is done from ``layer<L-i>`` on.

    Args:
        places: Where the bucket's parameters sit: model-layer indices of the chunk, :data:`HEAD` or
            :data:`EMBEDDING`.
        num_layers: Transformer layers of the chunk.

    Returns:
        ``layer<k>`` or ``end``.
    """
    done = 0
    for place in places:
        if place == EMBEDDING:
            done = num_layers
        elif place != HEAD:
            done = max(done, num_layers - int(place))
    return END if done >= num_layers else layer_start(done)


def check_gradient_launch(
    order: Sequence[Instruction],
    chunk: int,
    chunk_layers: Sequence[int],
    places: Iterable[int | str],
    name: CollectiveName,
    at: Boundary,
) -> None:
    """Refuse a gradient-reduction launch point before the bucket's gradients exist.

    Args:
        order: This rank's executed instruction order.
        chunk: The model chunk of the bucket.
        chunk_layers: Transformer layers of each model chunk on this rank.
        places: Where the bucket's parameters sit (see :func:`ready_point`).
        name: The collective's name (for the message).
        at: The planned launch point.

    Raises:
        CollectivePlanError: ``at`` precedes the bucket's readiness, or is not a point inside the step.
    """
    num_layers = chunk_layers[chunk]
    earliest = Boundary(last_backward(order, chunk), ready_point(places, num_layers))
    at_layers = chunk_layers[at.instruction.chunk]
    if boundary_position(order, at, at_layers) < boundary_position(order, earliest, num_layers):
        raise CollectivePlanError(
            f"the plan launches {name} at the {boundary_label(at)}, before its gradients exist: they are "
            f"complete from the {boundary_label(earliest)} on (the last backward of model chunk {chunk} on "
            "this rank, once the layers holding the bucket's parameters have run). Rerun planning against "
            "this job's buckets (--ddp-bucket-size and the model decide them)"
        )
