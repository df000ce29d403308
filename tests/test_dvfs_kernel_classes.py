"""Kernel classes and memory clocks in the time/power model (pure Python)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from megatron_energy.dvfs.kernel_classes import ClassMix, KernelClass, parse_activities
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile, fit_work_profile
from megatron_energy.dvfs.spec import config_root, load_gpu_spec


@pytest.fixture
def h100():
    return load_gpu_spec("h100-sxm")


def test_a_mix_is_normalised_ordered_and_hashable():
    mix = ClassMix.of({KernelClass.ATTENTION: 1.0, KernelClass.GEMM_BF16: 3.0, KernelClass.GEMM_FP8: 0.0})
    assert mix.shares == ((KernelClass.GEMM_BF16, 0.75), (KernelClass.ATTENTION, 0.25))
    assert mix == ClassMix.of([(KernelClass.GEMM_BF16, 0.75), ("attention", 0.25)])
    assert hash(mix) == hash(ClassMix.of({KernelClass.ATTENTION: 2.0, KernelClass.GEMM_BF16: 6.0}))
    assert mix.activity({KernelClass.ATTENTION: 0.6}) == pytest.approx(0.75 * 1.0 + 0.25 * 0.6)


@pytest.mark.parametrize(
    "times, message",
    [
        ({KernelClass.MEMORY: 1.0}, "compute classes"),
        ({KernelClass.GEMM_BF16: -1.0}, ">= 0"),
        ({KernelClass.GEMM_BF16: 0.0}, "no class has a positive time"),
    ],
)
def test_a_mix_refuses_what_is_not_compute_time(times, message):
    with pytest.raises(ValueError, match=message):
        ClassMix.of(times)


def test_activities_are_checked():
    assert parse_activities({"gemm_fp8": 1.3}) == {KernelClass.GEMM_FP8: 1.3}
    with pytest.raises(ValueError, match="unknown kernel class 'gemm_int4'"):
        parse_activities({"gemm_int4": 1.0})
    with pytest.raises(ValueError, match="not a compute class"):
        parse_activities({"memory": 0.5})
    with pytest.raises(ValueError, match="1 by definition"):
        parse_activities({"gemm_bf16": 1.2})


def test_a_hotter_class_caps_at_a_lower_clock(h100):
    spec = dataclasses.replace(h100, class_activity={KernelClass.GEMM_FP8: 1.25, KernelClass.GEMM_TF32: 0.8})
    model = GpuPowerModel(spec)
    caps = {
        kernel_class: model.power_cap_clock_mhz(
            WorkProfile(1.0, 0.0, compute_mix=ClassMix.single(kernel_class))
        )
        for kernel_class in (KernelClass.GEMM_FP8, KernelClass.GEMM_BF16, KernelClass.GEMM_TF32)
    }
    assert caps[KernelClass.GEMM_FP8] < caps[KernelClass.GEMM_BF16] < caps[KernelClass.GEMM_TF32]
    assert caps[KernelClass.GEMM_BF16] == model.power_cap_clock_mhz(WorkProfile(1.0, 0.0))


def test_work_without_a_mix_is_priced_as_before(h100):
    model = GpuPowerModel(h100)
    work = WorkProfile(0.6, 0.3, 0.1)
    reference = dataclasses.replace(work, compute_mix=ClassMix.single(KernelClass.GEMM_BF16))
    for clock in (1980, 1410, 900):
        assert model.energy_j(work, clock) == model.energy_j(reference, clock)
        assert model.energy_j(work, clock, h100.max_memory_clock_mhz) == pytest.approx(
            model.energy_j(work, clock)
        )


def test_adding_work_blends_the_mixes_by_compute_time():
    gemm = WorkProfile(3.0, 0.0, compute_mix=ClassMix.single(KernelClass.GEMM_FP8))
    attention = WorkProfile(1.0, 1.0, compute_mix=ClassMix.single(KernelClass.ATTENTION))
    total = gemm + attention
    assert total.compute_mix == ClassMix.of({KernelClass.GEMM_FP8: 3.0, KernelClass.ATTENTION: 1.0})
    assert (WorkProfile(1.0, 0.0) + WorkProfile(1.0, 0.0)).compute_mix is None


def test_a_lower_memory_clock_slows_memory_bound_work_and_lifts_the_cap_of_compute_bound_work(h100):
    model = GpuPowerModel(h100)
    low = min(h100.memory_clocks_mhz)
    streaming = WorkProfile(0.0, 1.0)
    assert model.time_s(streaming, 1980, low) == pytest.approx(h100.max_memory_clock_mhz / low)
    gemm = WorkProfile(1.0, 0.0)
    assert model.power_cap_clock_mhz(gemm, low) > model.power_cap_clock_mhz(gemm)
    assert model.time_s(gemm, 1980, low) < model.time_s(gemm, 1980)
    assert model.energy_j(gemm, 1980, low) < model.energy_j(gemm, 1980)
    assert model.static_power_w(low) == pytest.approx(
        h100.idle_power_w - h100.memory_idle_power_w * (1 - low / h100.max_memory_clock_mhz)
    )


def test_a_spec_file_with_a_bad_activity_names_file_and_field(tmp_path, h100):
    raw = yaml.safe_load((config_root() / "gpus" / "h100-sxm.yaml").read_text())
    raw["class_activity"] = {"gemm_int4": 1.0}
    bad = tmp_path / "h100-sxm.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=r"h100-sxm.yaml: field 'class_activity': unknown kernel class"):
        load_gpu_spec(str(bad))


def test_a_one_clock_fit_takes_the_works_activity_from_its_measured_energy(h100):
    """A training step's kernels draw less than the calibration's products: one stock point says how much."""
    model = GpuPowerModel(h100)
    truth = WorkProfile(0.07, 0.03, 0.0, ClassMix.single(KernelClass.GEMM_BF16), activity_scale=0.3)
    point = (1980.0, model.time_s(truth, 1980), model.energy_j(truth, 1980))
    fitted = fit_work_profile(h100, [point], truth.compute_mix).work
    assert fitted.activity_scale == pytest.approx(0.3, rel=1e-3)
    assert model.effective_clock_mhz(fitted, 1980) == pytest.approx(model.effective_clock_mhz(truth, 1980))
    assert model.energy_j(fitted, 1200) == pytest.approx(model.energy_j(truth, 1200), rel=1e-3)
    # at (or just above) the power limit the energy cannot tell: the spec's training-step activity stays
    capped = WorkProfile(0.07, 0.03, 0.0, activity_scale=2.0)
    for watts in (model.power_w(capped, 1980), 1.02 * model.power_w(capped, 1980)):
        at_limit = (1980.0, 0.1, 0.1 * watts)
        assert fit_work_profile(h100, [at_limit]).work.activity_scale == h100.workload_activity_scale
    # the sum of two works keeps their compute-weighted activity
    assert (truth + WorkProfile(0.07, 0.0)).activity_scale == pytest.approx(0.65)
