"""The calibrated spec: fields measured, fitted or carried, each with its source; its file round-trips."""

import dataclasses

import numpy as np
import pytest
from calibration_truth import IDLE_W, KNEE_MHZ, MEMORY_POWER_W, WORKLOADS, synthetic_run

from megatron_energy.dvfs.calibrated_spec import calibrate_spec
from megatron_energy.dvfs.calibration import (
    CalibrationRun,
    power_from_counter,
    spec_differences,
    write_spec_yaml,
)
from megatron_energy.dvfs.calibration_fit import fit_curve
from megatron_energy.dvfs.kernel_classes import ClassMix, KernelClass
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import load_gpu_spec

SHIPPED = load_gpu_spec("h100-sxm")


def calibrated(run: CalibrationRun | None = None, name: str = "h100-sxm.calibrated"):
    run = run or synthetic_run()
    fit = fit_curve(
        run, SHIPPED.voltage_knee_mhz, SHIPPED.memory_power_w, SHIPPED.memory_saturation_mhz or 0.0
    )
    return calibrate_spec(SHIPPED, run, fit, name=name)


def test_the_calibrated_model_predicts_every_class_cap_clock_it_was_fitted_to():
    run = synthetic_run()
    spec = calibrated(run)
    assert SHIPPED.voltage_knee_mhz == KNEE_MHZ and SHIPPED.memory_power_w == MEMORY_POWER_W
    assert spec.idle_power_w == pytest.approx(IDLE_W)
    model = GpuPowerModel(spec)
    for name, (kernel_class, _) in WORKLOADS.items():
        loop = run.loop(name)
        assert loop is not None
        work = WorkProfile(1.0, 0.0, compute_mix=ClassMix.single(kernel_class))
        assert model.effective_clock_mhz(work, 1980) == pytest.approx(loop.median_sm_clock_mhz, rel=3e-3), (
            name
        )
    assert set(spec.class_activity) == {k for k, _ in WORKLOADS.values()} - {KernelClass.GEMM_BF16}


def test_every_field_says_where_it_came_from():
    spec = calibrated()
    assert spec.sources["idle_power_w"].startswith(
        "measured NVIDIA H100 80GB HBM3 (driver 580.159.04, 2026-12-06"
    )
    assert "idle loop" in spec.sources["idle_power_w"]
    assert spec.sources["voltage_knee_mhz"].startswith("carried from h100-sxm.yaml: ")
    assert "fitted V_min/V_max 0.500" in spec.sources["voltage_min_v"]
    assert "gemm_fp8 1.270" in spec.sources["class_activity"]
    assert "gemm_bf16_8192@duty loop" in spec.sources["dynamic_power_max_w"]
    assert spec.voltage_knee_mhz == SHIPPED.voltage_knee_mhz


def test_fitted_figures_carry_their_fits_ranges_and_measured_ones_drop_the_shipped_ranges():
    shipped = dataclasses.replace(
        SHIPPED,
        ranges={"idle_power_w": (100.0, 130.0), "switch_latency_s": (0.006, 0.03)},
        sources={**SHIPPED.sources, "ranges.idle_power_w": "assumed", "ranges.switch_latency_s": "paper"},
    )
    run = synthetic_run()
    fit = fit_curve(run, KNEE_MHZ, MEMORY_POWER_W, 900.0)
    spec = calibrate_spec(shipped, run, fit, name="x")
    assert "idle_power_w" not in spec.ranges and "ranges.idle_power_w" not in spec.sources  # measured now
    assert spec.ranges["switch_latency_s"] == (0.006, 0.03)  # still assumed: carried
    low, high = spec.ranges["dynamic_power_max_w"]
    assert low <= spec.dynamic_power_max_w <= high
    assert high - low == pytest.approx(4 * fit.dynamic_power_error_w, abs=0.2)  # the made-up GPU fits exactly
    for kernel_class, activity in spec.class_activity.items():
        low, high = spec.ranges[f"class_activity.{kernel_class}"]
        assert low <= activity <= high
    assert "standard errors of the fit" in spec.sources["ranges.voltage_min_v"]


def test_blocked_power_below_idle_is_raised_to_idle_and_says_so():
    spec = calibrated(synthetic_run(blocked_w=100.0), name="x")
    assert spec.blocked_power_w == pytest.approx(IDLE_W)
    assert "below idle" in spec.sources["blocked_power_w"]


def test_written_spec_loads_back_identically(tmp_path):
    spec = calibrated()
    path = tmp_path / "h100-sxm.calibrated.yaml"
    write_spec_yaml(spec, path, header="calibrated on a made-up H100\nsecond line")
    text = path.read_text()
    assert text.startswith("# calibrated on a made-up H100\n# second line\n")
    assert "sm_clocks_mhz:\n  max: 1980\n  min: 345\n  step: 15" in text
    loaded = load_gpu_spec(str(path))
    assert loaded == spec and loaded.sources == spec.sources


def test_written_spec_must_be_named_after_its_file(tmp_path):
    spec = calibrated(name="other")
    with pytest.raises(ValueError, match="file stem"):
        write_spec_yaml(spec, tmp_path / "h100-sxm.calibrated.yaml", header="")


def test_differences_name_the_changed_fields():
    spec = calibrated()
    shipped = dataclasses.replace(SHIPPED, dynamic_power_max_w=1020.0, class_activity={})
    lines = spec_differences(shipped, spec)
    change = 100 * (spec.dynamic_power_max_w / shipped.dynamic_power_max_w - 1)
    expected = f"dynamic_power_max_w: {shipped.dynamic_power_max_w:g} -> {spec.dynamic_power_max_w:g}"
    assert f"{expected} ({change:+.1f} %)" in lines
    assert any(line.startswith("class_activity: none -> gemm_fp16 1.12") for line in lines)
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
