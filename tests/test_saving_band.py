"""The band of a plan's modelled saving: the same plan priced again over the GPU spec's declared ranges."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.megatron.schedule import pipeline_orders
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.optimisers.saving_band import saving_band, with_saving_band
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.plan import Plan, PlanError, fingerprint
from megatron_energy.plan_outcome import plan_saving
from megatron_energy.target import parse_target

SPEC = load_gpu_spec("h100-sxm")


def _profile(spec: GpuSpec = SPEC, source: str = "modelled") -> Profile:
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    clocks = [clock for clock in spec.sm_clocks_mhz if clock >= 900][::3]
    profile = Profile.synthetic(shape, spec, 4, clocks_mhz=clocks)
    options = {key: profile.options(key) for key in profile}
    return Profile(options, profile.gpu_name, source, profile.blocked_power_w, profile.idle_power_w)


@pytest.fixture(scope="module")
def job() -> PlanningJob:
    return PlanningJob(
        pipeline_orders(4, 8),
        fingerprint(job="band-test"),
        parse_target("iso-time"),
        switch_latency_s=SPEC.switch_latency_s,
        frontier_points=12,
        gpu=SPEC,
    )


@pytest.fixture(scope="module")
def plan(job: PlanningJob) -> Plan:
    return PerseusOptimiser().plan(_profile(), job)


def _band(plan: Plan, job: PlanningJob, ranges: dict[str, tuple[float, float]], source: str = "modelled"):
    return saving_band(plan, job.dag(), _profile(source=source), dataclasses.replace(SPEC, ranges=ranges))


def test_the_band_holds_the_nominal_saving_and_varies_every_range(plan, job):
    band = _band(plan, job, dict(SPEC.ranges))
    assert band.varied == tuple(SPEC.ranges)
    assert band.low < plan_saving(plan) < band.high
    assert plan_saving(plan) < 0


def test_a_zero_width_range_gives_a_zero_width_band(plan, job):
    band = _band(plan, job, {"memory_power_w": (SPEC.memory_power_w, SPEC.memory_power_w)})
    assert band.low == band.high == plan_saving(plan)
    assert band.varied == ("memory_power_w",)


def test_widening_a_range_widens_the_band(plan, job):
    narrow = _band(plan, job, {"voltage_knee_mhz": (950.0, 1030.0)})
    wide = _band(plan, job, {"voltage_knee_mhz": (800.0, 1200.0)})
    assert wide.low < narrow.low <= plan_saving(plan) <= narrow.high < wide.high


def test_each_figure_moves_the_saving_and_corners_widen_the_band(plan, job):
    ranges = {"dynamic_power_max_w": (950.0, 1100.0), "memory_power_w": (72.0, 120.0)}
    alone = [_band(plan, job, {key: bounds}) for key, bounds in ranges.items()]
    both = _band(plan, job, ranges)
    for band in alone:
        assert band.low < band.high
    assert both.low < min(band.low for band in alone)
    assert both.high > max(band.high for band in alone)


def test_a_measured_profile_varies_the_switch_latency_only(plan, job):
    band = _band(plan, job, {"memory_power_w": (72.0, 120.0), "switch_latency_s": (0.001, 0.1)}, "measured")
    assert band.varied == ("switch_latency_s",)
    assert band.low < band.high
    assert _band(plan, job, {"memory_power_w": (72.0, 120.0)}, "measured").varied == ()


def test_the_band_travels_in_the_plan_file_and_is_checked_on_load(plan, job, tmp_path):
    banded = with_saving_band(plan, _profile(), job)
    assert banded.saving_band is not None and banded.saving_band.varied == tuple(SPEC.ranges)
    assert plan.to_json_text() == dataclasses.replace(banded, saving_band=None).to_json_text()
    loaded = Plan.load(banded.save(tmp_path / "plan.json"))
    assert loaded.saving_band == banded.saving_band
    body = banded.to_json_dict()
    body["saving_band"] = {"low": -0.5, "high": -0.4, "varied": []}
    body.pop("checksum")
    with pytest.raises(PlanError, match="does not hold the plan's own saving"):
        Plan.from_json_dict(_signed(body), source="forged")
    body["saving_band"] = {"low": -0.1, "high": "x", "varied": []}
    with pytest.raises(PlanError, match=r"saving_band\.low and \.high must be numbers"):
        Plan.from_json_dict(_signed(body), source="forged")


def _signed(body: dict) -> dict:
    from megatron_energy.plan import _checksum

    return body | {"checksum": _checksum(body)}
