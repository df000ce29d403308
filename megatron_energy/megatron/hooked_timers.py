"""``HookedTimers``: Megatron's ``Timers`` behind a proxy that fires schedule events (the unpatched path).

- *Instructions.* The schedules start and stop ``'forward-backward'`` around every schedule call,
  ``'forward-compute'`` in ``forward_step`` and ``'backward-compute'`` in ``backward_step``; the proxy fires
  hooks on those names *before* Megatron's log-level filter, so hooks fire at the default
  ``--timing-log-level 0`` and the level is never raised (a real ``Timer`` synchronises the GPU on every
  start/stop). The timers carry no ids, so ``expected_order.ExpectedOrder`` supplies them. Evaluation is
  recognised by disabled gradients (the timers carry no ``forward_only``; Megatron's ``evaluate()`` runs under
  ``torch.no_grad()``).
- *Outside phases.* The same proxy fires ``on_outside_begin/end`` on the timers megatron-core starts around
  the work outside instructions: ``'all-grads-sync'`` (``finalize_model_grads``: the data-parallel gradient
  sync) as ``grad-sync``, ``'optimizer'`` (``train_step`` around ``optimizer.step()``) as ``optimizer``, and
  ``'params-all-gather'`` (the distributed optimizer's all-gather when ``--overlap-param-gather`` is off) as
  ``param-gather``. With ``--overlap-param-gather`` the all-gather runs on a communication stream beside the
  next step's first forward: not a phase of its own on the GPU's one SM clock, so it has no hook and runs at
  that instruction's clock.
- *Combined 1F1B.* With ``combined=True`` the forward/backward timers fire nothing: the combined schedule's
  steps are reported by ``traced_calls.combined_step_hooks``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from megatron_energy.megatron.expected_order import ExpectedOrder
from megatron_energy.megatron.schedule_hooks import ScheduleHooks

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
