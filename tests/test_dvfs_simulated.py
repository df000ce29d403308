import itertools
import math
import statistics

import pytest
from zeus.device.gpu.common import ZeusGPUInvalidArgError, ZeusGPUNotSupportedError

from megatron_energy.dvfs.emulation import Emulation
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.simulated import SimulatedGPUs, read_state, reset_state_file
from megatron_energy.dvfs.spec import load_gpu_spec

WORK = WorkProfile(compute_s=0.04, memory_s=0.02, fixed_s=0.001)


@pytest.fixture
def spec():
    return load_gpu_spec("h200")


@pytest.fixture
def gpus(spec, tmp_path):
    return SimulatedGPUs(spec, num_gpus=2, state_path=tmp_path / "state.json")


def test_reports_the_spec_through_the_zeus_interface(gpus, spec):
    assert len(gpus) == 2
    assert gpus.get_supported_graphics_clocks(0) == list(spec.sm_clocks_mhz)
    assert gpus.get_supported_memory_clocks(1) == list(spec.memory_clocks_mhz)
    assert gpus.get_power_management_limit(0) == round(spec.power_limit_w * 1000)
    assert "simulated" in gpus.get_name(0)
    assert gpus.supports_get_total_energy_consumption(0)
    assert gpus.get_gpu_temperature(0) == gpus.get_gpu_temperature(1)


def test_power_limit_cannot_be_changed(gpus):
    with pytest.raises(ZeusGPUNotSupportedError):
        gpus.set_power_management_limit(0, 500_000)


def test_execute_at_default_clock_matches_the_model(gpus, spec):
    model = GpuPowerModel(spec)
    time_s, energy_j = gpus.execute(0, WORK)
    assert time_s == pytest.approx(model.time_s(WORK, spec.default_sm_clock_mhz))
    assert energy_j == pytest.approx(model.energy_j(WORK, spec.default_sm_clock_mhz))
    assert gpus.virtual_time_s(0) == pytest.approx(time_s)
    assert gpus.virtual_time_s(1) == 0.0


def test_locked_clock_takes_effect_after_the_switch_latency(gpus, spec):
    model = GpuPowerModel(spec)
    f_max, f_new = spec.default_sm_clock_mhz, 1200
    gpus.set_gpu_locked_clocks(0, f_new, f_new)
    assert gpus.current_clock_mhz(0) == f_max  # not yet: the switch is pending
    time_s, energy_j = gpus.execute(0, WORK)
    latency_s = spec.switch_latency_s
    done_before_switch = latency_s / model.time_s(WORK, f_max)
    expected_time_s = latency_s + (1 - done_before_switch) * model.time_s(WORK, f_new)
    expected_energy_j = latency_s * model.power_w(WORK, f_max) + (
        expected_time_s - latency_s
    ) * model.power_w(WORK, f_new)
    assert time_s == pytest.approx(expected_time_s)
    assert energy_j == pytest.approx(expected_energy_j)
    assert gpus.current_clock_mhz(0) == f_new


def test_phases_run_in_one_piece_take_its_time_and_energy_at_one_clock(gpus, spec):
    """Even where a phase alone would exceed the power cap: the cap is the instruction's, as in one piece."""
    compute, memory = WorkProfile(0.3, 0.0), WorkProfile(0.0, 0.2, 0.01)
    whole = gpus.execute(0, compute + memory)
    pieces = gpus.execute_sequence(1, (compute, memory))
    assert pieces == pytest.approx(whole, rel=1e-12)


def test_a_clock_requested_inside_a_sequence_changes_the_rest_of_it(gpus, spec):
    model = GpuPowerModel(spec)
    compute, memory = WorkProfile(0.03, 0.0), WorkProfile(0.0, 0.05)
    whole = compute + memory
    f_max, f_low, latency_s = spec.default_sm_clock_mhz, 1200, spec.switch_latency_s
    high, low = model.effective_clock_mhz(whole, f_max), model.effective_clock_mhz(whole, f_low)
    compute_s = model.uncapped_time_s(compute, high)
    called = []
    timed = [
        (compute_s, lambda: gpus.set_gpu_locked_clocks(0, f_low, f_low)),  # at the memory phase's start
        (1.0, lambda: called.append("never")),  # beyond the end: its moment never comes
    ]
    time_s, energy_j = gpus.execute_sequence(0, (compute, memory), timed)
    # the memory phase runs its first switch latency at the old clock, the rest at the new one
    memory_high_s, memory_low_s = model.uncapped_time_s(memory, high), model.uncapped_time_s(memory, low)
    rest_s = (1 - latency_s / memory_high_s) * memory_low_s
    assert time_s == pytest.approx(compute_s + latency_s + rest_s)
    expected_j = model.uncapped_energy_j(compute, high) + latency_s * model.uncapped_power_w(memory, high)
    expected_j += rest_s * model.uncapped_power_w(memory, low)
    assert energy_j == pytest.approx(expected_j)
    assert energy_j < model.energy_j(whole, f_max)  # a memory-bound phase is cheaper at a lower clock
    assert called == []
    assert gpus.current_clock_mhz(0) == f_low


def test_lock_snaps_to_supported_clock_and_rejects_out_of_range(gpus, spec):
    gpus.set_gpu_locked_clocks(0, 1000, 1001)
    gpus.wait(0, spec.switch_latency_s, blocked=False)
    assert gpus.current_clock_mhz(0) == spec.snap_sm_clock(1001)
    with pytest.raises(ZeusGPUInvalidArgError):
        gpus.set_gpu_locked_clocks(0, 100, 5000)


def test_reset_returns_to_default_after_latency(gpus, spec):
    gpus.set_gpu_locked_clocks(0, 900, 900)
    gpus.wait(0, 1.0, blocked=True)
    assert gpus.current_clock_mhz(0) == 900
    gpus.reset_gpu_locked_clocks(0)
    gpus.wait(0, spec.switch_latency_s / 2, blocked=True)
    assert gpus.current_clock_mhz(0) == 900
    gpus.wait(0, spec.switch_latency_s, blocked=True)
    assert gpus.current_clock_mhz(0) == spec.default_sm_clock_mhz


def test_energy_counter_advances_in_counter_periods(gpus, spec):
    period_s = spec.energy_counter_period_s
    gpus.wait(0, 0.5 * period_s, blocked=False)
    assert gpus.get_total_energy_consumption(0) == 0
    gpus.wait(0, period_s, blocked=False)  # now at 1.5 periods: the counter shows the first period
    expected_mj = spec.idle_power_w * period_s * 1000
    assert gpus.get_total_energy_consumption(0) == math.floor(expected_mj)


def _period_reads(gpus: SimulatedGPUs, index: int, periods: int, period_s: float) -> list[float]:
    """Counter increments (J) over ``periods`` idle counter periods, read in the middle of each period."""
    gpus.wait(index, 0.5 * period_s, blocked=False)
    reads = [gpus.get_total_energy_consumption(index)]
    for _ in range(periods):
        gpus.wait(index, period_s, blocked=False)
        reads.append(gpus.get_total_energy_consumption(index))
    return [(b - a) / 1000 for a, b in itertools.pairwise(reads)]


def test_counter_noise_is_seeded_per_gpu_and_averages_to_the_exact_energy(spec, tmp_path):
    period_s = spec.energy_counter_period_s
    exact_j = spec.idle_power_w * period_s

    def noisy(seed: int) -> SimulatedGPUs:
        emulation = Emulation(counter_noise=0.05, seed=seed)
        return SimulatedGPUs(spec, num_gpus=2, state_path=tmp_path / f"{seed}.json", emulation=emulation)

    first, again, other = noisy(7), noisy(7), noisy(8)
    reads = _period_reads(first, 0, 400, period_s)
    assert reads == _period_reads(again, 0, 400, period_s)  # seeded
    assert reads != _period_reads(first, 1, 400, period_s)  # each GPU its own stream
    assert reads != _period_reads(other, 0, 400, period_s)
    mean, spread = sum(reads) / len(reads), statistics.stdev(reads)
    assert mean == pytest.approx(exact_j, rel=0.01)
    assert spread == pytest.approx(0.05 * exact_j, rel=0.15)
    assert first.state(0).energy_mj / 1000 == pytest.approx(exact_j * 400.5)  # the true energy is exact
    with pytest.raises(ValueError):
        Emulation(counter_noise=-0.1)


def test_wait_uses_blocked_or_idle_power(gpus, spec):
    assert gpus.wait(0, 2.0, blocked=True) == pytest.approx(2.0 * spec.blocked_power_w)
    assert gpus.wait(1, 2.0, blocked=False) == pytest.approx(2.0 * spec.idle_power_w)
    assert gpus.get_instant_power_usage(0) == round(spec.blocked_power_w * 1000)
    assert gpus.get_average_power_usage(1) == round(spec.idle_power_w * 1000)


def test_state_file_shows_clocks_and_setter_calls(gpus, tmp_path):
    gpus.set_gpu_locked_clocks(1, 1500, 1500)
    state = read_state(tmp_path / "state.json")
    assert state["source"] == "modelled"
    assert [g["locked_sm_clock_mhz"] for g in state["gpus"]] == [None, 1500]
    assert [g["set_calls"] for g in state["gpus"]] == [0, 1]


def test_time_and_energy_updates_reach_the_state_file_on_write(gpus, tmp_path):
    gpus.execute(0, WORK)
    gpus.write_state()
    record = read_state(tmp_path / "state.json")["gpus"][0]
    assert record["virtual_time_s"] == pytest.approx(gpus.virtual_time_s(0))
    assert record["energy_mj"] > 0


def test_reset_state_file_clears_locks_from_outside(gpus, spec, tmp_path):
    gpus.set_gpu_locked_clocks(0, 1200, 1200)
    gpus.set_gpu_locked_clocks(1, 1200, 1200)
    reset_state_file(tmp_path / "state.json", [1])
    state = read_state(tmp_path / "state.json")
    assert state["gpus"][0]["locked_sm_clock_mhz"] == 1200
    assert state["gpus"][1]["locked_sm_clock_mhz"] is None
    assert state["gpus"][1]["sm_clock_mhz"] == spec.default_sm_clock_mhz
    assert state["gpus"][1]["reset_calls"] == 1
