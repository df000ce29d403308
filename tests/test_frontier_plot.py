"""The frontier plot draws the latency-aware frontier beside the instant-switch one, the chosen plan on it."""

import pytest

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.report.frontier_plot import frontier_series, plot_frontier
from megatron_energy.target import parse_target


@pytest.fixture(scope="module")
def plan():
    spec = load_gpu_spec("a100-sxm-80gb")  # 20 ms clock switches
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=1)
    clocks = [clock for clock in spec.sm_clocks_mhz if clock >= 1005][::4]
    profile = Profile.synthetic(shape, spec, 2, clocks_mhz=clocks)
    job = PlanningJob(
        pipeline_orders(2, 4),
        "f" * 16,
        parse_target("slowdown:0.05"),
        switch_latency_s=spec.switch_latency_s,
        frontier_points=10,
        kept_points=3,
    )
    return PerseusOptimiser().plan(profile, job)


def test_the_chosen_plan_sits_on_the_latency_aware_frontier(plan):
    series = {s.key: s for s in frontier_series(plan)}
    assert list(series) == ["instant", "bound", "latency", "stock", "chosen"]
    latency, instant, chosen = series["latency"], series["instant"], series["chosen"]
    star = (chosen.times_s[0], chosen.energies_j[0])
    assert star in zip(latency.times_s, latency.energies_j, strict=True)
    # the latency-aware curve is the plan's executable points, a subset of the instant-switch samples
    assert len(latency.times_s) == len(plan.points) < len(instant.times_s)
    assert "20 ms clock switches" in latency.label
    assert f"executable points (of the {len(instant.times_s)} above)" in latency.label
    assert "instant clock switches" in instant.label and "latency-aware" in chosen.label
    # switches cost: at the star's time, the instant-switch curve is at or below the star
    below = [e for t, e in zip(instant.times_s, instant.energies_j, strict=True) if t <= star[0] * (1 + 1e-9)]
    assert min(below) <= star[1] * (1 + 1e-9)
    assert list(latency.times_s) == sorted(latency.times_s)


@pytest.mark.slow
def test_the_plot_is_written(plan, tmp_path):
    path = plot_frontier(plan, tmp_path / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
