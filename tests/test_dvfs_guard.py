"""Clocks a process locked are reset however it ends: exit, exception, SIGINT, SIGTERM, SIGKILL (watchdog).

Each ending runs in a child "trainer" process that locks the clock of a simulated GPU through the controller;
the test observes the simulated GPUs' state file from outside.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from unittest import mock

import pytest
from zeus.device.gpu.common import GPUs

from megatron_energy.dvfs.guard import ClockGuard
from megatron_energy.dvfs.simulated import read_state

LOCKED_MHZ = 1200

TRAINER = textwrap.dedent(
    """
    import signal, sys, time
    from megatron_energy.dvfs.controller import FrequencyController
    from megatron_energy.dvfs.guard import ClockGuard
    from megatron_energy.dvfs.simulated import SimulatedGPUs
    from megatron_energy.dvfs.spec import load_gpu_spec

    state_path, ending = sys.argv[1], sys.argv[2]
    if ending == "sigint":
        def earlier_handler(signum, frame):
            print("earlier SIGINT handler ran", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGINT, earlier_handler)
    gpus = SimulatedGPUs(load_gpu_spec("h200"), state_path=state_path)
    guard = ClockGuard(gpus, watchdog=ending == "sigkill", watchdog_poll_s=0.1)
    clocks = gpus.get_supported_graphics_clocks(0)
    controller = FrequencyController(gpus, 0, clocks, dry_run=False, guard=guard)
    controller.request({locked})
    assert controller.flush(5)
    print("locked", guard.watchdog_pid, flush=True)
    if ending == "exception":
        with guard:
            raise RuntimeError("training crashed")
    if ending != "exit":
        time.sleep(60)
    """
).format(locked=LOCKED_MHZ)


def start_trainer(tmp_path: Path, ending: str) -> tuple[subprocess.Popen, Path, str]:
    state_path = tmp_path / "state.json"
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(state_path), ending],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first_line = trainer.stdout.readline()
    assert first_line.startswith("locked"), trainer.stderr.read()
    return trainer, state_path, first_line


def locked_clock(state_path: Path) -> int | None:
    return read_state(state_path)["gpus"][0]["locked_sm_clock_mhz"]


def assert_locked_then_reset(state_path: Path) -> None:
    gpu = read_state(state_path)["gpus"][0]
    assert (gpu["set_calls"], gpu["locked_sm_clock_mhz"]) == (1, None)
    assert gpu["reset_calls"] >= 1


def wait_for_reset(state_path: Path, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while locked_clock(state_path) is not None:
        assert time.monotonic() < deadline, "clock still locked"
        time.sleep(0.02)


def process_finished(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


@pytest.mark.slow
def test_sigkill_leaves_reset_to_the_watchdog(tmp_path):
    trainer, state_path, first_line = start_trainer(tmp_path, "sigkill")
    watchdog_pid = int(first_line.split()[1])
    assert locked_clock(state_path) == LOCKED_MHZ
    trainer.send_signal(signal.SIGKILL)
    assert trainer.wait(10) == -signal.SIGKILL
    wait_for_reset(state_path)
    assert read_state(state_path)["gpus"][0]["reset_calls"] == 1
    deadline = time.monotonic() + 10
    while not process_finished(watchdog_pid):
        assert time.monotonic() < deadline, "watchdog did not exit"
        time.sleep(0.02)


@pytest.mark.slow
def test_sigterm_resets_then_dies_by_the_default_action(tmp_path):
    trainer, state_path, _ = start_trainer(tmp_path, "sigterm")
    assert locked_clock(state_path) == LOCKED_MHZ
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(10) == -signal.SIGTERM
    assert_locked_then_reset(state_path)


@pytest.mark.slow
def test_sigint_resets_then_chains_the_earlier_handler(tmp_path):
    trainer, state_path, _ = start_trainer(tmp_path, "sigint")
    assert locked_clock(state_path) == LOCKED_MHZ
    trainer.send_signal(signal.SIGINT)
    assert trainer.wait(10) == 3
    assert "earlier SIGINT handler ran" in trainer.stdout.read()
    assert_locked_then_reset(state_path)


@pytest.mark.slow
@pytest.mark.parametrize("ending, exit_code", [("exception", 1), ("exit", 0)])
def test_exception_and_normal_exit_reset(tmp_path, ending, exit_code):
    trainer, state_path, _ = start_trainer(tmp_path, ending)
    assert trainer.wait(10) == exit_code
    assert_locked_then_reset(state_path)


def _settings_changed(gpus: mock.MagicMock) -> list[mock._Call]:
    """The setter and reset calls made on a mocked ``GPUs`` (queries such as ``get_name`` left out)."""
    return [call for call in gpus.method_calls if call[0].startswith(("set_", "reset_"))]


def test_guard_only_ever_resets_sm_clocks_of_armed_gpus():
    gpus = mock.create_autospec(GPUs, instance=True)
    guard = ClockGuard(gpus, watchdog=False, handle_signals=False)
    guard.restore()
    assert gpus.method_calls == []  # nothing armed (e.g. dry run): nothing touched
    guard.arm(1)
    guard.close()
    assert _settings_changed(gpus) == [mock.call.reset_gpu_locked_clocks(1)]
    assert guard.armed == frozenset()


def test_close_removes_its_signal_handlers():
    before = signal.getsignal(signal.SIGTERM)
    guard = ClockGuard(mock.create_autospec(GPUs, instance=True), watchdog=False)
    assert signal.getsignal(signal.SIGTERM) != before
    guard.close()
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.slow
def test_watchdog_exits_quietly_after_a_clean_close(tmp_path):
    gpus = mock.create_autospec(GPUs, instance=True)
    guard = ClockGuard(gpus, handle_signals=False)
    pid = guard.watchdog_pid
    guard.arm(0)
    guard.close()
    assert process_finished(pid) or os.waitpid(pid, os.WNOHANG)[0] == pid
    assert _settings_changed(gpus) == [mock.call.reset_gpu_locked_clocks(0)]
