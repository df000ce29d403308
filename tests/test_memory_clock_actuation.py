"""The run phase's memory clock on the GPU: simulated GPUs model it, the controller sets, records and restores
it like the SM clock, the guard resets it, and a GPU that refuses leaves the run at the stock memory clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from zeus.device.gpu.common import ZeusGPUInvalidArgError, ZeusGPUNotSupportedError

from megatron_energy.dvfs.controller import FrequencyController
from megatron_energy.dvfs.guard import ClockGuard
from megatron_energy.dvfs.memory_clock_setter import MemoryClockRecord
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.simulated import SimulatedGPUs, read_state, reset_state_file
from megatron_energy.dvfs.spec import load_gpu_spec

SPEC = load_gpu_spec("h100-sxm")
TOP, LOW = SPEC.memory_clocks_mhz
WORK = WorkProfile(compute_s=0.01, memory_s=0.02)


@pytest.fixture
def gpus(tmp_path: Path) -> SimulatedGPUs:
    return SimulatedGPUs(SPEC, num_gpus=2, state_path=tmp_path / "gpus.json")


def _controller(gpus: SimulatedGPUs, dry_run: bool, guard: ClockGuard | None = None) -> FrequencyController:
    return FrequencyController(gpus, 0, SPEC.sm_clocks_mhz, dry_run=dry_run, guard=guard, synchronous=True)


def test_simulated_gpu_runs_work_and_waits_at_its_memory_clock(gpus: SimulatedGPUs) -> None:
    model = GpuPowerModel(SPEC)
    gpus.set_memory_locked_clocks(1, LOW, LOW)
    assert read_state(gpus.state_path)["gpus"][1]["memory_clock_mhz"] == LOW
    stock_time_s, stock_energy_j = gpus.execute(0, WORK)
    time_s, energy_j = gpus.execute(1, WORK)
    assert time_s == pytest.approx(model.time_s(WORK, SPEC.default_sm_clock_mhz, LOW))
    assert energy_j == pytest.approx(model.energy_j(WORK, SPEC.default_sm_clock_mhz, LOW))
    assert time_s > stock_time_s  # its memory-bound part stretches
    saving_w = SPEC.memory_idle_power_w * (1 - LOW / TOP)
    assert gpus.wait(1, 1.0, blocked=False) == pytest.approx(SPEC.idle_power_w - saving_w)
    gpus.reset_memory_locked_clocks(1)
    assert gpus.execute(1, WORK) == pytest.approx((stock_time_s, stock_energy_j))


def test_simulated_gpu_refuses_a_memory_clock_it_does_not_list(gpus: SimulatedGPUs) -> None:
    with pytest.raises(ZeusGPUInvalidArgError, match="memory clocks"):
        gpus.set_memory_locked_clocks(0, 1500, 1500)


def test_watchdog_reset_of_the_state_file_restores_the_memory_clock(gpus: SimulatedGPUs) -> None:
    gpus.set_memory_locked_clocks(0, LOW, LOW)
    reset_state_file(gpus.state_path, [0])
    assert read_state(gpus.state_path)["gpus"][0]["memory_clock_mhz"] is None


def test_dry_run_records_the_memory_clock_and_its_restore_without_touching_the_gpu(
    gpus: SimulatedGPUs,
) -> None:
    controller = _controller(gpus, dry_run=True)
    controller.set_memory_clock(LOW)
    controller.set_memory_clock(LOW)  # a repeat is dropped
    assert controller.memory.current_mhz == LOW
    assert gpus.state(0).memory_clock_mhz is None
    controller.close()
    assert controller.memory.records == [MemoryClockRecord(LOW, True), MemoryClockRecord(None, True)]
    assert gpus.state(0).memory_clock_mhz is None


def test_controller_sets_the_memory_clock_and_restores_it_at_close(
    gpus: SimulatedGPUs, tmp_path: Path
) -> None:
    with ClockGuard(gpus, watchdog=False, handle_signals=False, lease_dir=tmp_path) as guard:
        controller = _controller(gpus, dry_run=False, guard=guard)
        controller.set_memory_clock(LOW)
        assert gpus.state(0).memory_clock_mhz == LOW
        assert 0 in guard.armed
        controller.close()
        assert gpus.state(0).memory_clock_mhz is None
        assert controller.memory.records == [MemoryClockRecord(LOW, False), MemoryClockRecord(None, False)]


def test_guard_restores_a_memory_clock_left_locked(gpus: SimulatedGPUs, tmp_path: Path) -> None:
    guard = ClockGuard(gpus, watchdog=False, handle_signals=False, lease_dir=tmp_path)
    controller = _controller(gpus, dry_run=False, guard=guard)
    controller.set_memory_clock(LOW)
    guard.restore()  # e.g. a signal: the guard resets what the controller locked
    assert gpus.state(0).memory_clock_mhz is None
    controller.close(reset_clocks=False)
    guard.close()


class _RefusingGPUs(SimulatedGPUs):
    """Simulated GPUs whose memory clock cannot be locked (no permission, or a GPU that does not allow it)."""

    def set_memory_locked_clocks(
        self, gpu_index: int, min_clock_mhz: int, max_clock_mhz: int, block: bool = True
    ) -> None:
        raise ZeusGPUNotSupportedError("memory clock locking is not supported")


def test_a_gpu_that_refuses_keeps_the_stock_memory_clock_with_one_message_and_the_sm_clocks_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpus = _RefusingGPUs(SPEC, state_path=tmp_path / "gpus.json")
    controller = _controller(gpus, dry_run=False)
    with caplog.at_level(logging.WARNING):
        controller.set_memory_clock(LOW)
        controller.set_memory_clock(LOW)
    refusals = [record for record in caplog.records if "refused memory clock" in record.message]
    assert len(refusals) == 1
    assert "keeps the stock memory clock" in refusals[0].message
    assert controller.memory.current_mhz is None and controller.memory.records == []
    assert controller.request(1200)  # the SM clocks go on as planned
    assert gpus.state(0).locked_sm_clock_mhz == 1200
    controller.close()
