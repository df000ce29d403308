"""The voltage curve and class activities fitted from what a GPU does by itself (made-up and recorded)."""

import dataclasses
import json
from pathlib import Path

import pytest
from calibration_truth import (
    COPY_ACTIVITY,
    DYNAMIC_W,
    KNEE_MHZ,
    MEMORY_POWER_W,
    VOLTAGE_RATIO,
    WORKLOADS,
    synthetic_run,
)

from megatron_energy.dvfs.calibration import DUTY_SUFFIX, CalibrationRun
from megatron_energy.dvfs.calibration_fit import fit_curve, residual_lines
from megatron_energy.dvfs.kernel_classes import KernelClass

RECORDED = sorted((Path(__file__).parents[1] / "docs" / "results" / "data").glob("*-calibration-h100-*.json"))


def fit(run: CalibrationRun):
    return fit_curve(run, KNEE_MHZ, MEMORY_POWER_W, 900.0)


def test_the_fit_recovers_a_known_voltage_curve_and_class_activities():
    result = fit(synthetic_run())
    assert result.voltage_ratio == pytest.approx(VOLTAGE_RATIO, abs=0.005)
    assert result.dynamic_power_max_w == pytest.approx(DYNAMIC_W, rel=0.01)
    for workload in result.workloads:
        kernel_class, activity = WORKLOADS[workload.name]
        assert workload.kernel_class == kernel_class
        assert workload.activity == pytest.approx(activity, rel=0.01), workload.name
        assert workload.capped
        assert abs(workload.clock_error) < 0.003, workload.name
    assert result.class_activities()[KernelClass.GEMM_FP8] == pytest.approx(1.27, rel=0.01)
    assert KernelClass.GEMM_BF16 not in result.class_activities()
    assert result.memory_core_activity == pytest.approx(COPY_ACTIVITY, rel=0.01)


def test_the_bursts_clock_comes_from_their_throughput_not_from_nvml_s_clock_reading():
    """NVML reads the top clock in bursts a fast limit holds lower: fitted to that, the curve is wrong."""
    honest = fit(synthetic_run())
    misled = fit(synthetic_run(with_rates=False))
    assert honest.worst_capped_clock_error() < 0.003
    assert misled.worst_capped_clock_error() > 0.03


def test_a_workload_without_its_duty_cycled_run_or_a_reference_is_refused():
    run = synthetic_run()
    without_duty = dataclasses.replace(
        run, loops=tuple(loop for loop in run.loops if loop.name != "attention" + DUTY_SUFFIX)
    )
    with pytest.raises(ValueError, match=r"without a duty-cycled run: \['attention'\]"):
        fit(without_duty)
    no_reference = dataclasses.replace(
        run, loops=tuple(loop for loop in run.loops if "bf16" not in loop.name)
    )
    with pytest.raises(ValueError, match="first compute workload must be a gemm_bf16"):
        fit(no_reference)


def test_the_table_says_what_was_measured_and_what_is_modelled():
    lines = residual_lines(fit(synthetic_run()))
    assert len(lines) == 1 + len(WORKLOADS) + 1 + 1
    assert all(any(line.startswith(name) for line in lines) for name in WORKLOADS)
    assert "clocks measured, predictions modelled" in lines[-1]


@pytest.mark.parametrize("path", RECORDED, ids=lambda path: path.stem)
def test_recorded_h100_runs_are_fitted_within_3_percent_of_every_class_cap_clock(path):
    run = CalibrationRun.from_dict(json.loads(path.read_text())["run"])
    result = fit(run)
    assert all(workload.capped for workload in result.workloads)
    assert result.worst_capped_clock_error() <= 0.03
    activities = result.class_activities()
    assert (
        activities[KernelClass.GEMM_FP8]
        > 1.0
        > activities[KernelClass.GEMM_TF32]
        > activities[KernelClass.ATTENTION]
    )


def test_four_recorded_h100_runs_are_here():
    assert len(RECORDED) == 4
