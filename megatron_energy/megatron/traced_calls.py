"""Megatron calls wrapped so they fire schedule events (the unpatched path, beside the timers proxy).

- *Combined 1F1B* (``--overlap-moe-expert-parallel-comm``): every step of that schedule is one call of
  ``combined_1f1b.combined_forward_backward_step`` (a warm-up forward, a fused forward-backward pair, or a
  cool-down backward), which starts ``'forward-compute'`` but never ``'backward-compute'``;
  :func:`combined_step_hooks` wraps that function, and each call fires one instruction: ``"fused"`` (with the
  forward's microbatch and chunk) for a pair, ``"forward"`` or ``"backward"`` for a pass alone.
- *P2P communicator.* Schedules build ``P2PCommunicator(...)`` from the module-global name in
  ``megatron.core.pipeline_parallel.schedules``; :func:`traced_p2p_communicator` builds the subclass that
  name is pointed at, whose ``_communicate`` fires ``on_p2p_begin/end``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from megatron_energy.megatron.expected_order import ExpectedOrder
from megatron_energy.megatron.schedule_hooks import ScheduleHooks, p2p_op_name


def combined_step_hooks(
    step_function: Callable[..., Any], hooks: ScheduleHooks, expected: ExpectedOrder
) -> Any:
    """Wrap megatron-core's ``combined_forward_backward_step`` so every call fires one instruction's hooks.

    Args:
        step_function: ``megatron.core.pipeline_parallel.combined_1f1b.combined_forward_backward_step``.
        hooks: The gate the events go through.
        expected: Walks this rank's combined order and checks each call against it.

    Returns:
        The wrapper: ``on_instruction_begin`` before the call, ``on_instruction_end`` after it (also when it
        raises), with kind ``"fused"`` (and the forward's ids) for a fused pair.
    """
    signature = inspect.signature(step_function)

    @functools.wraps(step_function)
    def combined_forward_backward_step(*args: Any, **kwargs: Any) -> Any:
        if not hooks.in_training_schedule:
            return step_function(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        step = expected.begin_step(
            bound.arguments.get("f_model") is not None,
            bound.arguments.get("b_model") is not None,
            bound.arguments.get("current_microbatch"),
        )
        kind, chunk, microbatch = step.kind, step.chunk, step.microbatch  # a fused step's are its forward's
        hooks.on_instruction_begin(kind, microbatch, chunk)
        try:
            return step_function(*args, **kwargs)
        finally:
            hooks.on_instruction_end(kind, microbatch, chunk)

    return combined_forward_backward_step


def traced_p2p_communicator(base: type[Any], hooks: ScheduleHooks) -> type[Any]:
    """Subclass megatron-core's ``P2PCommunicator`` so every ``_communicate`` call fires p2p hooks.

    Args:
        base: ``megatron.core.pipeline_parallel.p2p_communication.P2PCommunicator``.
        hooks: The gate the events go through.

    Returns:
        The subclass; ``on_p2p_end`` fires on every exit of ``_communicate``.
    """

    def _communicate(self: Any, **kwargs: Any) -> Any:
        op = p2p_op_name(
            kwargs.get("tensor_send_next"),
            kwargs.get("tensor_send_prev"),
            kwargs.get("recv_prev", False),
            kwargs.get("recv_next", False),
        )
        hooks.on_p2p_begin(op)
        try:
            return base._communicate(self, **kwargs)
        finally:
            hooks.on_p2p_end(op)

    return type("TracedP2PCommunicator", (base,), {"_communicate": _communicate, "__module__": __name__})
