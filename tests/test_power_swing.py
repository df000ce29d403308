"""Swing figures on synthetic traces with known answers, and the simulator's power timeline (modelled)."""

import numpy as np
import pytest
from test_sim import TIMES_2X2, _profile

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.dag import IterationTail, PipelineDag
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.power_swing import PowerTrace, floor_energy_j, summed, swing_figures
from megatron_energy.sim import Simulator
from megatron_energy.sim.power_timeline import stage_power_traces

SQUARE = PowerTrace(np.array([0.0, 0.3, 1.0]), np.array([300.0, 600.0]), "modelled")
"""One 1 s iteration: 0.3 s at 300 W (the trough), then 0.7 s at 600 W."""


def test_a_square_wave_swings_from_peak_to_trough_in_one_bin():
    figures = swing_figures(SQUARE.tiled(10), resolution_s=0.1)
    assert figures.mean_w == pytest.approx(510.0)
    assert (figures.peak_w, figures.trough_w, figures.swing_w) == pytest.approx((600.0, 300.0, 300.0))
    assert figures.ramp_up_w_per_s == pytest.approx(3000.0) and figures.ramp_down_w_per_s == pytest.approx(
        3000.0
    )
    assert figures.source == "modelled"


def test_a_step_inside_a_bin_is_averaged_and_ramps_are_read_per_bin():
    trace = PowerTrace(np.array([0.0, 0.05, 1.0]), np.array([100.0, 500.0]), "measured")
    figures = swing_figures(trace, resolution_s=0.1)
    assert figures.trough_w == pytest.approx(300.0)  # half the first bin at 100 W, half at 500 W
    assert figures.ramp_up_w_per_s == pytest.approx(2000.0)
    assert figures.ramp_down_w_per_s == pytest.approx(0.0, abs=1e-6)


def test_a_one_hertz_sine_is_all_in_the_band_and_a_fifty_hertz_one_is_not():
    times = np.arange(0.0, 10.0, 0.001)
    for hertz, share in ((1.0, 1.0), (40.0, 0.0)):
        trace = PowerTrace(np.append(times, 10.0), 500 + 100 * np.sin(2 * np.pi * hertz * times), "measured")
        figures = swing_figures(trace, resolution_s=0.005)
        assert figures.band_share == pytest.approx(share, abs=1e-3)
        assert figures.band_rms_w == pytest.approx(100 / np.sqrt(2) * share, abs=0.5)
    flat = swing_figures(PowerTrace(np.array([0.0, 2.0]), np.array([400.0]), "measured"))
    assert (flat.swing_w, flat.band_rms_w) == pytest.approx((0.0, 0.0), abs=1e-6) and flat.band_share == 0.0


def test_a_floor_costs_the_area_between_it_and_the_troughs():
    assert floor_energy_j(SQUARE.tiled(10), 500.0, resolution_s=0.1) == pytest.approx(10 * 0.3 * 200.0)
    assert floor_energy_j(SQUARE, 250.0) == 0.0


def test_shifting_rotates_a_periodic_trace_and_summing_adds_power():
    shifted = SQUARE.shifted(0.2)
    assert shifted.edges_s.tolist() == pytest.approx([0.0, 0.2, 0.5, 1.0])
    assert shifted.power_w.tolist() == [600.0, 300.0, 600.0]
    assert shifted.energy_j == pytest.approx(SQUARE.energy_j) and SQUARE.shifted(1.0) is SQUARE
    onto_an_edge = SQUARE.shifted(0.7)  # 1.0 - 0.7 rounds a hair above the edge at 0.3
    assert onto_an_edge.edges_s.tolist() == pytest.approx([0.0, 0.7, 1.0])
    assert onto_an_edge.power_w.tolist() == [600.0, 300.0]
    job = summed([SQUARE, SQUARE.shifted(0.5)])
    assert job.power_w.tolist() == pytest.approx([900.0, 1200.0, 900.0, 1200.0])
    assert job.energy_j == pytest.approx(2 * SQUARE.energy_j)
    assert summed([SQUARE, SQUARE]).source == "modelled"


def test_bad_traces_are_refused():
    with pytest.raises(EnergyValueError, match="ascending"):
        PowerTrace(np.array([0.0, 0.0, 1.0]), np.array([1.0, 2.0]), "measured")
    with pytest.raises(EnergyValueError, match="edges"):
        PowerTrace(np.array([0.0, 1.0]), np.array([1.0, 2.0]), "measured")
    with pytest.raises(EnergyValueError, match="shorter than one"):
        SQUARE.binned(2.0)


def test_each_stage_trace_integrates_to_its_simulated_energy_with_troughs_at_blocked_and_idle_power():
    tail = IterationTail.measured(outside_s=0.5, stage_energy_j=(40.0, 70.0))
    simulator = Simulator(PipelineDag.build(pipeline_orders(2, 4), tail=tail), _profile(TIMES_2X2, 2))
    result = simulator.run()
    traces = stage_power_traces(result, simulator.powers)
    for trace, stage in zip(traces, result.stages, strict=True):
        assert trace.energy_j == pytest.approx(stage.total_energy_j)
        assert trace.edges_s[-1] == pytest.approx(result.iteration_time_s)
    # compute at 100 W, blocked 50 W, idle 30 W, the tail 40 / 0.5 = 80 W and 70 / 0.5 = 140 W
    assert set(traces[0].power_w.tolist()) == {100.0, 50.0, 80.0}
    assert set(traces[1].power_w.tolist()) == {100.0, 50.0, 140.0, 30.0}


def test_a_switch_latency_splits_a_node_at_its_stale_clock():
    simulator = Simulator(PipelineDag.build(pipeline_orders(2, 2)), _profile(TIMES_2X2, 2))
    mixed = {step: (1000, 1500)[position % 2] for step, position in simulator.compute_positions().items()}
    result = simulator.run(mixed, switch_latency_s=0.5)
    assert any(piece.stale_s > 0 for piece in result.timeline)
    traces = stage_power_traces(result, simulator.powers)
    assert 100.0 in traces[0].power_w.tolist() and 60.0 in traces[0].power_w.tolist()
    for trace, stage in zip(traces, result.stages, strict=True):
        assert trace.energy_j == pytest.approx(stage.total_energy_j)
