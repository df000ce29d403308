import dataclasses

import numpy as np
import pytest

from megatron_energy.dvfs.calibration import (
    CalibrationRun,
    LoopMeasurement,
    calibrate_spec,
    power_from_counter,
    spec_differences,
    write_spec_yaml,
)
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import load_gpu_spec

SHIPPED = load_gpu_spec("h200")
# A GPU that differs from the shipped spec in what a calibration run determines.
TRUTH = dataclasses.replace(SHIPPED, idle_power_w=112.0, dynamic_power_max_w=950.0, memory_core_activity=0.35)


def loop_from_model(name: str, work: WorkProfile, rate: float = 0.0) -> LoopMeasurement:
    """What the calibration script would measure on a GPU that follows ``TRUTH`` exactly."""
    model = GpuPowerModel(TRUTH)
    clock = model.effective_clock_mhz(work, TRUTH.default_sm_clock_mhz)
    return LoopMeasurement(name, 4.0, model.power_w(work, clock), clock, rate)


def made_up_run(blocked_w: float = 140.0) -> CalibrationRun:
    return CalibrationRun(
        gpu_name="NVIDIA H200",
        driver_version="580.159.04",
        date="2026-12-01",
        supported_sm_clocks_mhz=tuple(range(345, 1981, 15)),
        supported_memory_clocks_mhz=(2201, 3201),
        power_limit_w=700.0,
        counter_period_s=0.1,
        compute=loop_from_model("compute", WorkProfile(compute_s=1.0, memory_s=0.0), rate=700.0),
        memory=loop_from_model("memory", WorkProfile(compute_s=0.0, memory_s=1.0), rate=4300.0),
        blocked=LoopMeasurement("blocked", 4.0, blocked_w, 1980.0),
        idle=LoopMeasurement("idle", 4.0, 112.0, 1980.0),
    )


def test_calibration_recovers_the_power_model_of_the_measured_gpu():
    run = made_up_run()
    assert run.compute.median_sm_clock_mhz < 1980  # the made-up compute loop is power-capped
    spec = calibrate_spec(SHIPPED, run, name="h200.calibrated")
    assert spec.idle_power_w == pytest.approx(112.0)
    assert spec.blocked_power_w == pytest.approx(140.0)
    assert spec.dynamic_power_max_w == pytest.approx(950.0, rel=1e-3)
    assert spec.memory_core_activity == pytest.approx(0.35, abs=1e-3)
    # The calibrated model reproduces the measured capped clock and power.
    model = GpuPowerModel(spec)
    compute = WorkProfile(compute_s=1.0, memory_s=0.0)
    assert model.effective_clock_mhz(compute, 1980) == pytest.approx(
        run.compute.median_sm_clock_mhz, rel=2e-3
    )
    assert model.power_w(compute, 1980) == pytest.approx(run.compute.power_w, rel=2e-3)


def test_every_field_says_where_it_came_from():
    spec = calibrate_spec(SHIPPED, made_up_run(), name="h200.calibrated")
    assert spec.sources["idle_power_w"].startswith("measured NVIDIA H200 (driver 580.159.04, 2026-12-01")
    assert "idle loop" in spec.sources["idle_power_w"]
    assert spec.sources["voltage_knee_mhz"].startswith("carried from h200.yaml: ")
    assert "caps pure compute at" in spec.sources["dynamic_power_max_w"]
    assert spec.voltage_knee_mhz == SHIPPED.voltage_knee_mhz


def test_blocked_power_below_idle_is_raised_to_idle_and_says_so():
    spec = calibrate_spec(SHIPPED, made_up_run(blocked_w=100.0), name="x")
    assert spec.blocked_power_w == pytest.approx(112.0)
    assert "below idle" in spec.sources["blocked_power_w"]


def test_written_spec_loads_back_identically(tmp_path):
    spec = calibrate_spec(SHIPPED, made_up_run(), name="h200.calibrated")
    path = tmp_path / "h200.calibrated.yaml"
    write_spec_yaml(spec, path, header="calibrated on a made-up H200\nsecond line")
    text = path.read_text()
    assert text.startswith("# calibrated on a made-up H200\n# second line\n")
    assert "sm_clocks_mhz:\n  max: 1980\n  min: 345\n  step: 15" in text
    loaded = load_gpu_spec(str(path))
    assert loaded == spec and loaded.sources == spec.sources


def test_written_spec_must_be_named_after_its_file(tmp_path):
    spec = calibrate_spec(SHIPPED, made_up_run(), name="other")
    with pytest.raises(ValueError, match="file stem"):
        write_spec_yaml(spec, tmp_path / "h200.calibrated.yaml", header="")


def test_differences_name_the_changed_fields():
    spec = calibrate_spec(SHIPPED, made_up_run(), name="h200.calibrated")
    lines = spec_differences(SHIPPED, spec)
    change = 100 * (112.0 / SHIPPED.idle_power_w - 1)
    assert f"idle_power_w: {SHIPPED.idle_power_w:g} -> 112 ({change:+.1f} %)" in lines
    assert not any(line.startswith("sm_clocks_mhz") for line in lines)
    assert not any(line.startswith("voltage_knee_mhz") for line in lines)


def test_power_from_a_stepping_counter():
    # A counter that advances every 100 ms at 500 W, polled every 7 ms from a random phase.
    polls = np.arange(0.0, 3.0, 0.007) + 0.031
    energies = 500.0 * np.floor(polls / 0.1) * 0.1
    power_w, period_s = power_from_counter(polls, energies)
    assert power_w == pytest.approx(500.0, rel=0.01)
    assert period_s == pytest.approx(0.1, abs=0.008)


def test_power_from_a_counter_that_did_not_move_is_refused():
    with pytest.raises(ValueError, match="fewer than twice"):
        power_from_counter([0.0, 0.01, 0.02], [5.0, 5.0, 5.0])
