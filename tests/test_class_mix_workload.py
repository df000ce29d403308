"""Kernel classes in the workload model, the job description, the fits and the cap clocks they predict."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from megatron_energy.dvfs.kernel_classes import ClassMix, KernelClass
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile, fit_work_profile
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.job import JobConfig, JobConfigError
from megatron_energy.megatron.session_factory import transformer_shape
from megatron_energy.optimisers.interface import PlanningJob, ProfileRequest
from megatron_energy.optimisers.kernel.phase_optimiser import _Context
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.modelled_phases import LAYER_PATTERN, layer_pattern, modelled_phases, run_mixes
from megatron_energy.pipeline.moe import MoeShape
from megatron_energy.pipeline.profile import Profile
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import TransformerShape, instruction_mixes, instruction_work
from megatron_energy.runtime.profiling.collector import ProfileRow
from megatron_energy.runtime.profiling.extrapolation import extrapolate_rows
from megatron_energy.runtime.profiling.measured_inputs import MeasuredInputs
from megatron_energy.target import EnergyTarget

K = KernelClass
H100 = load_gpu_spec("h100-sxm")
ACTIVITIES = {K.GEMM_FP8: 1.2, K.GEMM_TF32: 0.8, K.ATTENTION: 0.85, K.GEMM_FP16: 1.05}
CALIBRATED = dataclasses.replace(H100, class_activity=ACTIVITIES)
MODEL = GpuPowerModel(CALIBRATED)
SHAPE = TransformerShape.from_name("llama-7b", micro_batch_size=2)


def _compute_only(work: WorkProfile) -> WorkProfile:
    return WorkProfile(work.compute_s, 0.0, 0.0, work.compute_mix)


@pytest.mark.parametrize("kernel_class", [k for k in KernelClass if k.is_compute])
def test_the_cap_of_single_class_work_is_the_classs_own_cap(kernel_class: KernelClass) -> None:
    """Work all of one class caps where the reference class would with that class's dynamic power."""
    own = dataclasses.replace(
        H100,
        dynamic_power_max_w=H100.dynamic_power_max_w * ACTIVITIES.get(kernel_class, 1.0),
        class_activity={},
    )
    single = WorkProfile(1.0, 0.0, 0.0, ClassMix.single(kernel_class))
    assert MODEL.power_cap_clock_mhz(single) == pytest.approx(
        GpuPowerModel(own).power_cap_clock_mhz(WorkProfile(1.0, 0.0)), abs=1e-6
    )


def test_an_fp8_instruction_caps_lower_than_a_bf16_one_and_attention_as_its_activity_says() -> None:
    key = Work(1, 0, "forward")
    bf16 = _compute_only(instruction_work(SHAPE, CALIBRATED, 4)[key])
    fp8 = _compute_only(instruction_work(dataclasses.replace(SHAPE, fp8=True), CALIBRATED, 4)[key])
    long_context = dataclasses.replace(SHAPE, seq_length=32768, micro_batch_size=1)
    attention_heavy = _compute_only(instruction_work(long_context, CALIBRATED, 4)[key])
    caps = {
        name: MODEL.power_cap_clock_mhz(w)
        for name, w in (("bf16", bf16), ("fp8", fp8), ("attn", attention_heavy))
    }
    gemm_bf16 = MODEL.power_cap_clock_mhz(WorkProfile(1.0, 0.0, 0.0, ClassMix.single(K.GEMM_BF16)))
    attention = MODEL.power_cap_clock_mhz(WorkProfile(1.0, 0.0, 0.0, ClassMix.single(K.ATTENTION)))
    assert caps["fp8"] < caps["bf16"]
    assert gemm_bf16 < caps["bf16"] < caps["attn"] < attention  # attention (0.85) is the cooler class
    assert attention_heavy.compute_mix.as_dict()["attention"] > 0.5 > bf16.compute_mix.as_dict()["attention"]
    # without activities every mix prices as the bf16 GEMM it used to be, to the last bit (same plans)
    odd = ClassMix.of({K.GEMM_BF16: 1.0, K.ATTENTION: 6.0, K.GEMM_FP8: 15.0})
    assert sum(share for _, share in odd.shares) != 1.0 and odd.activity({}) == 1.0
    uncalibrated = GpuPowerModel(dataclasses.replace(H100, class_activity={}))
    assert uncalibrated.power_cap_clock_mhz(fp8) == uncalibrated.power_cap_clock_mhz(
        dataclasses.replace(fp8, compute_mix=None)
    )


def test_the_workload_model_puts_each_gemm_in_its_dtypes_class_at_its_peak() -> None:
    bf16 = instruction_work(SHAPE, H100, 4)
    fp8 = instruction_work(dataclasses.replace(SHAPE, fp8=True), H100, 4)
    middle, last = Work(1, 0, "backward"), Work(3, 0, "backward")
    assert {k for k, _ in bf16[middle].compute_mix.shares} == {K.GEMM_BF16, K.ATTENTION}
    assert {k for k, _ in fp8[middle].compute_mix.shares} == {K.GEMM_FP8, K.ATTENTION}
    assert {k for k, _ in fp8[last].compute_mix.shares} == {
        K.GEMM_FP8,
        K.GEMM_BF16,
        K.ATTENTION,
    }  # the LM head
    attention_s = bf16[middle].compute_s * bf16[middle].compute_mix.as_dict()["attention"]
    gemm_s = bf16[middle].compute_s - attention_s
    assert fp8[middle].compute_s == pytest.approx(attention_s + gemm_s / 2)  # fp8 runs at twice bf16's peak
    fp32 = instruction_work(dataclasses.replace(SHAPE, params_dtype="fp32"), H100, 4)
    assert fp32[middle].compute_mix.as_dict()["gemm_tf32"] > 0
    assert fp32[middle].compute_s == pytest.approx(attention_s + 2 * gemm_s)
    assert bf16[middle].memory_s == fp8[middle].memory_s and bf16[middle].fixed_s == fp8[middle].fixed_s
    assert instruction_mixes(SHAPE, H100, 4) == {key: work.compute_mix for key, work in bf16.items()}


def test_moe_experts_run_in_the_layer_class_and_the_router_in_the_params_class() -> None:
    moe = dataclasses.replace(SHAPE, moe=MoeShape(num_experts=8, topk=2), fp8=True)
    flops = moe.layer_forward_gemm_flops_by_class()
    assert set(flops) == {K.GEMM_FP8, K.GEMM_BF16}
    assert sum(flops.values()) == pytest.approx(moe.layer_forward_gemm_flops())
    assert flops[K.GEMM_BF16] == pytest.approx(2 * 2 * 4096 * 4096 * 8)  # the router: 2 t h E
    assert dataclasses.replace(moe, fp8=False).layer_forward_gemm_flops_by_class() == {
        K.GEMM_BF16: moe.layer_forward_gemm_flops()
    }


@pytest.mark.parametrize("shape", [SHAPE, dataclasses.replace(SHAPE, moe=MoeShape(num_experts=8, topk=2))])
def test_modelled_phases_put_attention_in_the_attention_block_and_add_up_to_the_instructions_mix(
    shape,
) -> None:
    fp8 = dataclasses.replace(shape, fp8=True)
    work = instruction_work(fp8, H100, 4)[Work(1, 0, "forward")]
    phases = modelled_phases(work, 8, layer_pattern(fp8, H100))
    compute = [p for p in phases if p.kind == "compute"]
    total = sum((p.work for p in compute), WorkProfile(0.0, 0.0))
    assert dict(total.compute_mix.shares) == pytest.approx(dict(work.compute_mix.shares))
    attention_block, mlp = compute[0].work.compute_mix.as_dict(), compute[1].work.compute_mix.as_dict()
    assert attention_block["attention"] > work.compute_mix.as_dict()["attention"] and "attention" not in mlp
    assert all(p.work.compute_mix is None for p in phases if p.kind != "compute")
    # under a calibrated spec the attention block (cooler) caps higher than the fp8 MLP GEMMs
    assert MODEL.power_cap_clock_mhz(compute[0].work) > MODEL.power_cap_clock_mhz(compute[1].work)


def test_attention_beyond_the_attention_blocks_share_spills_over_the_other_compute_runs() -> None:
    mix = ClassMix.of({K.GEMM_BF16: 0.2, K.ATTENTION: 0.8})
    block, fc1, fc2 = (
        m
        for (kind, _), m in zip(LAYER_PATTERN, run_mixes(mix, LAYER_PATTERN), strict=True)
        if kind == "compute"
    )
    assert block == ClassMix.single(K.ATTENTION)
    assert fc1 == fc2  # the 0.35 of attention left over, over the MLP's 0.55 by their shares
    assert fc1.as_dict() == pytest.approx({"gemm_bf16": 0.2 / 0.55, "attention": 0.35 / 0.55})
    assert run_mixes(ClassMix.single(K.GEMM_FP8), LAYER_PATTERN) == [ClassMix.single(K.GEMM_FP8)] * 9


def test_job_files_and_megatron_arguments_name_the_precision() -> None:
    base = {"name": "j", "gpu": "h100-sxm", "model": "llama-7b", "pipeline_stages": 4, "micro_batch_size": 1}
    base |= {"num_microbatches": 8}
    assert JobConfig.from_dict(base).shape.layer_gemm_class == K.GEMM_BF16
    fp8 = JobConfig.from_dict(base | {"fp8": True})
    assert (fp8.shape.layer_gemm_class, fp8.shape.params_gemm_class) == (K.GEMM_FP8, K.GEMM_BF16)
    assert JobConfig.from_dict(base | {"params_dtype": "fp16"}).shape.layer_gemm_class == K.GEMM_FP16
    assert fp8.fingerprint() != JobConfig.from_dict(base).fingerprint()
    with pytest.raises(JobConfigError, match="params_dtype must be one of bf16, fp16, fp32, got 'int8'"):
        JobConfig.from_dict(base | {"params_dtype": "int8"})
    with pytest.raises(JobConfigError, match="fp8 must be true or false"):
        JobConfig.from_dict(base | {"fp8": "e4m3"})
    args = SimpleNamespace(
        num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4, seq_length=128,
        micro_batch_size=1, padded_vocab_size=1024, tensor_model_parallel_size=1, bf16=True, fp16=False,
        fp8="hybrid",
    )  # fmt: skip
    assert (transformer_shape(args).params_dtype, transformer_shape(args).fp8) == ("bf16", True)
    no_fp8 = SimpleNamespace(**(vars(args) | {"fp8": None, "bf16": False, "fp16": True}))
    assert (transformer_shape(no_fp8).params_dtype, transformer_shape(no_fp8).fp8) == ("fp16", False)
    fp32 = SimpleNamespace(**(vars(args) | {"fp8": None, "bf16": False}))
    assert transformer_shape(fp32).layer_gemm_class == K.GEMM_TF32


def test_bf16_jobs_keep_the_fingerprints_they_had() -> None:
    """Plans and caches name the job by its fingerprint; the precision fields join it only off default."""
    assert JobConfig.load("configs/examples/gpt3-xl-pp4-h100.yaml").fingerprint() == "86a918bb61ed9934"
    assert JobConfig.load("configs/examples/llama-7b-pp4-tp2-h200.yaml").fingerprint() == "ce497c353951b8eb"
    assert "fp8" not in SHAPE.identity() and dataclasses.replace(SHAPE, fp8=True).identity()["fp8"] is True


def test_a_fit_keeps_the_mix_it_was_priced_with() -> None:
    truth = WorkProfile(0.08, 0.015, 0.005, ClassMix.of({K.GEMM_FP8: 3.0, K.ATTENTION: 1.0}))
    points = [(f, MODEL.time_s(truth, f), MODEL.energy_j(truth, f)) for f in (1980, 1700, 1400, 1100, 800)]
    fit = fit_work_profile(CALIBRATED, points, truth.compute_mix)
    assert fit.work.compute_mix == truth.compute_mix
    assert fit.rms_time_error < 1e-3 and fit.rms_energy_error < 1e-3
    assert MODEL.power_cap_clock_mhz(fit.work) == pytest.approx(MODEL.power_cap_clock_mhz(truth), abs=2.0)
    prior = fit_work_profile(CALIBRATED, points[:1], truth.compute_mix)
    assert prior.source == "prior" and prior.work.compute_mix == truth.compute_mix


def test_a_dry_runs_extrapolated_rows_cap_as_the_instructions_classes_say() -> None:
    """Measured at the power limit, a stock row keeps its classes' activity: fp8 caps lower than tf32."""
    stock = ProfileRow(work=Work(0, 0, "forward"), clock_mhz=1980, time_s=0.1, energy_j=70.0, samples=3)
    fp8 = {stock.work: ClassMix.single(K.GEMM_FP8)}
    tf32 = {stock.work: ClassMix.single(K.GEMM_TF32)}
    hot = {r.clock_mhz: r for r in extrapolate_rows([stock], CALIBRATED, [1980, 1500, 1005], fp8)}
    cool = {r.clock_mhz: r for r in extrapolate_rows([stock], CALIBRATED, [1980, 1500, 1005], tf32)}
    assert hot[1980].time_s == pytest.approx(0.1) and cool[1980].time_s == pytest.approx(0.1)  # anchored
    # the fp8 work is capped below 1500 MHz at the stock clock's power, so 1500 MHz costs it less time
    assert hot[1500].time_s / hot[1980].time_s < cool[1500].time_s / cool[1980].time_s


def test_a_stock_row_below_the_limit_sets_its_works_activity_from_the_measured_energy() -> None:
    """600 W measured at the top clock: the work draws that there, whatever its classes would (one clock)."""
    stock = ProfileRow(work=Work(0, 0, "forward"), clock_mhz=1980, time_s=0.1, energy_j=60.0, samples=3)
    rows = {
        kernel_class: {
            r.clock_mhz: r
            for r in extrapolate_rows(
                [stock], CALIBRATED, [1980, 1500], {stock.work: ClassMix.single(kernel_class)}
            )
        }
        for kernel_class in (K.GEMM_FP8, K.GEMM_TF32)
    }
    for by_clock in rows.values():
        assert by_clock[1980].energy_j == pytest.approx(60.0, rel=1e-3)
        assert by_clock[1500].energy_j < 60.0
    assert rows[K.GEMM_FP8][1500].time_s == pytest.approx(rows[K.GEMM_TF32][1500].time_s, rel=1e-3)


def test_measured_phases_write_their_mix_as_a_typed_object() -> None:
    mix = ClassMix.of({K.GEMM_BF16: 0.75, K.ATTENTION: 0.25})
    measured = MeasuredInputs(
        ProfileRequest(clock_grid=True, phases=True),
        phase_timelines={Work(0, 0, "forward"): [("compute", WorkProfile(0.01, 0.0, 0.001, mix))]},
    )
    text = measured.to_json()
    (entry,) = json.loads(text)["phase_timelines"]
    assert entry["phases"][0][1]["compute_mix"] == {"gemm_bf16": 0.75, "attention": 0.25}
    assert MeasuredInputs.from_json(text) == measured
    unmixed = {"compute_s": 0.01, "memory_s": 0.0, "fixed_s": 0.001, "compute_mix": None}  # as a43356c wrote
    older = json.loads(text) | {"phase_timelines": [entry | {"phases": [["compute", unmixed]]}]}
    (phase,) = MeasuredInputs.from_json(json.dumps(older)).phase_timelines[Work(0, 0, "forward")]
    assert phase == ("compute", WorkProfile(0.01, 0.0, 0.001))


@pytest.mark.slow
def test_the_phase_planner_fits_each_instruction_with_its_timelines_mix_else_the_workload_models() -> None:
    shape = TransformerShape.from_name("gpt3-1.3b", fp8=True)
    profile = Profile.synthetic(shape, H100, 2, clocks_mhz=[1980, 1500, 1005])
    measured = ClassMix.of({K.GEMM_BF16: 1.0, K.ATTENTION: 1.0})
    forward, backward = Work(0, 0, "forward"), Work(0, 0, "backward")
    job = PlanningJob(
        pipeline_orders(2, 4),
        "0123456789abcdef",
        EnergyTarget("iso-time"),
        phase_timelines={
            forward: [("memory", WorkProfile(0.0, 1e-3)), ("compute", WorkProfile(2e-3, 0.0, 0.0, measured))]
        },
        compute_mixes=instruction_mixes(shape, H100, 2),
    )
    context = _Context(MODEL, profile, job)
    assert context.compute_mix(forward) == measured  # recorded: the timeline's
    assert context.compute_mix(backward) == job.compute_mixes[backward]  # not recorded: the workload model's
    assert K.GEMM_FP8 in dict(context.compute_mix(backward).shares)
    assert context.compute_mix(Work(1, 0, "forward")) == job.compute_mixes[Work(1, 0, "forward")]
    assert (
        _Context(
            MODEL, profile, dataclasses.replace(job, phase_timelines=None, compute_mixes=None)
        ).compute_mix(forward)
        is None
    )
