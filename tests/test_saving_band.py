"""The band of a plan's modelled saving: the same plan priced again over the GPU spec's declared ranges."""

from __future__ import annotations

import dataclasses
import json

import pytest

from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.perseus.clock_optimiser import PerseusOptimiser
from megatron_energy.optimisers.saving_band import saving_band, with_saving_band
from megatron_energy.plan import Plan, PlanError
from megatron_energy.plan_band import SavingBand
from megatron_energy.plan_file import _checksum, load_plan, plan_text, read_plan, save_plan
from megatron_energy.plan_outcome import plan_saving
from tests.banded_plans import SPEC, small_job, small_profile

pytestmark = pytest.mark.slow  # prices a plan again under every variant of the spec's ranges


@pytest.fixture(scope="module")
def job() -> PlanningJob:
    return small_job()


@pytest.fixture(scope="module")
def plan(job: PlanningJob) -> Plan:
    return PerseusOptimiser().plan(small_profile(), job)


def _band(plan: Plan, job: PlanningJob, ranges: dict[str, tuple[float, float]], source: str = "modelled"):
    spec = dataclasses.replace(SPEC, ranges=ranges)
    return saving_band(plan, job.dag(), small_profile(source=source), spec)


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
    p_dyn = SPEC.dynamic_power_max_w
    ranges = {"dynamic_power_max_w": (0.93 * p_dyn, 1.08 * p_dyn), "memory_power_w": (72.0, 120.0)}
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
    banded = with_saving_band(plan, small_profile(), job)
    assert banded.saving_band is not None and banded.saving_band.varied == tuple(SPEC.ranges)
    assert plan_text(plan) == plan_text(dataclasses.replace(banded, saving_band=None))
    loaded = load_plan(save_plan(banded, tmp_path / "plan.json"))
    assert loaded.saving_band == banded.saving_band
    body = json.loads(plan_text(banded))
    body["saving_band"] = {"low": -0.5, "high": -0.4, "varied": []}
    body.pop("checksum")
    with pytest.raises(PlanError, match="does not hold the plan's own saving"):
        read_plan(_signed(body), source="forged")
    body["saving_band"] = {"low": -0.1, "high": "x", "varied": []}
    with pytest.raises(PlanError, match=r"saving_band\.high: Input should be a valid number"):
        read_plan(_signed(body), source="forged")
    body["saving_band"] = {"low": -0.1, "high": -0.2, "varied": []}
    with pytest.raises(PlanError, match=r"saving_band: Value error, a saving band needs finite low <= high"):
        read_plan(_signed(body), source="forged")


def _signed(body: dict) -> str:
    return json.dumps(body | {"checksum": _checksum(body)})


def test_a_plan_against_itself_is_no_change_under_every_variant(plan, job):
    band = saving_band(plan, job.dag(), small_profile(), SPEC, against=plan)
    assert band.low == band.high == 0.0 and band.varied == tuple(SPEC.ranges)


def test_the_reversed_band_is_the_opposite_change_end_for_end():
    band = SavingBand(-0.2, -0.1, ("x",)).reversed()
    assert (band.low, band.high) == pytest.approx((1 / 0.9 - 1, 1 / 0.8 - 1))
