"""The job's power at scale, with known answers: in phase, spread over the iteration, energy kept."""

import numpy as np
import pytest

from megatron_energy.errors import EnergyValueError
from megatron_energy.power_swing import PowerTrace, floor_energy_j, floored, swing_figures
from megatron_energy.sim.job_power import JobScale, job_power, replica_power
from megatron_energy.sim.swing_cases import swing_cases

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


def test_a_floor_covers_the_trace_to_its_end_where_it_ends_inside_a_bin():
    late_trough = SQUARE.shifted(0.7)  # 300 W over [0.7, 1.0): the last 0.4 s bin is 0.2 s long
    held = floored(late_trough, 480.0, resolution_s=0.4)
    assert held.edges_s.tolist() == pytest.approx([0.0, 0.4, 0.8, 1.0])
    assert held.power_w.tolist() == pytest.approx([600.0, 525.0, 480.0])
    assert floor_energy_j(late_trough, 480.0, resolution_s=0.4) == pytest.approx(0.2 * 180.0)
    assert held.energy_j - late_trough.energy_j == pytest.approx(0.2 * 180.0)


def test_bad_scales_are_refused_with_what_to_give():
    with pytest.raises(EnergyValueError, match="whole number of replicas of 8 GPUs"):
        job_power(SQUARE, 8, JobScale(gpus=1020))
    with pytest.raises(EnergyValueError, match="0 \\(in phase\\) to 1"):
        JobScale(gpus=8, spread=1.5)
    with pytest.raises(EnergyValueError, match="at least one iteration"):
        JobScale(gpus=8, iterations=0)
    with pytest.raises(EnergyValueError, match="at least 1"):
        replica_power([SQUARE], tensor_parallel=0)


def test_the_cases_are_stock_the_plan_and_stock_held_at_a_share_of_its_peak_by_filler():
    flat = PowerTrace(np.array([0.0, 1.0]), np.array([450.0]), "modelled")
    stock = [SQUARE, SQUARE.shifted(0.5)]
    cases = swing_cases(stock, [flat, flat], tensor_parallel=2, floor_share=0.8, resolution_s=0.1)
    assert [case.name for case in cases] == ["stock", "plan", "filler floor"]
    stock_case, plan_case, filler = cases
    assert all(case.gpus_per_replica == 4 and case.iteration_s == pytest.approx(1.0) for case in cases)
    assert filler.floor_w == pytest.approx(480.0) and stock_case.floor_w is None
    assert filler.filler_j == pytest.approx(2 * 2 * 0.3 * 180.0)
    assert filler.replica.energy_j == pytest.approx(stock_case.replica.energy_j + filler.filler_j)
    assert filler.per_gpu(2, resolution_s=0.1).trough_w == pytest.approx((480.0 + 600.0) / 2)  # troughs apart
    assert plan_case.per_gpu(3).swing_w == pytest.approx(0.0, abs=1e-6)
    assert stock_case.per_gpu(2).mean_w == pytest.approx(SQUARE.mean_w)
    job = filler.at(JobScale(gpus=4096, iterations=2), resolution_s=0.1)
    assert job.figures.trough_w == pytest.approx(4096 * 540.0)
    assert [case.name for case in swing_cases(stock, None, 1, 0.8)] == ["stock", "filler floor"]
    with pytest.raises(EnergyValueError, match="in \\(0, 1\\]"):
        swing_cases(stock, None, 1, 1.2)
