"""Kernel classes' clock response measured from timelines at several clocks, and the split fitted to it."""

from __future__ import annotations

import pytest

from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.clock_response import class_response, fit_class_split
from megatron_energy.pipeline.phase_timeline import KernelRecord

SPEC = load_gpu_spec("h100-sxm")
MODEL = GpuPowerModel(SPEC)
TOP = SPEC.max_sm_clock_mhz


def _gemm(start_s: float, duration_s: float) -> KernelRecord:
    """A compute-bound kernel at its stock duration (2 TFLOP in 5 ms, few bytes)."""
    return KernelRecord("gemm", start_s, duration_s, flops=2e12 * duration_s / 5e-3, bytes=1e6)


def _copy(start_s: float, duration_s: float) -> KernelRecord:
    """A memory-bound kernel (bytes at ~3 TB/s at its stock duration)."""
    return KernelRecord("copy", start_s, duration_s, bytes=3e12 * duration_s)


def _step(gemm_s: float, copy_s: float) -> dict[str, list[KernelRecord]]:
    return {"energy:0:0:0:forward": [_gemm(0.0, gemm_s), _copy(gemm_s, copy_s)]}


def test_each_class_is_timed_at_every_clock_by_pairing_the_same_kernels() -> None:
    reference = [_step(5e-3, 2e-3)]
    others = {1500: [_step(5e-3 * TOP / 1500, 2e-3)], 990: [_step(5e-3 * TOP / 990, 2.2e-3)]}
    response = class_response(reference, others, TOP, SPEC)
    assert response["compute"] == pytest.approx({TOP: 1.0, 1500: TOP / 1500, 990: TOP / 990})
    assert response["memory"] == pytest.approx({TOP: 1.0, 1500: 1.0, 990: 1.1})


def test_a_range_whose_kernels_differ_at_another_clock_is_left_out() -> None:
    other = {"energy:0:0:0:forward": [_copy(0.0, 2e-3), _gemm(2e-3, 9e-3)]}  # another launch order
    assert class_response([_step(5e-3, 2e-3)], {1500: [other]}, TOP, SPEC) == {}


SPLITS = [WorkProfile(0.7, 0.2, 0.1), WorkProfile(0.0, 1.0), WorkProfile(0.3, 0.0, 0.7)]


@pytest.mark.parametrize("truth", SPLITS)
def test_the_fitted_split_recovers_the_shares_that_made_the_response(truth: WorkProfile) -> None:
    clocks = [TOP, 1755, 1530, 1305, 1080, 855]
    response = {f: MODEL.time_s(truth, f) / MODEL.time_s(truth, TOP) for f in clocks}
    split = fit_class_split(response, TOP, MODEL)
    assert MODEL.time_s(split, TOP) == pytest.approx(1.0, rel=1e-6)  # one second at the reference clock
    for f in clocks:
        assert MODEL.time_s(split, f) == pytest.approx(response[f], rel=1e-3)
