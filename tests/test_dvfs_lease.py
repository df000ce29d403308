"""Clock leases: a trainer and its watchdog both SIGKILLed leave a lease, and the next start on that GPU
resets the clock and says so; a live owner's GPU is left alone; normal resets remove the lease; dry runs
never write or act on leases. Simulated GPUs only (their state file is the GPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_dvfs_guard import LOCKED_MHZ, process_finished, start_trainer

from megatron_energy.dvfs.backends import open_gpus
from megatron_energy.dvfs.controller import FrequencyController
from megatron_energy.dvfs.guard import ClockGuard
from megatron_energy.dvfs.lease import (
    RUN_DIR_ENV,
    OwnerProcess,
    lease_path,
    process_start_ticks,
    repair_stale_lease,
    run_dir,
)
from megatron_energy.dvfs.simulated import SimulatedGPUs, read_state
from megatron_energy.dvfs.spec import load_gpu_spec


@pytest.fixture(autouse=True)
def lease_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "run"
    monkeypatch.setenv(RUN_DIR_ENV, str(folder))
    return folder


def _leases(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("gpu-*.json"))]


def _wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 10
    while not process_finished(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_trainer_and_watchdog_both_killed_leave_a_lease_and_the_next_start_resets_the_clock(
    tmp_path: Path, lease_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, state_path, first_line = start_trainer(tmp_path, "sigkill")
    watchdog_pid = int(first_line.split()[1])
    (lease,) = _leases(lease_dir)
    assert lease["locked_clock_mhz"] == LOCKED_MHZ
    assert lease["gpu"] == {"backend": "simulated", "index": 0, "state_path": str(state_path.resolve())}
    assert lease["owners"]["trainer"] == {"pid": trainer.pid, "start_ticks": process_start_ticks(trainer.pid)}
    assert lease["owners"]["watchdog"]["pid"] == watchdog_pid

    os.kill(watchdog_pid, signal.SIGKILL)
    _wait_dead(watchdog_pid)
    trainer.kill()
    assert trainer.wait(10) == -signal.SIGKILL
    assert read_state(state_path)["gpus"][0]["locked_sm_clock_mhz"] == LOCKED_MHZ, "nobody reset it"

    handle = open_gpus("simulated", "h200", False, local_index=0, num_simulated_gpus=1, state_path=state_path)

    (err,) = [
        record.getMessage() for record in caplog.records if record.name == "megatron_energy.dvfs.backends"
    ]
    assert f"pids trainer {trainer.pid}, watchdog {watchdog_pid}" in err
    assert f"left its SM clock locked at {LOCKED_MHZ} MHz; reset it" in err
    assert handle.mode == "control"
    assert read_state(state_path)["gpus"][0]["reset_calls"] == 1, "reset through the GPUs' own reset call"
    assert _leases(lease_dir) == []


@pytest.mark.slow
def test_a_live_owner_keeps_its_gpu_and_this_job_goes_monitor_only(
    tmp_path: Path, lease_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, state_path, _ = start_trainer(tmp_path, "sigterm")
    try:
        handle = open_gpus(
            "simulated", "h200", False, local_index=0, num_simulated_gpus=1, state_path=state_path
        )
        assert handle.mode == "monitor-only"
        assert f"GPU 0 is held by another job (pids trainer {trainer.pid}" in handle.reason
        assert len(_leases(lease_dir)) == 1, "the live job's lease stays"
        assert "reset it" not in caplog.text
    finally:
        trainer.terminate()
        trainer.wait(10)
    assert _leases(lease_dir) == [], "the trainer's own reset at SIGTERM removes its lease"


@pytest.mark.slow
def test_the_watchdogs_reset_removes_the_lease(tmp_path: Path, lease_dir: Path) -> None:
    trainer, _, first_line = start_trainer(tmp_path, "sigkill")
    assert len(_leases(lease_dir)) == 1
    trainer.kill()
    trainer.wait(10)
    _wait_dead(int(first_line.split()[1]))
    assert _leases(lease_dir) == []


def test_a_reused_pid_is_not_taken_for_the_owner(lease_dir: Path, tmp_path: Path) -> None:
    gpus = SimulatedGPUs(load_gpu_spec("h200"), state_path=tmp_path / "state.json")
    gpus.lock_clocks(0, LOCKED_MHZ, LOCKED_MHZ)
    path = lease_path(gpus, 0)
    me = OwnerProcess.of(os.getpid())
    assert me.start_ticks is not None and me.is_alive()
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "owners": {"trainer": {"pid": me.pid, "start_ticks": me.start_ticks - 1}},
                "host": os.uname().nodename,
                "locked_clock_mhz": LOCKED_MHZ,
            }
        )
    )
    usable, message = repair_stale_lease(gpus, 0)
    assert usable and message is not None and "a job that died" in message
    assert gpus.state(0).locked_sm_clock_mhz is None and not path.exists()


@pytest.mark.slow
def test_dry_runs_neither_write_nor_act_on_leases(
    tmp_path: Path, lease_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, state_path, first_line = start_trainer(tmp_path, "sigkill")
    os.kill(int(first_line.split()[1]), signal.SIGKILL)
    _wait_dead(int(first_line.split()[1]))
    trainer.kill()
    trainer.wait(10)
    stale = _leases(lease_dir)
    assert len(stale) == 1

    handle = open_gpus("simulated", "h200", True, local_index=0, num_simulated_gpus=1, state_path=state_path)
    assert handle.mode == "dry-run" and _leases(lease_dir) == stale
    guard = ClockGuard(handle.gpus, watchdog=False, handle_signals=False)
    controller = FrequencyController.from_handle(handle, 0, guard=guard)
    controller.request(LOCKED_MHZ)
    controller.close()
    guard.close()
    assert _leases(lease_dir) == stale, "no lease written, none removed"
    assert "reset it" not in caplog.text


def test_the_run_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "elsewhere"))
    assert run_dir() == tmp_path / "elsewhere"


@pytest.mark.slow
def test_a_process_that_ended_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = OwnerProcess.of(child.pid)
    assert owner.start_ticks is not None
    child.wait()
    assert not owner.is_alive()
