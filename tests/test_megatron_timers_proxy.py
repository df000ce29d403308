"""The timers proxy, the evaluation gate and the order walker, on Megatron's real ``Timers`` in-process."""

from __future__ import annotations

import pytest
import torch
from megatron_harness import RecordingListener, warnings_silenced

from megatron_energy.megatron.expected_order import ExpectedOrder, ScheduleMismatchError
from megatron_energy.megatron.hooked_timers import HookedTimers
from megatron_energy.megatron.hooks import install_hooks
from megatron_energy.megatron.schedule_hooks import ScheduleHooks, p2p_op_name
from megatron_energy.pipeline.instruction import Instruction

ORDER = [("forward", 0, 0), ("forward", 1, 0), ("backward", 0, 0), ("backward", 1, 0)]
"""The events' ``(kind, microbatch, chunk)``."""
INSTRUCTIONS = tuple(Instruction(0, chunk, microbatch, kind) for kind, microbatch, chunk in ORDER)
"""The same order as the schedule tables give it."""


def _proxy(listener: RecordingListener, order: tuple[Instruction, ...] = INSTRUCTIONS) -> HookedTimers:
    with warnings_silenced():  # megatron-core's import-time notes about missing Transformer Engine / apex
        from megatron.core.timers import Timers

    return HookedTimers(Timers(0, "minmax"), ScheduleHooks(listener), ExpectedOrder(lambda: order))


def _replay(timers: HookedTimers, kinds: list[str]) -> None:
    timers("forward-backward", log_level=1).start(barrier=False)
    for kind in kinds:
        name = f"{kind}-compute"
        timers(name, log_level=2).start()
        timers(name).stop()
    timers("forward-backward").stop()


def test_hooks_fire_below_the_log_level_and_carry_the_expected_ids() -> None:
    listener = RecordingListener()
    timers = _proxy(listener)
    assert type(timers("forward-compute", log_level=2).timer).__name__ == "DummyTimer", "level 0 filters it"
    _replay(timers, ["forward", "forward", "backward", "backward"])
    _replay(timers, ["forward", "forward", "backward", "backward"])
    begins = [event[1:] for event in listener.events if event[0] == "instruction_begin"]
    assert begins == ORDER * 2
    assert [event for event in listener.events if event[0].startswith("step")] == [
        ("step_begin", 0),
        ("step_end", 0),
        ("step_begin", 1),
        ("step_end", 1),
    ]


def test_other_timers_pass_through_untouched() -> None:
    timers = _proxy(RecordingListener())
    assert timers("interval-time", log_level=0) is timers.timers("interval-time")
    assert timers.log == timers.timers.log


@pytest.mark.parametrize("evaluation", ["no_grad", "forward_only"])
def test_evaluation_schedules_fire_nothing(evaluation: str) -> None:
    listener = RecordingListener()
    hooks = ScheduleHooks(listener)
    if evaluation == "no_grad":
        with torch.no_grad():
            hooks.on_schedule_begin(forward_only=False)
    else:
        hooks.on_schedule_begin(forward_only=True)
    hooks.on_instruction_begin("forward", 0, 0)
    hooks.on_p2p_begin("send_next")
    hooks.on_schedule_end()
    assert listener.events == [] and hooks.step == 0
    hooks.on_schedule_begin(forward_only=False)
    hooks.on_schedule_end()
    assert listener.events == [("step_begin", 0), ("step_end", 0)]


def test_a_schedule_that_departs_from_megatrons_table_is_reported() -> None:
    timers = _proxy(RecordingListener())
    with pytest.raises(ScheduleMismatchError, match=r"is a backward, but .* predicts forward"):
        _replay(timers, ["backward"])
    walker = ExpectedOrder(lambda: INSTRUCTIONS)
    walker.start()
    walker.begin("forward")
    with pytest.raises(ScheduleMismatchError, match=r"ran 1 instructions but .* predicts 4"):
        walker.finish()


def test_p2p_op_names_list_the_directions_in_a_fixed_order() -> None:
    tensor = torch.zeros(1)
    assert p2p_op_name(tensor, None, False, True) == "send_next+recv_next"
    assert p2p_op_name(None, tensor, True, False) == "send_prev+recv_prev"
    assert p2p_op_name(None, None, False, False) == "none"


@pytest.mark.slow
def test_install_hooks_replaces_megatrons_timers_and_p2p_communicator_until_uninstalled() -> None:
    import argparse

    with warnings_silenced():
        from megatron.core.pipeline_parallel import schedules
        from megatron.training import global_vars

    timers_class, communicator = global_vars.Timers, schedules.P2PCommunicator
    assert global_vars._GLOBAL_TIMERS is None
    installation = install_hooks(RecordingListener(), num_microbatches_fn=lambda: 2)
    try:
        # what set_global_variables (inside parse_and_validate_args) does after the launcher installed
        global_vars._set_timers(argparse.Namespace(timing_log_level=0, timing_log_option="minmax"))
        assert isinstance(global_vars.get_timers(), HookedTimers)
        assert isinstance(global_vars.get_timers().timers, timers_class)
        assert schedules.P2PCommunicator is not communicator
        assert issubclass(schedules.P2PCommunicator, communicator)
    finally:
        installation.uninstall()
        global_vars._GLOBAL_TIMERS = None
    assert global_vars.Timers is timers_class and schedules.P2PCommunicator is communicator


def test_install_hooks_after_megatron_created_its_timers_wraps_them_in_place() -> None:
    with warnings_silenced():
        from megatron.training import global_vars

    existing = global_vars.Timers(0, "minmax")
    global_vars._GLOBAL_TIMERS = existing
    try:
        installation = install_hooks(RecordingListener())
        assert global_vars._GLOBAL_TIMERS.timers is existing
        installation.uninstall()
        assert global_vars._GLOBAL_TIMERS is existing
    finally:
        global_vars._GLOBAL_TIMERS = None
