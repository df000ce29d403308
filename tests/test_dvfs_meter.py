import pytest

from megatron_energy.dvfs.backends import open_gpus
from megatron_energy.dvfs.meter import EnergyCounterUnavailableError, EnergyMeter
from megatron_energy.dvfs.model import WorkProfile


class ScriptedCounters:
    """GPUs whose energy counters (mJ) return scripted readings, one per read, and a settable clock."""

    def __init__(self, readings: dict[int, list[int]]) -> None:
        self._readings = {index: list(values) for index, values in readings.items()}
        self.now_s = 0.0

    def supports_get_total_energy_consumption(self, index: int) -> bool:
        return True

    def get_total_energy_consumption(self, index: int) -> int:
        return self._readings[index].pop(0)

    def clock(self) -> float:
        return self.now_s


def meter_for(counters: ScriptedCounters, **kwargs) -> EnergyMeter:
    return EnergyMeter(counters, sorted(counters._readings), clock=counters.clock, **kwargs)


def test_window_energy_is_the_counter_difference_summed_over_gpus():
    counters = ScriptedCounters({0: [1_000, 3_500], 1: [10_000, 10_250]})
    meter = meter_for(counters)
    meter.begin_window("step")
    counters.now_s = 1.0
    window = meter.end_window("step")
    assert window.energy_j_per_gpu == {0: 2.5, 1: 0.25}
    assert window.energy_j == pytest.approx(2.75)
    assert window.average_power_w == pytest.approx(2.75)
    assert (window.resolved, window.counter_reset, window.note) == (True, False, "")
    assert window.source == "measured"
    assert window.global_energy_j is None


def test_windows_nest_and_laps_chain():
    counters = ScriptedCounters({0: [0, 1_000, 3_000, 6_000, 6_500]})
    meter = meter_for(counters)
    assert meter.lap() is None  # read 0
    meter.begin_window("forward")  # read 1000
    counters.now_s = 0.5
    assert meter.end_window("forward").energy_j == pytest.approx(2.0)  # read 3000
    counters.now_s = 1.0
    lap = meter.lap()  # one read (6000) ends this lap and starts the next
    assert lap.name == "iteration"
    assert lap.energy_j == pytest.approx(6.0)
    assert lap.duration_s == pytest.approx(1.0)
    counters.now_s = 1.5
    assert meter.lap().energy_j == pytest.approx(0.5)  # read 6500


def test_counter_reset_counts_from_zero_and_is_flagged():
    counters = ScriptedCounters({0: [5_000, 6_000, 7_000, 300]})
    meter = meter_for(counters)
    meter.begin_window("a")
    meter.begin_window("b")
    counters.now_s = 1.0
    window = meter.end_window("b")
    assert window.energy_j == pytest.approx(1.0)
    assert not window.counter_reset
    window = meter.end_window("a")
    assert window.energy_j == pytest.approx(2.0 + 0.3)
    assert window.counter_reset
    assert "reset" in window.note


def test_counter_wrap_with_known_modulus_is_exact():
    modulus = 2**32
    counters = ScriptedCounters({0: [modulus - 100, 400]})
    meter = meter_for(counters, counter_modulus_mj=modulus)
    meter.begin_window("w")
    counters.now_s = 1.0
    window = meter.end_window("w")
    assert window.energy_j == pytest.approx(0.5)
    assert not window.counter_reset


@pytest.mark.parametrize("duration_s, resolved", [(0.15, False), (0.2, True), (3.0, True)])
def test_windows_shorter_than_two_counter_periods_are_unresolved(duration_s, resolved):
    counters = ScriptedCounters({0: [0, 100]})
    meter = meter_for(counters, counter_period_s=0.1)
    meter.begin_window("w")
    counters.now_s = duration_s
    window = meter.end_window("w")
    assert window.resolved is resolved
    assert ("too short to resolve" in window.note) is (not resolved)


def test_all_reduce_sums_energy_and_propagates_flags():
    other_rank = [10.0, 1.0, 0.0]  # 10 J, and its window was unresolved
    sent = []

    def all_reduce_sum(values):
        sent.append(list(values))
        return [mine + theirs for mine, theirs in zip(values, other_rank, strict=True)]

    counters = ScriptedCounters({0: [0, 2_000]})
    meter = meter_for(counters, all_reduce_sum=all_reduce_sum)
    meter.begin_window("w")
    counters.now_s = 1.0
    window = meter.end_window("w")
    assert sent == [[2.0, 0.0, 0.0]]
    assert window.energy_j == pytest.approx(2.0)
    assert window.global_energy_j == pytest.approx(12.0)
    assert not window.resolved
    assert "another rank" in window.note


def test_missing_counter_is_reported_at_construction():
    class NoCounter(ScriptedCounters):
        def supports_get_total_energy_consumption(self, index):
            return False

    with pytest.raises(EnergyCounterUnavailableError):
        EnergyMeter(NoCounter({0: []}), [0])
    with pytest.raises(EnergyCounterUnavailableError):
        EnergyMeter(ScriptedCounters({}), [])


def test_simulated_gpus_give_modelled_figures_on_virtual_time(tmp_path):
    handle = open_gpus(
        "simulated", "h200", dry_run=False, num_simulated_gpus=1, state_path=tmp_path / "s.json"
    )
    gpus, spec = handle.gpus, handle.spec
    meter = EnergyMeter.from_handle(handle, [0])
    assert meter.counter_period_s == spec.energy_counter_period_s
    work = WorkProfile(compute_s=0.05, memory_s=0.01)
    meter.begin_window("busy")
    modelled_j = sum(gpus.execute(0, work)[1] for _ in range(20))
    window = meter.end_window("busy")
    assert window.source == "modelled"
    assert window.duration_s == pytest.approx(gpus.virtual_time_s(0))
    assert window.resolved
    # the counter lags by at most one update period of busy power
    assert modelled_j - spec.power_limit_w * spec.energy_counter_period_s <= window.energy_j <= modelled_j
