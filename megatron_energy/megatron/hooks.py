"""Install the hooks that turn Megatron's execution into ``ScheduleListener`` events, patched or not.

Both paths feed one ``schedule_hooks.ScheduleHooks`` object, which decides what reaches the listener: events
only flow during *training* schedules (evaluation fires nothing), numbered as steps 0, 1, 2...

**Unpatched path** (``install_hooks``, used by ``python -m megatron_energy.launch``): nothing in Megatron's
files changes; two of its own extension points are used.

- *Timers proxy* (``hooked_timers.HookedTimers``) around Megatron's ``Timers`` (``config.timers``): the
  schedule's timer names fire the instruction hooks, the ids walked from this rank's expected order
  (``expected_order.ExpectedOrder``), and megatron-core's timers around the work outside instructions fire
  ``on_outside_begin/end`` (``grad-sync``, ``optimizer``, ``param-gather``).
- *Combined 1F1B* (``--overlap-moe-expert-parallel-comm``): ``install_hooks`` wraps
  ``combined_1f1b.combined_forward_backward_step`` (``traced_calls.combined_step_hooks``), one instruction per
  call, checked against the rank's combined order.
- *P2P communicator swap.* ``install_hooks`` points the module-global ``P2PCommunicator`` of
  ``megatron.core.pipeline_parallel.schedules`` at a subclass whose ``_communicate`` fires
  ``on_p2p_begin/end`` (``traced_calls.traced_p2p_communicator``).

**Patched path** (``patches/megatron-core-0.19``): ``schedules.py`` and ``p2p_communication.py`` call
``config.instruction_hooks`` (a ``ScheduleHooks``) with exact microbatch and chunk ids. Attach it with
``attach_hooks(model_config, listener)`` *after* the model is built (the config is deep-copied during
model construction, and it is not a dataclass field, so it never shows in config dumps). The patch set has
no outside-phase hooks: on this path the optimizer step and the gradient sync run at the clock of the
instruction before them (the plan runner says so in its log).

Hooks fire on the CPU when Megatron *launches* the work; nothing here synchronises the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from megatron_energy.events import ScheduleListener
from megatron_energy.megatron.expected_order import ExpectedOrder, current_rank_order
from megatron_energy.megatron.hooked_timers import HookedTimers
from megatron_energy.megatron.schedule_hooks import ScheduleHooks
from megatron_energy.megatron.traced_calls import combined_step_hooks, traced_p2p_communicator


@dataclass
class HookInstallation:
    """What ``install_hooks`` changed, so it can be undone.

    Attributes:
        hooks: The gate all events go through (its ``step`` counts the training steps seen).
    """

    hooks: ScheduleHooks
    _restore: list[Callable[[], None]] = field(default_factory=list)

    def on_uninstall(self, restore: Callable[[], None]) -> None:
        """Have :meth:`uninstall` call ``restore`` too (before what was installed earlier)."""
        self._restore.append(restore)

    def uninstall(self) -> None:
        """Put back every name ``install_hooks`` replaced."""
        while self._restore:
            self._restore.pop()()


def default_num_microbatches() -> int:
    """The microbatches of the current step, from Megatron's global microbatch calculator."""
    from megatron.core.num_microbatches_calculator import get_num_microbatches

    return get_num_microbatches()


def install_hooks(
    listener: ScheduleListener,
    *,
    num_microbatches_fn: Callable[[], int] = default_num_microbatches,
    microbatch_group_size: int | None = None,
    combined: bool = False,
) -> HookInstallation:
    """Install the unpatched-path hooks: the timers proxy and the P2P communicator swap.

    With ``combined`` (``--overlap-moe-expert-parallel-comm``) the combined 1F1B schedule's steps are
    reported by wrapping ``combined_1f1b.combined_forward_backward_step`` (``combined_step_hooks``).

    Call before Megatron creates its global timers (``set_global_variables``, inside
    ``parse_and_validate_args``); the launcher does. If they already exist they are wrapped in place.

    Args:
        listener: Receives the events of training schedules.
        num_microbatches_fn: Microbatches of the step that is starting (Megatron's calculator by default).
        microbatch_group_size: ``--microbatch-group-size-per-virtual-pipeline-stage``; ``None``: PP size.
        combined: Megatron runs the combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``).

    Returns:
        The installation; ``uninstall()`` restores Megatron's names.
    """
    from megatron.core.pipeline_parallel import combined_1f1b, schedules
    from megatron.training import global_vars

    hooks = ScheduleHooks(listener)
    expected = ExpectedOrder(
        lambda: current_rank_order(num_microbatches_fn(), microbatch_group_size, combined=combined)
    )

    def hooked_timers(timers: Any) -> HookedTimers:
        return HookedTimers(timers, hooks, expected, combined=combined)

    installation = HookInstallation(hooks)
    timers_class = global_vars.Timers
    original_communicator = schedules.P2PCommunicator

    def make_timers(log_level: int, log_option: str) -> HookedTimers:
        return hooked_timers(timers_class(log_level, log_option))

    if global_vars._GLOBAL_TIMERS is None:
        global_vars.Timers = make_timers
        installation._restore.append(lambda: setattr(global_vars, "Timers", timers_class))
    else:
        existing = global_vars._GLOBAL_TIMERS
        global_vars._GLOBAL_TIMERS = hooked_timers(existing)
        installation._restore.append(lambda: setattr(global_vars, "_GLOBAL_TIMERS", existing))
    schedules.P2PCommunicator = traced_p2p_communicator(original_communicator, hooks)
    installation._restore.append(lambda: setattr(schedules, "P2PCommunicator", original_communicator))
    if combined:
        step_function = combined_1f1b.combined_forward_backward_step
        combined_1f1b.combined_forward_backward_step = combined_step_hooks(step_function, hooks, expected)
        installation._restore.append(
            lambda: setattr(combined_1f1b, "combined_forward_backward_step", step_function)
        )
    return installation


def tree_is_patched() -> bool:
    """Whether the imported megatron-core carries the patch set's schedule hooks."""
    from megatron.core.pipeline_parallel import p2p_communication, schedules

    return hasattr(schedules, "_call_instruction_hook") and hasattr(p2p_communication, "_call_p2p_hook")


def attach_hooks(model_config: Any, listener: ScheduleListener) -> ScheduleHooks:
    """Patched path: attach the hooks the patched schedule calls, as ``model_config.instruction_hooks``.

    Args:
        model_config: The ``TransformerConfig`` of model chunk 0 (``get_model_config(model[0])``), after the
            model is built; the schedules and the P2P communicator read this object.
        listener: Receives the events of training schedules.

    Returns:
        The attached hooks.

    Raises:
        RuntimeError: The imported megatron-core is not patched.
    """
    if not tree_is_patched():
        from megatron.core.pipeline_parallel import schedules

        raise RuntimeError(
            f"megatron-core at {schedules.__file__} is not patched, so nothing would call the hooks; run "
            "`megatron-energy patch apply` on that tree, or start the job through `python -m "
            "megatron_energy.launch` instead"
        )
    hooks = ScheduleHooks(listener)
    model_config.instruction_hooks = hooks
    return hooks
