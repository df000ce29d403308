"""The power-budget target: parsing, the fastest frontier point under the budget, the log figure, the net."""

import argparse
import math

import pytest

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.perseus.power_point import PowerBudgetError, point_power
from megatron_energy.optimisers.perseus.target_point import Planner
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import PlanPoint, RankPlan
from megatron_energy.runtime.running.policies import SafetyNet
from megatron_energy.runtime.running.power_watch import allowed_power_w, measured_power_w, power_budget_part
from megatron_energy.target import EnergyTarget, parse_target


@pytest.fixture(scope="module")
def planner() -> Planner:
    spec = load_gpu_spec("a100-sxm-80gb")
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    clocks = [clock for clock in spec.sm_clocks_mhz if clock >= 900][::4]
    profile = Profile.synthetic(shape, spec, 4, clocks_mhz=clocks)
    return Planner(PipelineDag.build(pipeline_orders(4, 6)), profile, num_points=12)


def test_parse_power_targets() -> None:
    assert parse_target("power:450") == EnergyTarget("power", power_w=450.0)
    assert parse_target("Power:450,peak:600") == EnergyTarget("power", power_w=450.0, peak_w=600.0)
    assert str(parse_target("power:450,peak:600")) == "power:450,peak:600"
    for bad in ("power:", "power:-5", "power:abc", "power:450,600", "power:450,peak:400", "power:inf"):
        with pytest.raises(argparse.ArgumentTypeError, match="power:W"):
            parse_target(bad)


def _brute_force(planner: Planner, budget_w: float, peak_w: float | None = None) -> tuple[float, float]:
    """(time, energy) of the fastest point of every executable frontier point within the budget."""
    fitting = []
    for point in planner.executable_points():
        gpus = len(point.stage_energy_j)
        average_w = point.energy_j / (gpus * point.time_s)
        peak = max(
            planner.profile.option_at(i.work, c).energy_j / planner.profile.option_at(i.work, c).time_s
            for i, c in point.clocks.items()
        )
        if average_w <= budget_w and (peak_w is None or peak <= peak_w):
            fitting.append((point.time_s, point.energy_j))
    return min(fitting)


def test_power_target_is_the_fastest_point_under_the_budget(planner: Planner) -> None:
    powers = sorted(point_power(p, planner.profile).average_w for p in planner.executable_points())
    lowest, highest = powers[0], powers[-1]
    assert highest > lowest * 1.02  # the frontier spans a real power range
    for budget_w in (lowest + 0.25 * (highest - lowest), lowest + 0.7 * (highest - lowest), highest + 1):
        chosen = planner.point(EnergyTarget("power", power_w=budget_w))
        assert point_power(chosen, planner.profile).average_w <= budget_w
        assert (chosen.time_s, chosen.energy_j) == _brute_force(planner, budget_w)
    # a budget every point meets gives the fastest (iso-time) point
    fastest = planner.point(EnergyTarget("power", power_w=highest + 1))
    assert fastest.time_s == pytest.approx(planner.point("iso-time").time_s)


def test_peak_cap_constrains_the_choice(planner: Planner) -> None:
    peaks = sorted(point_power(p, planner.profile).peak_w for p in planner.executable_points())
    cap = peaks[len(peaks) // 2]
    chosen = planner.point(EnergyTarget("power", power_w=1e4, peak_w=cap))
    assert point_power(chosen, planner.profile).peak_w <= cap
    assert (chosen.time_s, chosen.energy_j) == _brute_force(planner, 1e4, cap)
    assert chosen.time_s > planner.point("iso-time").time_s  # the cap cost speed


def test_impossible_budget_names_the_lowest_power(planner: Planner) -> None:
    lowest = min(point_power(p, planner.profile).average_w for p in planner.executable_points())
    with pytest.raises(PowerBudgetError, match=r"lowest reachable average power is (\d+\.\d) W") as error:
        planner.point(EnergyTarget("power", power_w=lowest * 0.9))
    assert f"{lowest:.1f} W per GPU" in str(error.value)


def test_measured_power_interval_and_verdict() -> None:
    window_j = [800.0, 820.0, 780.0, 800.0]  # two GPUs, 1 s iterations: 400 W per GPU on average
    power = measured_power_w(window_j, [1.0] * 4, num_gpus=2, iterations_per_block=1)
    assert power is not None and power.mean == pytest.approx(400.0) and power.n == 4
    assert 0 < power.halfwidth < 20
    within, scalars = power_budget_part(power, EnergyTarget("power", power_w=450), "measured")
    assert within.endswith("within") and scalars["energy/power_budget_w"] == 450
    over, _ = power_budget_part(power, EnergyTarget("power", power_w=350), "measured")
    assert over.endswith("OVER")
    noisy, _ = power_budget_part(power, EnergyTarget("power", power_w=401), "measured")
    assert noisy.endswith("within noise of it")
    assert measured_power_w([], [], 2, 1) is None


def _point(rank_j: tuple[float, ...], time_s: float) -> PlanPoint:
    ranks = tuple(RankPlan(actions=(), energy_j=j, busy_s=time_s) for j in rank_j)
    return PlanPoint(
        label="p", iteration_time_s=time_s, deadline_s=time_s, lower_bound_j=sum(rank_j), ranks=ranks
    )


def test_allowance_scales_the_budget_by_the_rank_share() -> None:
    point = _point((500.0, 300.0), 1.0)  # predicted 500 W and 300 W, average 400 W
    target = EnergyTarget("power", power_w=440.0)
    assert allowed_power_w(target, point, 0) == pytest.approx(550.0)
    assert allowed_power_w(target, point, 1) == pytest.approx(330.0)
    assert allowed_power_w(EnergyTarget("iso-time"), point, 0) is None


def test_sustained_power_overshoot_trips_the_safety_net() -> None:
    net = SafetyNet(tolerance=0.05, patience=3)
    allowed_w = 400.0
    # in time, within budget (or within tolerance): never trips
    for power_w in (390.0, 415.0, math.nan, 419.0):
        assert not net.observe(1.0, 1.0, power_w, allowed_w)
    assert net.violations == 0
    # an overshoot streak broken by one good step does not trip
    assert not net.observe(1.0, 1.0, 450.0, allowed_w)
    assert not net.observe(1.0, 1.0, 450.0, allowed_w)
    assert not net.observe(1.0, 1.0, 400.0, allowed_w)
    # a sustained overshoot does, exactly once, and says why
    tripped = [net.observe(1.0, 1.0, 450.0, allowed_w) for _ in range(5)]
    assert tripped == [False, False, True, False, False]
    assert net.tripped and net.last_cause == "power"
    slow = SafetyNet(tolerance=0.05, patience=1)
    assert slow.observe(2.0, 1.0) and slow.last_cause == "time"


def test_a_window_shorter_than_a_block_still_shows_its_mean() -> None:
    power = measured_power_w([800.0, 820.0, 780.0], [1.0] * 3, num_gpus=2, iterations_per_block=4)
    assert power is not None and power.mean == pytest.approx(400.0) and power.n == 1
    assert power_budget_part(power, EnergyTarget("power", power_w=450), "modelled")[0].endswith("noise of it")
