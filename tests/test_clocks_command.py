"""`megatron-energy clocks status|reset`: leftover clocks and leases of killed jobs, reset the plugin's way.

Simulated GPUs (their state file is the GPU) and real GPUs with NVML mocked at its boundary (the pynvml
functions zeus calls, ``test_dvfs_backends.FakeNvml``); a dry run changes nothing, a live job's lease is never
touched, and without permission nothing is tried.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import zeus.device.gpu
from test_dvfs_backends import (  # noqa: F401 (fixtures)
    fresh_zeus,
    no_gpu_library,
    nvml,
    sys_admin,
)
from zeus.device.gpu.nvidia import pynvml

from megatron_energy.cli import main
from megatron_energy.dvfs.backends import open_zeus_gpus
from megatron_energy.dvfs.lease import OwnerProcess, lease_path, write_lease
from megatron_energy.dvfs.simulated import SimulatedGPUs, read_state
from megatron_energy.dvfs.spec import load_gpu_spec

LOCKED_MHZ = 1200


def _lease(gpus, folder: Path, alive: bool) -> Path:
    """GPU 0's lease, owned by this process (alive) or by a process that ended (a pid reused since)."""
    path = lease_path(gpus, 0, folder)
    write_lease(path, gpus, 0, LOCKED_MHZ, None)
    if not alive:
        data = json.loads(path.read_text())
        me = OwnerProcess.of(os.getpid())
        assert me.start_ticks is not None
        data["owners"] = {"trainer": {"pid": me.pid, "start_ticks": me.start_ticks - 1}}
        path.write_text(json.dumps(data))
    return path


def _simulated(tmp_path: Path, alive: bool) -> tuple[Path, Path, Path]:
    state = tmp_path / "state.json"
    gpus = SimulatedGPUs(load_gpu_spec("h200"), state_path=state)
    gpus.lock_clocks(0, LOCKED_MHZ, LOCKED_MHZ)
    folder = tmp_path / "run"
    return folder, state, _lease(gpus, folder, alive)


def _clocks(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["clocks", *args])
    return status, capsys.readouterr().out


@pytest.mark.usefixtures("no_gpu_library")
def test_status_lists_a_dead_jobs_lease_with_its_clocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, state, lease = _simulated(tmp_path, alive=False)
    status, out = _clocks(capsys, "status", "--run-dir", str(folder))
    assert status == 0
    assert "no GPUs here" in out
    assert f"{lease.name}: simulated GPU 0 ({state.resolve()}): stale: its job died" in out
    assert f"SM clock locked at {LOCKED_MHZ} MHz" in out and "(dead)" in out
    assert f"SM locked at {LOCKED_MHZ} MHz (modelled)" in out
    assert "clocks reset" in out


@pytest.mark.usefixtures("no_gpu_library")
def test_a_dry_run_says_what_it_would_reset_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, state, lease = _simulated(tmp_path, alive=False)
    status, out = _clocks(capsys, "reset", "--run-dir", str(folder))
    assert status == 0
    assert out.startswith("would reset: simulated GPU 0") and "dry run: nothing was changed" in out
    gpu = read_state(state)["gpus"][0]
    assert gpu["locked_sm_clock_mhz"] == LOCKED_MHZ and gpu["reset_calls"] == 0 and lease.exists()


@pytest.mark.usefixtures("no_gpu_library")
def test_apply_resets_a_dead_jobs_clocks_and_removes_its_lease(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, state, lease = _simulated(tmp_path, alive=False)
    status, out = _clocks(capsys, "reset", "--apply", "--run-dir", str(folder))
    assert status == 0 and out.startswith("reset: simulated GPU 0")
    gpu = read_state(state)["gpus"][0]
    assert gpu["locked_sm_clock_mhz"] is None and gpu["reset_calls"] == 1 and not lease.exists()


@pytest.mark.usefixtures("no_gpu_library")
def test_a_running_jobs_lease_is_never_touched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, state, lease = _simulated(tmp_path, alive=True)
    status, out = _clocks(capsys, "reset", "--apply", "--run-dir", str(folder))
    assert status == 0 and out.startswith("left alone: simulated GPU 0") and "its job still runs" in out
    gpu = read_state(state)["gpus"][0]
    assert gpu["locked_sm_clock_mhz"] == LOCKED_MHZ and gpu["reset_calls"] == 0 and lease.exists()


def _real_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alive: bool = False) -> tuple[Path, Path]:
    for name, mhz in (("nvmlDeviceGetClockInfo", LOCKED_MHZ), ("nvmlDeviceGetMaxClockInfo", 1980)):
        monkeypatch.setattr(pynvml, name, lambda handle, kind, mhz=mhz: mhz)
    gpus, failure = open_zeus_gpus()
    assert gpus is not None and failure is None
    folder = tmp_path / "run"
    return folder, _lease(gpus, folder, alive)


def test_without_permission_a_real_gpus_reset_is_refused_saying_why_and_nothing_is_tried(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake, capability = request.getfixturevalue("nvml"), request.getfixturevalue("sys_admin")
    capability(False)
    folder, lease = _real_lease(tmp_path, monkeypatch)
    status, out = _clocks(capsys, "status", "--run-dir", str(folder))
    assert f"GPU 0 NVIDIA H200: SM {LOCKED_MHZ} of 1980 MHz" in out
    assert f"(measured); lease {lease.name}, stale: its job died with the clocks locked" in out
    status, out = _clocks(capsys, "reset", "--apply", "--run-dir", str(folder))
    assert status == 1
    assert (
        out.startswith("failed: zeus GPU 0") and "no SYS_ADMIN capability and zeusd is not configured" in out
    )
    assert "run as root" in out and "ZEUSD_SOCK_PATH" in out
    assert fake.setter_calls() == [] and lease.exists()


def test_with_permission_apply_resets_through_the_plugins_repair_and_a_dry_run_sets_nothing(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake, capability = request.getfixturevalue("nvml"), request.getfixturevalue("sys_admin")
    capability(True)
    fake.setters_allowed = True
    folder, lease = _real_lease(tmp_path, monkeypatch)
    status, out = _clocks(capsys, "reset", "--run-dir", str(folder))
    assert status == 0 and out.startswith("would reset: zeus GPU 0") and fake.setter_calls() == []
    status, out = _clocks(capsys, "reset", "--apply", "--run-dir", str(folder))
    assert status == 0 and out.startswith("reset: zeus GPU 0") and "a job that died" in out
    assert fake.setter_calls() == ["nvmlDeviceResetGpuLockedClocks"] and not lease.exists()


def test_on_a_machine_without_gpus_stale_lease_files_are_removed_and_live_ones_kept(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    request.getfixturevalue("nvml")  # GPU 0 for its lease; then the machine loses its GPU library
    folder, stale = _real_lease(tmp_path, monkeypatch)
    data = json.loads(stale.read_text())
    data["owners"] = {
        "trainer": {"pid": os.getpid(), "start_ticks": OwnerProcess.of(os.getpid()).start_ticks}
    }
    live = stale.with_name("gpu-live.json")
    live.write_text(json.dumps(data))
    # then the machine has no GPU library (a CPU node sharing the run directory)
    monkeypatch.setattr(zeus.device.gpu, "_gpus", None)
    monkeypatch.setattr(zeus.device.gpu, "nvml_is_available", lambda: False)
    monkeypatch.setattr(zeus.device.gpu, "amdsmi_is_available", lambda: False)
    status, out = _clocks(capsys, "reset", "--run-dir", str(folder))
    assert "would remove: zeus GPU 0" in out and stale.exists()
    status, out = _clocks(capsys, "reset", "--apply", "--run-dir", str(folder))
    assert status == 0 and "removed: zeus GPU 0" in out and "left alone: zeus GPU 0" in out
    assert not stale.exists() and live.exists()
