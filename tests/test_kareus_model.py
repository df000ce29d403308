"""Properties of the contention model and the overlap simulator (sim/contention.py, sim/overlap.py)."""

from __future__ import annotations

import pytest

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.kareus.choices import ClassChoice, KareusModel
from megatron_energy.pipeline.collectives import build_collectives
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.sim.contention import CommLoad, ContentionModel
from megatron_energy.sim.overlap import OverlapSimulator
from megatron_energy.sim.overlap_result import PHASES
from megatron_energy.sim.overlap_schedule import CommLaunch, OverlapSchedule
from megatron_energy.sim.simulator import Simulator
from tests.kareus_jobs import EXAMPLE_7B, workload_of

SPEC = load_gpu_spec("h200")


def load(ctas: int) -> CommLoad:
    return CommLoad(ctas, link_bandwidth_gbps=450.0, cta_bandwidth_gbps=SPEC.cta_bandwidth_gbps)


def test_more_ctas_finish_a_collective_sooner_until_the_link_saturates() -> None:
    times = [load(c).duration_s(1e9) for c in (1, 2, 4, 8, 16)]
    assert times == sorted(times, reverse=True) and len(set(times)) == len(times)
    saturated = load(32).saturation_ctas
    assert 16 < saturated < 32
    assert load(32).duration_s(1e9) == pytest.approx(load(64).duration_s(1e9)) == pytest.approx(1e9 / 450e9)


def test_more_ctas_slow_the_compute_beside_them_and_draw_more_power() -> None:
    model = ContentionModel(SPEC)
    clocks = list(SPEC.sm_clocks_mhz)

    def time_s(clock: int) -> float:
        return 1.0 * SPEC.max_sm_clock_mhz / clock

    def power_w(clock: int) -> float:
        return 300.0 + 0.1 * clock  # well under the cap: no throttling

    states = [model.overlap(load(c), 1980, clocks, time_s, power_w) for c in (1, 8, 32, 66)]
    rates = [state.rate for state in states]
    assert rates == sorted(rates, reverse=True)
    assert rates[-1] == pytest.approx(1 - 66 / SPEC.sm_count)
    assert [s.comm_power_w for s in states] == sorted(s.comm_power_w for s in states)


def test_the_power_cap_lowers_the_clock_of_compute_beside_a_collective() -> None:
    model = ContentionModel(SPEC)

    def power_w(clock: int) -> float:
        return SPEC.power_limit_w * clock / SPEC.max_sm_clock_mhz  # at the cap at the top clock

    state = model.overlap(load(8), 1980, list(SPEC.sm_clocks_mhz), lambda c: 1980 / c, power_w)
    assert state.clock_mhz < 1980
    assert state.power_w <= SPEC.power_limit_w + 1e-6
    assert state.rate < 1 - 8 / SPEC.sm_count


@pytest.fixture(scope="module")
def model() -> KareusModel:
    job = JobConfig.load(EXAMPLE_7B)
    spec = job.spec()
    workload = workload_of(job)
    return KareusModel(
        job.build_dag(spec=spec),
        job.synthetic_profile(spec),
        spec,
        build_collectives(workload),
        workload.layers_per_chunk,
    )


@pytest.mark.slow
def test_without_collectives_the_overlap_simulator_is_the_plain_simulator(model: KareusModel) -> None:
    dag = PipelineDag.build(model.dag.orders)  # no transfers, no tail
    plain = Simulator(dag, model.profile, switch_latency_s=0.0).run()
    overlap = OverlapSimulator(dag, model.profile, model.spec).run(None, OverlapSchedule())
    assert overlap.iteration_time_s == pytest.approx(plain.iteration_time_s, rel=1e-12)
    assert overlap.total_energy_j == pytest.approx(plain.total_energy_j, rel=1e-9)


@pytest.mark.parametrize("ctas", [4, 32])
def test_static_plus_dynamic_is_the_total_and_phases_fill_the_iteration(
    model: KareusModel, ctas: int
) -> None:
    choices = {
        **model.choices_default(),
        **{(s, "dp.reduce_scatter"): ClassChoice(ctas, 0) for s in range(4)},
    }
    result = model.evaluate(None, choices)
    assert result.static_j == pytest.approx(SPEC.idle_power_w * result.iteration_time_s * len(result.stages))
    for stage in result.stages:
        assert sum(p.time_s for p in stage.phases) == pytest.approx(result.iteration_time_s, rel=1e-9)
        assert stage.total_j == pytest.approx(stage.static_j + stage.dynamic_j)
        assert [p.phase for p in stage.phases] == list(PHASES)
    assert any(stage.phase("overlap").time_s > 0 for stage in result.stages)
    assert result.as_sim_result().total_energy_j == pytest.approx(result.total_energy_j)


def test_a_collective_launched_inside_an_instruction_slows_it(model: KareusModel) -> None:
    node = model.dag.stage_order(0)[-1]
    simulator = OverlapSimulator(model.dag, model.profile, model.spec)
    alone = simulator.run(None, OverlapSchedule())
    launch = CommLaunch("dp.reduce_scatter.chunk0.bucket0", 0, 2e9, load(32), "compute", node, 0.0)
    beside = simulator.run(None, OverlapSchedule((launch,)))

    def span(result: object) -> float:
        (piece,) = [p for p in result.timeline if p.node == node]  # type: ignore[attr-defined]
        return piece.end_s - piece.start_s

    assert span(beside) > span(alone)
    (comm,) = beside.comm
    assert comm.overlapped_s > 0 and comm.end_s - comm.start_s == pytest.approx(launch.duration_s)
