"""The job's power at scale, with known answers: in phase, spread over the iteration, energy kept."""

import numpy as np
import pytest

from megatron_energy.errors import EnergyValueError
from megatron_energy.power_swing import PowerTrace, floor_energy_j, floored, swing_figures
from megatron_energy.sim.job_power import JobScale, job_power, replica_power

SQUARE = PowerTrace(np.array([0.0, 0.3, 1.0]), np.array([300.0, 600.0]), "modelled")
"""One GPU over a 1 s iteration: 0.3 s at 300 W (the trough), then 0.7 s at 600 W."""


def test_a_replica_is_its_stages_times_their_tensor_parallel_gpus():
    other = PowerTrace(np.array([0.0, 0.5, 1.0]), np.array([100.0, 200.0]), "modelled")
    replica = replica_power([SQUARE, other], tensor_parallel=4)
    assert replica.power_w.tolist() == pytest.approx([1600.0, 2800.0, 3200.0])
    assert replica.energy_j == pytest.approx(4 * (SQUARE.energy_j + other.energy_j))


def test_in_phase_replicas_draw_the_replica_times_their_number():
    job = job_power(SQUARE.scaled(8), 8, JobScale(gpus=8 * 1024, iterations=3))
    assert job.replicas == 1024
    assert job.trace.edges_s.tolist() == pytest.approx(SQUARE.tiled(3).edges_s.tolist())
    assert job.trace.power_w.tolist() == pytest.approx((SQUARE.tiled(3).power_w * 8 * 1024).tolist())
    one_gpu = swing_figures(SQUARE.tiled(3))
    assert job.figures.swing_w == pytest.approx(8 * 1024 * one_gpu.swing_w)
    assert job.figures.ramp_up_w_per_s == pytest.approx(8 * 1024 * one_gpu.ramp_up_w_per_s)
    assert job.figures.band_share == pytest.approx(one_gpu.band_share)


def test_a_uniform_spread_over_the_iteration_flattens_a_square_wave_to_its_mean():
    scale = JobScale(gpus=2048, spread=1.0, iterations=4, seed=7)
    job = job_power(SQUARE, 1, scale)
    mean = 2048 * SQUARE.mean_w
    assert job.figures.mean_w == pytest.approx(mean)
    assert job.figures.swing_w < 0.05 * mean  # in phase: 300 / 510 = 59 % of the mean
    assert job.figures.ramp_up_w_per_s < 0.05 * job_power(SQUARE, 1, JobScale(2048)).figures.ramp_up_w_per_s
    assert job_power(SQUARE, 1, scale).trace.power_w.tolist() == job.trace.power_w.tolist()  # seeded


def test_a_spread_keeps_the_energy_and_a_narrow_one_keeps_most_of_the_swing():
    for spread in (0.05, 0.5, 1.0):
        job = job_power(SQUARE.scaled(4), 4, JobScale(gpus=4 * 300, spread=spread, iterations=2))
        assert job.trace.energy_j == pytest.approx(300 * 2 * 4 * SQUARE.energy_j)
        assert job.trace.duration_s == pytest.approx(2.0)
    narrow = job_power(SQUARE, 1, JobScale(gpus=500, spread=0.05)).figures
    assert narrow.swing_w == pytest.approx(500 * 300.0, rel=0.1)  # 50 ms of offsets, a 300 ms trough


def test_a_floor_holds_every_bin_and_costs_what_floor_energy_says():
    held = floored(SQUARE.tiled(2), 480.0, resolution_s=0.1)
    assert held.power_w.min() == pytest.approx(480.0) and held.power_w.max() == pytest.approx(600.0)
    assert held.energy_j - SQUARE.tiled(2).energy_j == pytest.approx(
        floor_energy_j(SQUARE.tiled(2), 480.0, resolution_s=0.1)
    )
    assert floor_energy_j(SQUARE, 480.0, resolution_s=0.1) == pytest.approx(0.3 * 180.0)


def test_bad_scales_are_refused_with_what_to_give():
    with pytest.raises(EnergyValueError, match="whole number of replicas of 8 GPUs"):
        job_power(SQUARE, 8, JobScale(gpus=1020))
    with pytest.raises(EnergyValueError, match="0 \\(in phase\\) to 1"):
        JobScale(gpus=8, spread=1.5)
    with pytest.raises(EnergyValueError, match="at least one iteration"):
        JobScale(gpus=8, iterations=0)
    with pytest.raises(EnergyValueError, match="at least 1"):
        replica_power([SQUARE], tensor_parallel=0)
