import random

import numpy as np
import pytest

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile, fit_work_profile
from megatron_energy.dvfs.spec import available_gpu_specs, load_gpu_spec

GEMM = WorkProfile(compute_s=1.0, memory_s=0.0)
COPY = WorkProfile(compute_s=0.0, memory_s=1.0)
WORKLOADS = {
    "gemm": GEMM,
    "copy": COPY,
    "mixed": WorkProfile(compute_s=0.6, memory_s=0.3, fixed_s=0.1),
    "mostly-memory": WorkProfile(compute_s=0.1, memory_s=0.9),
    "fixed-heavy": WorkProfile(compute_s=0.2, memory_s=0.1, fixed_s=0.7),
}


@pytest.fixture(scope="module")
def h200():
    return GpuPowerModel(load_gpu_spec("h200"))


@pytest.mark.parametrize("spec_name", available_gpu_specs())
@pytest.mark.parametrize("work_name", list(WORKLOADS))
def test_time_falls_and_power_rises_with_the_clock_and_power_respects_the_cap(spec_name, work_name):
    spec = load_gpu_spec(spec_name)
    model = GpuPowerModel(spec)
    work = WORKLOADS[work_name]
    clocks = sorted(spec.sm_clocks_mhz)
    times = np.array([model.time_s(work, clock) for clock in clocks])
    powers = np.array([model.power_w(work, clock) for clock in clocks])
    assert np.all(np.diff(times) <= 1e-12 * times[:-1])
    assert np.all(np.diff(powers) >= -1e-9)
    assert np.all(powers <= spec.power_limit_w + 1e-9)
    assert np.all(powers >= spec.idle_power_w)
    cap_clock = model.power_cap_clock_mhz(work)
    below_cap = [clock for clock in clocks if clock < cap_clock]
    uncapped = [model.uncapped_power_w(work, clock) for clock in below_cap]
    if work.compute_s + work.memory_s > 0:
        assert np.all(np.diff(uncapped) > 0)


def test_h200_gemm_hits_the_power_cap_near_the_measured_clock(h200):
    spec = h200.spec
    effective = h200.effective_clock_mhz(GEMM, spec.max_sm_clock_mhz)
    # Measured: a bf16 8192^3 GEMM loop ran power-capped at ~690 W with a median SM clock of ~1500 MHz.
    assert 1450 <= effective <= 1580
    assert h200.power_w(GEMM, spec.max_sm_clock_mhz) == pytest.approx(spec.power_limit_w)
    assert h200.uncapped_power_w(GEMM, spec.max_sm_clock_mhz) > spec.power_limit_w
    assert h200.time_s(GEMM, spec.max_sm_clock_mhz) == pytest.approx(spec.max_sm_clock_mhz / effective)
    # Asking for any clock above the cap clock changes nothing: the GPU runs at the cap clock.
    assert h200.time_s(GEMM, 1700) == h200.time_s(GEMM, 1980)
    assert h200.time_s(GEMM, 1400) > h200.time_s(GEMM, 1980)


def test_communication_inside_an_instruction_does_not_lift_the_cap_clock(h200):
    with_comm = WorkProfile(compute_s=1.0, memory_s=0.0, fixed_s=1.0)
    assert h200.effective_clock_mhz(with_comm, 1980) == pytest.approx(h200.effective_clock_mhz(GEMM, 1980))
    assert h200.power_w(with_comm, 1980) < h200.power_w(GEMM, 1980)


def test_h200_copy_runs_at_full_clock_near_the_measured_power(h200):
    # Measured: a device-to-device copy loop drew ~557 W at 1980 MHz.
    assert h200.effective_clock_mhz(COPY, 1980) == 1980
    assert h200.power_w(COPY, 1980) == pytest.approx(557, rel=0.05)


@pytest.mark.parametrize("spec_name", available_gpu_specs())
def test_memory_bound_work_is_cheapest_below_the_maximum_clock(spec_name):
    spec = load_gpu_spec(spec_name)
    model = GpuPowerModel(spec)
    best = min(spec.sm_clocks_mhz, key=lambda clock: model.energy_j(COPY, clock))
    assert best < 0.7 * spec.max_sm_clock_mhz
    assert model.time_s(COPY, best) <= 1.05 * model.time_s(COPY, spec.max_sm_clock_mhz)
    assert model.energy_j(COPY, best) < 0.8 * model.energy_j(COPY, spec.max_sm_clock_mhz)


def test_compute_bound_energy_has_an_interior_minimum(h200):
    clocks = h200.spec.sm_clocks_mhz
    energies = [h200.energy_j(GEMM, clock) for clock in clocks]
    best = clocks[int(np.argmin(energies))]
    assert h200.spec.min_sm_clock_mhz < best < h200.spec.max_sm_clock_mhz


def test_voltage_curve_is_flat_below_the_knee_and_reaches_v_max(h200):
    spec = h200.spec
    assert (
        h200.voltage_v(spec.min_sm_clock_mhz) == h200.voltage_v(spec.voltage_knee_mhz) == spec.voltage_min_v
    )
    assert h200.voltage_v(spec.max_sm_clock_mhz) == pytest.approx(spec.voltage_max_v)
    assert spec.voltage_min_v < h200.voltage_v(1500) < spec.voltage_max_v


def test_requests_outside_the_range_are_clamped_and_nonsense_is_rejected(h200):
    assert h200.effective_clock_mhz(COPY, 5000) == 1980
    assert h200.effective_clock_mhz(COPY, 100) == 345
    for bad in (0, -5, float("nan")):
        with pytest.raises(ValueError, match="positive number of MHz"):
            h200.time_s(COPY, bad)


def test_work_profile_rejects_negative_parts_and_scales():
    with pytest.raises(ValueError, match="memory_s"):
        WorkProfile(compute_s=1.0, memory_s=-0.1)
    assert WorkProfile(1.0, 2.0, 3.0).scaled(2) + WorkProfile(1.0, 0.0) == WorkProfile(3.0, 4.0, 6.0)


def _points(model, work, clocks):
    return [(clock, model.time_s(work, clock), model.energy_j(work, clock)) for clock in clocks]


def test_fit_recovers_a_known_work_profile(h200):
    truth = WorkProfile(compute_s=0.006, memory_s=0.002, fixed_s=0.0005)
    fit = fit_work_profile(h200.spec, _points(h200, truth, (1980, 1500, 1200, 900, 600)))
    assert fit.source == "fitted"
    assert fit.work.compute_s == pytest.approx(truth.compute_s, rel=1e-4)
    assert fit.work.memory_s == pytest.approx(truth.memory_s, rel=1e-4)
    assert fit.work.fixed_s == pytest.approx(truth.fixed_s, rel=1e-3)
    assert fit.rms_time_error < 1e-6
    assert "fitted to 5 points at 5 clocks" in fit.message


def test_fit_of_noisy_points_predicts_unmeasured_clocks(h200):
    truth = WorkProfile(compute_s=0.02, memory_s=0.008, fixed_s=0.001)
    rng = random.Random(7)
    noisy = [
        (clock, t * (1 + rng.gauss(0, 0.01)), e * (1 + rng.gauss(0, 0.01)))
        for clock, t, e in _points(h200, truth, (1980, 1800, 1500, 1200, 1000))
    ]
    fit = fit_work_profile(h200.spec, noisy)
    for clock in (1650, 1100, 700):
        assert h200.time_s(fit.work, clock) == pytest.approx(h200.time_s(truth, clock), rel=0.04)
        assert h200.energy_j(fit.work, clock) == pytest.approx(h200.energy_j(truth, clock), rel=0.04)


def test_fit_with_one_clock_falls_back_to_the_prior(h200):
    truth = WorkProfile(compute_s=0.006, memory_s=0.002)
    points = _points(h200, truth, (1200,)) * 3
    fit = fit_work_profile(h200.spec, points)
    assert fit.source == "prior"
    assert "prior" in fit.message and "1200 MHz" in fit.message
    assert fit.work.compute_s / (fit.work.compute_s + fit.work.memory_s) == pytest.approx(
        h200.spec.prior_compute_fraction
    )
    assert h200.time_s(fit.work, 1200) == pytest.approx(points[0][1])


@pytest.mark.parametrize("points", [[], [(1980, 0.0, 1.0)], [(1980, 1.0, float("inf"))], [(1980, 1.0)]])
def test_fit_rejects_bad_points(h200, points):
    with pytest.raises(ValueError):
        fit_work_profile(h200.spec, points)


def test_description_names_the_spec_and_parameters(h200):
    text = h200.describe()
    assert text.startswith("modelled (h200:")
    assert "P_dyn 1039 W" in text and "cap 700 W" in text and "f_sat 900 MHz" in text
