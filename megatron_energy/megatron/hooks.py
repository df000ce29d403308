"""Turn Megatron's execution into ``ScheduleListener`` events, with or without the patch set.

Both paths feed one ``ScheduleHooks`` object, which decides what reaches the listener: events only flow
during *training* schedules (a schedule run with ``forward_only=True`` or under ``torch.no_grad()``, i.e.
evaluation, fires nothing), and it numbers the training schedules of this process as steps 0, 1, 2...
(a Megatron iteration that the rerun state machine repeats counts twice). The timers carry no
``forward_only``, so on the unpatched path evaluation is recognised by disabled gradients; Megatron's
``evaluate()`` runs under ``torch.no_grad()`` and also sets ``config.timers = None``.

**Unpatched path** (``install_hooks``, used by ``python -m megatron_energy.launch``): nothing in Megatron's
files changes; two of its own extension points are used.

- *Timers proxy.* ``HookedTimers`` wraps Megatron's ``Timers`` (``config.timers``). The schedules start and
  stop ``'forward-backward'`` around every schedule call, ``'forward-compute'`` in ``forward_step`` and
  ``'backward-compute'`` in ``backward_step``; the proxy fires hooks on those names *before* Megatron's
  log-level filter, so hooks fire at the default ``--timing-log-level 0`` and the level is never raised
  (a real ``Timer`` synchronises the GPU on every start/stop). The timers carry no ids, so
  ``ExpectedOrder`` walks this rank's order, replayed from megatron-core's own schedule tables
  (``schedule.megatron_schedule_tables``), and checks every observed kind against it.
- *Outside phases.* The same proxy fires ``on_outside_begin/end`` on the timers megatron-core starts
  around the work outside instructions: ``'all-grads-sync'`` (``finalize_model_grads``: the data-parallel
  gradient sync) as ``grad-sync``, ``'optimizer'`` (``train_step`` around ``optimizer.step()``) as
  ``optimizer``, and ``'params-all-gather'`` (the distributed optimizer's all-gather when
  ``--overlap-param-gather`` is off) as ``param-gather``. With ``--overlap-param-gather`` the all-gather runs
  on a communication stream beside the next step's first forward: not a phase of its own on the GPU's one
  SM clock, so it has no hook and runs at that instruction's clock.
- *Combined 1F1B* (``--overlap-moe-expert-parallel-comm``): every step of that schedule is one call of
  ``combined_1f1b.combined_forward_backward_step`` (a warm-up forward, a fused forward-backward pair, or a
  cool-down backward), which starts ``'forward-compute'`` but never ``'backward-compute'``. With
  ``combined=True`` the forward/backward timers fire nothing; ``install_hooks`` wraps that function instead,
  and each call fires one instruction: ``"fused"`` (with the forward's microbatch and chunk) for a pair,
  ``"forward"`` or ``"backward"`` for a pass alone. ``ExpectedOrder`` walks the rank's combined order and
  checks every call against it (which passes it runs, the forward's microbatch).
- *P2P communicator swap.* Schedules build ``P2PCommunicator(...)`` from the module-global name in
  ``megatron.core.pipeline_parallel.schedules``; ``install_hooks`` points that name at a subclass whose
  ``_communicate`` fires ``on_p2p_begin/end``.

**Patched path** (``patches/megatron-core-0.19``): ``schedules.py`` and ``p2p_communication.py`` call
``config.instruction_hooks`` (a ``ScheduleHooks``) with exact microbatch and chunk ids. Attach it with
``attach_hooks(model_config, listener)`` *after* the model is built (the config is deep-copied during
model construction, and it is not a dataclass field, so it never shows in config dumps). The patch set has
no outside-phase hooks: on this path the optimizer step and the gradient sync run at the clock of the
instruction before them (the plan runner says so in its log).

Hooks fire on the CPU when Megatron *launches* the work; nothing here synchronises the GPU.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from megatron_energy.errors import EnergyRuntimeError
from megatron_energy.events import CapturedStep, GraphStepListener, OutsidePhaseListener, ScheduleListener
from megatron_energy.megatron.schedule import megatron_schedule_tables
from megatron_energy.pipeline.instruction import FUSED, FusedInstruction, Step
from megatron_energy.pipeline.schedule_orders import pipeline_orders

RankOrder = Sequence[Step]

FORWARD = "forward"
BACKWARD = "backward"
STEP_TIMER = "forward-backward"
FORWARD_TIMER = "forward-compute"
BACKWARD_TIMER = "backward-compute"
OUTSIDE_TIMERS: dict[str, str] = {
    "all-grads-sync": "grad-sync",
    "optimizer": "optimizer",
    "params-all-gather": "param-gather",
}
"""megatron-core's timer names around work outside instructions -> the outside phase each marks."""


def p2p_op_name(tensor_send_next: Any, tensor_send_prev: Any, recv_prev: bool, recv_next: bool) -> str:
    """Name one ``P2PCommunicator._communicate`` call, e.g. ``"send_next+recv_next"``.

    Args:
        tensor_send_next: The tensor sent to the next stage, or ``None``.
        tensor_send_prev: The tensor sent to the previous stage, or ``None``.
        recv_prev: Whether a tensor is received from the previous stage.
        recv_next: Whether a tensor is received from the next stage.

    Returns:
        The directions joined by ``+`` in the order send_next, send_prev, recv_prev, recv_next.
    """
    parts = []
    if tensor_send_next is not None:
        parts.append("send_next")
    if tensor_send_prev is not None:
        parts.append("send_prev")
    if recv_prev:
        parts.append("recv_prev")
    if recv_next:
        parts.append("recv_next")
    return "+".join(parts) or "none"


class ScheduleHooks:
    """The one gate between Megatron and a listener; the patch set calls it as ``config.instruction_hooks``.

    Attributes:
        listener: Receives the events.
        step: The number of the next (or current) training schedule.
        in_training_schedule: True between the begin and end of a training (not evaluation) schedule.
        after_training_schedule: True from the end of a training schedule to the next schedule's begin (the
            optimizer step of a training iteration lies there).
    """

    p2p_op_name = staticmethod(p2p_op_name)

    def __init__(self, listener: ScheduleListener):
        """Create the gate.

        Args:
            listener: Receives the events of training schedules.
        """
        self.listener = listener
        self.step = 0
        self.in_training_schedule = False
        self.after_training_schedule = False

    def on_schedule_begin(self, forward_only: bool) -> None:
        """A schedule starts; it is a training step unless ``forward_only`` or gradients are disabled."""
        self.after_training_schedule = False
        self.in_training_schedule = not forward_only and torch.is_grad_enabled()
        if self.in_training_schedule:
            self.listener.on_step_begin(self.step)

    def on_schedule_end(self) -> None:
        """The schedule that began last returned."""
        if self.in_training_schedule:
            self.in_training_schedule = False
            self.after_training_schedule = True
            self.listener.on_step_end(self.step)
            self.step += 1

    def capture_graph(self, recorder: ScheduleListener, run: Callable[[], Any]) -> Any:
        """Run a step that captures the training step as a CUDA graph, its events going to ``recorder``.

        The step counts (its number is taken); afterwards the listener hears ``on_unmeasured_step`` with it,
        if it follows replayed graphs (``events.GraphStepListener``).

        Args:
            recorder: Receives the schedule's events during the capture (``full_iteration.CaptureRecorder``).
            run: Megatron's call that captures (and replays once).
        """
        listener, self.listener = self.listener, recorder
        step = self.step
        try:
            result = run()
        finally:
            self.listener = listener
        if self.step > step and isinstance(listener, GraphStepListener):
            listener.on_unmeasured_step(step)
        return result

    def replay_graph(self, captured: CapturedStep, run: Callable[[], Any]) -> Any:
        """Run a step that replays the captured training step: a training schedule without instruction hooks.

        Args:
            captured: The markers the graph records, handed to the listener before the replay.
            run: Megatron's call that replays the graph.
        """
        self.on_schedule_begin(forward_only=False)
        if self.in_training_schedule and isinstance(self.listener, GraphStepListener):
            self.listener.on_graph_replay(captured)
        try:
            return run()
        finally:
            self.on_schedule_end()

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Forward ``on_instruction_begin`` during a training schedule."""
        if self.in_training_schedule:
            self.listener.on_instruction_begin(kind, microbatch, chunk)

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Forward ``on_instruction_end`` during a training schedule."""
        if self.in_training_schedule:
            self.listener.on_instruction_end(kind, microbatch, chunk)

    def on_p2p_begin(self, op: str) -> None:
        """Forward ``on_p2p_begin`` during a training schedule."""
        if self.in_training_schedule:
            self.listener.on_p2p_begin(op)

    def on_p2p_end(self, op: str) -> None:
        """Forward ``on_p2p_end`` during a training schedule."""
        if self.in_training_schedule:
            self.listener.on_p2p_end(op)

    def on_outside_begin(self, name: str) -> None:
        """Forward ``on_outside_begin`` during or after a training schedule, to a listener that takes it."""
        if (self.in_training_schedule or self.after_training_schedule) and isinstance(
            self.listener, OutsidePhaseListener
        ):
            self.listener.on_outside_begin(name)

    def on_outside_end(self, name: str) -> None:
        """Forward ``on_outside_end`` like ``on_outside_begin``."""
        if (self.in_training_schedule or self.after_training_schedule) and isinstance(
            self.listener, OutsidePhaseListener
        ):
            self.listener.on_outside_end(name)


class ScheduleMismatchError(EnergyRuntimeError):
    """The instructions Megatron ran differ from the order ``pipeline_orders`` predicts for this rank."""


def current_rank_order(
    num_microbatches: int, microbatch_group_size: int | None = None, combined: bool = False
) -> RankOrder:
    """This rank's expected order of steps for the next schedule, from megatron-core's parallel state.

    Args:
        num_microbatches: Microbatches in the step.
        microbatch_group_size: ``--microbatch-group-size-per-virtual-pipeline-stage``; ``None``: PP size.
        combined: The combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``).

    Returns:
        This pipeline rank's steps (instructions; with ``combined``, fused pairs too) in execution order.
    """
    from megatron.core import parallel_state

    num_stages = parallel_state.get_pipeline_model_parallel_world_size()
    num_chunks = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
    rank = parallel_state.get_pipeline_model_parallel_rank()
    return _rank_order(num_stages, num_microbatches, num_chunks, microbatch_group_size, rank, combined)


@functools.lru_cache(maxsize=16)
def _rank_order(
    num_stages: int,
    num_microbatches: int,
    num_chunks: int,
    microbatch_group_size: int | None,
    rank: int,
    combined: bool,
) -> RankOrder:
    """``pipeline_orders`` for one rank, once per schedule shape (which changes only with batch ramp-up)."""
    orders = pipeline_orders(
        num_stages,
        num_microbatches,
        num_chunks,
        microbatch_group_size=microbatch_group_size,
        combined=combined,
        tables=megatron_schedule_tables,
    )
    return orders.steps(rank)


class ExpectedOrder:
    """Gives the ids of the instructions the timers report by walking this rank's expected order."""

    def __init__(self, order_fn: Callable[[], RankOrder]):
        """Create the walker.

        Args:
            order_fn: Returns this rank's order for the schedule that is starting.
        """
        self._order_fn = order_fn
        self._order: RankOrder = ()
        self._position = 0
        self._running: dict[str, tuple[int, int]] = {}

    def start(self) -> None:
        """A training schedule starts: fetch its order."""
        self._order = self._order_fn()
        self._position = 0
        self._running.clear()

    def begin(self, kind: str) -> tuple[int, int]:
        """An instruction of ``kind`` starts; return its ``(microbatch, chunk)``.

        Raises:
            ScheduleMismatchError: Megatron ran another kind, or more instructions, than expected.
        """
        if self._position >= len(self._order) or self._order[self._position].kind != kind:
            expected = self._order[self._position].kind if self._position < len(self._order) else "nothing"
            raise ScheduleMismatchError(
                f"instruction {self._position} of this step is a {kind}, but megatron-core's schedule table "
                f"predicts {expected} (order of {len(self._order)} instructions); this configuration changes "
                "Megatron's schedule in a way the launcher cannot follow: apply the patch set "
                "(`megatron-energy patch apply`) so the schedule reports its own ids"
            )
        step = self._order[self._position]
        chunk, microbatch = step.chunk, step.microbatch  # a fused step's are its forward's
        self._position += 1
        self._running[kind] = (microbatch, chunk)
        return microbatch, chunk

    def end(self, kind: str) -> tuple[int, int]:
        """The running instruction of ``kind`` ends; return its ``(microbatch, chunk)``."""
        return self._running.pop(kind)

    def begin_step(self, has_forward: bool, has_backward: bool, forward_microbatch: int | None) -> Step:
        """A combined 1F1B step starts (``combined_forward_backward_step``); return the expected step.

        Args:
            has_forward: The call runs a forward (``f_model`` given).
            has_backward: The call runs a backward (``b_model`` given).
            forward_microbatch: The call's ``current_microbatch`` (``None`` where megatron-core passes none).

        Raises:
            ScheduleMismatchError: The call runs other passes, or another forward microbatch, than the order.
        """
        kind = FUSED if has_forward and has_backward else "forward" if has_forward else "backward"
        self.begin(kind)
        step = self._order[self._position - 1]
        forward = step.forward if isinstance(step, FusedInstruction) else step
        if has_forward and forward_microbatch is not None and forward_microbatch != forward.microbatch:
            raise ScheduleMismatchError(
                f"combined 1F1B step {self._position - 1} of this step runs the forward of microbatch "
                f"{forward_microbatch}, but megatron-core's schedule table predicts {step.label}"
            )
        return step

    def finish(self) -> None:
        """The schedule ended; check that every expected instruction ran.

        Raises:
            ScheduleMismatchError: Fewer instructions ran than expected.
        """
        if self._position != len(self._order):
            raise ScheduleMismatchError(
                f"the step ran {self._position} instructions but megatron-core's schedule table predicts "
                f"{len(self._order)}; check --num-microbatches/--global-batch-size, or apply the patch set"
            )


class _HookedTimer:
    """One Megatron timer whose start/stop also fire hooks (begin after start, end before stop)."""

    __slots__ = ("_on_start", "_on_stop", "timer")

    def __init__(self, timer: Any, on_start: Callable[[], None], on_stop: Callable[[], None]):
        self.timer = timer
        self._on_start = on_start
        self._on_stop = on_stop

    def start(self, barrier: bool = False) -> None:
        self.timer.start(barrier=barrier)
        self._on_start()

    def stop(self, barrier: bool = False) -> None:
        self._on_stop()
        self.timer.stop(barrier=barrier)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.timer, name)


class HookedTimers:
    """Megatron's ``Timers`` with hooks on the schedule's timer names; every other use passes through."""

    def __init__(self, timers: Any, hooks: ScheduleHooks, expected: ExpectedOrder, combined: bool = False):
        """Wrap ``timers``.

        Args:
            timers: Megatron's ``Timers`` (or anything callable as ``timers(name, log_level=None)``).
            hooks: The gate the events go through.
            expected: Supplies microbatch and chunk ids.
            combined: The combined 1F1B schedule runs: its steps are reported by ``combined_step_hooks``, so
                the forward and backward timers fire nothing.
        """
        self.timers = timers
        self.hooks = hooks
        self.expected = expected
        self._handlers: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
            STEP_TIMER: (self._schedule_begin, self._schedule_end),
        }
        if not combined:
            self._handlers[FORWARD_TIMER] = (self._forward_begin, self._forward_end)
            self._handlers[BACKWARD_TIMER] = (self._backward_begin, self._backward_end)
        for timer_name, phase in OUTSIDE_TIMERS.items():
            self._handlers[timer_name] = (
                functools.partial(hooks.on_outside_begin, phase),
                functools.partial(hooks.on_outside_end, phase),
            )
        self._hooked: dict[str, _HookedTimer] = {}

    def __call__(self, name: str, log_level: int | None = None) -> Any:
        """Return Megatron's timer for ``name``, hooked when the schedule uses it to mark work."""
        timer = self.timers(name, log_level)
        handlers = self._handlers.get(name)
        if handlers is None:
            return timer
        hooked = self._hooked.get(name)
        if hooked is None or hooked.timer is not timer:
            hooked = self._hooked[name] = _HookedTimer(timer, *handlers)
        return hooked

    def __getattr__(self, name: str) -> Any:
        return getattr(self.timers, name)

    def _schedule_begin(self) -> None:
        self.hooks.on_schedule_begin(forward_only=not torch.is_grad_enabled())
        if self.hooks.in_training_schedule:
            self.expected.start()

    def _schedule_end(self) -> None:
        if self.hooks.in_training_schedule:
            self.expected.finish()
        self.hooks.on_schedule_end()

    def _forward_begin(self) -> None:
        if self.hooks.in_training_schedule:
            self.hooks.on_instruction_begin(FORWARD, *self.expected.begin(FORWARD))

    def _forward_end(self) -> None:
        if self.hooks.in_training_schedule:
            self.hooks.on_instruction_end(FORWARD, *self.expected.end(FORWARD))

    def _backward_begin(self) -> None:
        if self.hooks.in_training_schedule:
            self.hooks.on_instruction_begin(BACKWARD, *self.expected.begin(BACKWARD))

    def _backward_end(self) -> None:
        if self.hooks.in_training_schedule:
            self.hooks.on_instruction_end(BACKWARD, *self.expected.end(BACKWARD))


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
