"""The power pictures: the Perfetto counter track of each stage and the plot of the job's power (modelled)."""

import argparse
from itertools import pairwise

import numpy as np
import pytest
from test_sim import EXAMPLE, TIMES_2X2, _profile

from megatron_energy.commands import simulate
from megatron_energy.pipeline.dag import IterationTail, PipelineDag
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.power_swing import PowerTrace
from megatron_energy.report.power_swing_plot import plot_power_swing
from megatron_energy.sim import Simulator
from megatron_energy.sim.job_power import JobScale
from megatron_energy.sim.power_timeline import stage_power_traces
from megatron_energy.sim.swing_cases import at_scales, swing_cases
from megatron_energy.sim.trace import trace_events


def _counter(events, stage):
    return [(e["ts"] / 1e6, e["args"]["power_w"]) for e in events if e["ph"] == "C" and e["pid"] == stage]


@pytest.mark.parametrize("latency_s", [0.0, 0.5])
def test_each_stage_counter_steps_with_its_power_timeline_and_integrates_to_its_energy(latency_s):
    tail = IterationTail.measured(outside_s=0.5, stage_energy_j=(40.0, 70.0))
    simulator = Simulator(PipelineDag.build(pipeline_orders(2, 4), tail=tail), _profile(TIMES_2X2, 2))
    clocks = {step: (1000, 1500)[position % 2] for step, position in simulator.compute_positions().items()}
    result = simulator.run(clocks, switch_latency_s=latency_s)
    events = trace_events(result, simulator.powers)
    for stage, trace in enumerate(stage_power_traces(result, simulator.powers)):
        counter = _counter(events, stage)
        assert [time for time, _ in counter] == pytest.approx(trace.edges_s.tolist())
        powers = [power for _, power in counter]
        assert powers == pytest.approx([*trace.power_w, trace.power_w[-1]], abs=1e-3)  # the last held
        energy = sum((end - start) * power for (start, power), (end, _) in pairwise(counter))
        assert energy == pytest.approx(result.stages[stage].total_energy_j, rel=1e-6)
        assert counter[-1][0] == pytest.approx(result.iteration_time_s)


@pytest.mark.slow
def test_the_plot_of_a_few_iterations_is_written(tmp_path):
    square = PowerTrace(np.array([0.0, 0.3, 1.0]), np.array([300.0, 600.0]), "modelled")
    flat = PowerTrace(np.array([0.0, 1.0]), np.array([450.0]), "modelled")
    cases = swing_cases([square, square], [flat, flat], tensor_parallel=1, floor_share=0.8)
    rows = at_scales(cases, [JobScale(1024, 0.0, 2), JobScale(1024, 0.2, 2)])
    path = plot_power_swing(rows, tmp_path / "plots" / "swing.png", "two squares (modelled)")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def _simulate(argv):
    parser = argparse.ArgumentParser()
    simulate.register(parser.add_subparsers())
    args = parser.parse_args(["simulate", *argv])
    return args.func(args)


@pytest.mark.slow
def test_simulate_power_swing_prints_stock_against_a_floor_at_each_size_and_draws_it(tmp_path, capsys):
    plot = tmp_path / "swing.png"
    argv = [
        "--config",
        EXAMPLE,
        "--power-swing",
        "--gpus",
        "1024,16384",
        "--spread",
        "0.25",
        "--plot",
        str(plot),
    ]
    assert _simulate(argv) == 0
    out = capsys.readouterr().out
    assert "power per GPU over 4 iterations (modelled, W)" in out and "(modelled, MW)" in out
    assert "GPU spec h100-sxm" in out and "0.8 x the busiest GPU's stock peak" in out
    rows = [
        line for line in out.splitlines() if line.startswith("│") and ("in phase" in line or "spread" in line)
    ]
    assert len(rows) == 2 * 2 * 2  # two sizes, in phase and spread, stock and filler floor
    assert plot.stat().st_size > 10_000


@pytest.mark.slow
def test_simulate_power_swing_refuses_a_size_that_is_not_whole_replicas_before_printing(capsys):
    assert _simulate(["--config", EXAMPLE, "--power-swing", "--gpus", "1022"]) == 2  # 4 GPUs a replica
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert "1022 GPUs are not a whole number of replicas of 4 GPUs" in line
    assert _simulate(["--config", EXAMPLE, "--plot", "x.png"]) == 2
    assert "add --power-swing" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        _simulate(["--config", EXAMPLE, "--power-swing", "--floor", "0"])
    assert refused.value.code == 2 and "'0' must be a share above 0 up to 1" in capsys.readouterr().err
