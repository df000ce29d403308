"""The plugin's host time on the training thread (runtime/energy_log/host_cost.py), alone and inside a
session."""

from __future__ import annotations

import time

import pytest

from megatron_energy.runtime.energy_log.host_cost import HostCost, host_timed


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


def test_the_plugins_background_threads_cpu_time_is_counted_per_run_phase_step() -> None:
    """A thread registered as the plugin's (``plugin_threads``) burns CPU during two run-phase steps."""
    import threading

    from megatron_energy.plugin_threads import register_current_thread

    cost = HostCost()
    cost.end_step(run_phase=False)  # a profiling step: the threads' clocks are read, nothing is kept
    burn, done, release = threading.Event(), threading.Event(), threading.Event()

    def burner() -> None:
        register_current_thread("test burner")
        burn.wait()
        began = time.thread_time()
        while time.thread_time() - began < 0.05:  # 50 ms of CPU on this thread
            pass
        done.set()
        release.wait(10)

    thread = threading.Thread(target=burner)
    thread.start()
    time.sleep(0.01)
    cost.end_step(run_phase=False)  # the burner is registered now: its clock's start is read here
    burn.set()
    done.wait(10)
    cost.end_step(run_phase=True)
    release.set()
    thread.join()
    cost.end_step(run_phase=True)  # the thread has ended: its last reading stands, adding nothing
    assert 0.05 <= cost.run_by_thread_s["test burner"] < 0.5
    assert cost.background_s_per_step() == pytest.approx(sum(cost.run_by_thread_s.values()) / 2)
    line = cost.summary(0, 1.0)
    assert line is not None and "background threads' CPU time" in line and "test burner" in line
