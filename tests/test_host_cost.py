"""The plugin's host time on the training thread (runtime/host_cost.py), alone and inside a session."""

from __future__ import annotations

import time

import pytest

from megatron_energy.runtime.host_cost import HostCost, host_timed


class _Hooks:
    def __init__(self) -> None:
        self.host_cost = HostCost()

    @host_timed
    def busy(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    @host_timed
    def fails(self) -> None:
        time.sleep(0.002)
        raise RuntimeError("hook failed")


def test_timed_hooks_add_their_time_to_the_running_step_even_when_they_raise() -> None:
    hooks = _Hooks()
    assert hooks.busy(0.003) == "done"
    with pytest.raises(RuntimeError, match="hook failed"):
        hooks.fails()
    assert hooks.host_cost.step_s >= 0.005
    hooks.host_cost.end_step(run_phase=False)  # a profiling step: not kept
    assert hooks.host_cost.run_steps_s == [] and hooks.host_cost.step_s == 0.0
    assert hooks.host_cost.summary(0, 1.0) is None


def test_the_summary_gives_the_mean_its_interval_and_the_share_of_the_iteration() -> None:
    cost = HostCost()
    for seconds in (0.001, 0.002, 0.003):
        cost.add(seconds)
        cost.end_step(run_phase=True)
    line = cost.summary(3, 0.5)
    assert line is not None
    assert line.startswith("[energy] rank 3: plugin host time on the training thread 2.000 ms per step")
    assert "3 run-phase steps, 0.400 % of the iteration; measured" in line
    interval = cost.interval()
    assert interval is not None and interval.low < 0.002 < interval.high
