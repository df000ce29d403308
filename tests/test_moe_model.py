"""Issue 35, item 2: MoE in the job, the workload model, phases, collectives and ``simulate --compare``.

Every expected value is derived here from the shape (tokens, hidden size, top-k, EP) and the GPU spec's
constants, not read back from the code under test. The example is Mixtral-8x7B-shaped: h = 4096, expert FFN
14336 (SwiGLU), 8 experts top-2, b = 1, s = 4096, TP = 2 (so 2048 tokens per GPU), EP = 4, PP = 4 (8 layers a
stage), 16 microbatches, on H200 (NVLink 450 GB/s, 20 us latency, 24 GB/s per CTA, 16 CTAs by default).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from megatron_energy.cli import main
from megatron_energy.commands.all_to_all_share import all_to_all_share
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.job import JobConfig, JobConfigError
from megatron_energy.optimisers.kareus.choices import ClassChoice, KareusModel
from megatron_energy.optimisers.kareus.collective_optimiser import class_space
from megatron_energy.pipeline.collective_names import CollectiveName
from megatron_energy.pipeline.collectives import build_collectives
from megatron_energy.pipeline.modelled_phases import LAYER_PATTERN, layer_pattern, modelled_phases
from megatron_energy.pipeline.moe import MoeShape
from megatron_energy.pipeline.workload import GEMM_EFFICIENCY, instruction_work

EXAMPLE = Path(__file__).resolve().parents[1] / "configs" / "examples" / "mixtral-8x7b-pp4-tp2-ep4-h200.yaml"
TOKENS = 4096 // 2  # per GPU: b x s / TP
BUFFER_BYTES = 2 * TOKENS * 2 * 4096  # bf16 x tokens x top-2 x hidden
SENT_BYTES = BUFFER_BYTES * 3 / 4  # EP = 4: a quarter stays on the GPU
H200 = load_gpu_spec("h200")
P2P_GBPS = H200.p2p_bandwidth_gbps  # the workload model's TP all-reduce link


def _job(**moe: object) -> JobConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["moe"] = {**data["moe"], **moe}
    return JobConfig.from_dict(data)


def _exchange(job: JobConfig, stage: int = 0):
    (collective,) = [
        c
        for c in build_collectives(job.collective_workload())
        if c.stage == stage and c.name == CollectiveName("ep", "all_to_all")
    ]
    return collective


def test_the_all_to_all_moves_tokens_times_topk_times_hidden_per_launch() -> None:
    job = JobConfig.load(EXAMPLE)
    exchange = _exchange(job)
    assert CollectiveName("ep", "all_to_all").class_key == "ep.all_to_all"
    assert (exchange.bytes_per_launch, exchange.group_size) == (BUFFER_BYTES, 4)
    assert exchange.traffic_bytes == SENT_BYTES
    # dispatch + combine, forward and backward: 4 per layer and microbatch, 8 layers, 16 microbatches
    assert exchange.launches_per_iteration == 4 * 8 * 16
    assert (exchange.link, exchange.bandwidth_gbps, exchange.overlapped) == ("nvlink", 450.0, False)
    across_nodes = _exchange(_job(all_to_all_bandwidth_gbps=50))
    assert (across_nodes.link, across_nodes.bandwidth_gbps) == ("nic", 50.0)
    dense = dataclasses.replace(job, shape=dataclasses.replace(job.shape, moe=None))
    assert not [c for c in build_collectives(dense.collective_workload()) if c.cls.group == "ep"]


def test_an_moe_layer_costs_router_experts_and_its_all_to_alls() -> None:
    job = JobConfig.load(EXAMPLE)
    dense = dataclasses.replace(job.shape, moe=None)
    work = instruction_work(job.shape, H200, 4)[(1, 0, "forward")]  # a middle stage: layers only
    dense_work = instruction_work(dense, H200, 4)[(1, 0, "forward")]
    h, f, experts = 4096, 14336, 8
    router_flops = 2 * TOKENS * h * experts
    expert_flops = 2 * TOKENS * 2 * h * f * 3  # top-2, three SwiGLU matrices
    dense_mlp_flops = 2 * 4096 * h * f * 3 / 2  # the dense MLP split over TP = 2
    extra_s = 8 * (router_flops + expert_flops - dense_mlp_flops) / (989e12 * GEMM_EFFICIENCY)
    assert work.compute_s - dense_work.compute_s == pytest.approx(extra_s, rel=1e-9)
    all_to_all_s = 20e-6 + SENT_BYTES / 450e9  # one all-to-all over NVLink
    assert work.fixed_s - dense_work.fixed_s == pytest.approx(8 * 2 * all_to_all_s, rel=1e-9)
    hidden = _job(overlapped_all_to_all=False)
    overlapped = dataclasses.replace(
        hidden.shape, moe=dataclasses.replace(hidden.shape.moe, overlapped_all_to_all=True)
    )
    assert instruction_work(overlapped, H200, 4)[(1, 0, "forward")].fixed_s == pytest.approx(
        dense_work.fixed_s
    )


def test_an_moe_layers_phases_show_router_dispatch_experts_and_combine() -> None:
    job = JobConfig.load(EXAMPLE)
    pattern = layer_pattern(job.shape, H200)
    assert layer_pattern(dataclasses.replace(job.shape, moe=None), H200) == LAYER_PATTERN
    assert [kind for kind, _ in pattern] == [
        "memory", "compute", "communication", "memory",  # norm, attention, TP collective, residual + norm
        "compute", "memory", "communication",  # router, permute, dispatch
        "compute", "memory", "compute",  # FC1, activation, FC2
        "communication", "memory", "communication", "memory",  # combine, unpermute, TP collective, residual
    ]  # fmt: skip
    for kind in ("compute", "memory", "communication"):
        assert sum(share for k, share in pattern if k == kind) == pytest.approx(1.0)
    all_to_all_s = 20e-6 + SENT_BYTES / 450e9
    tp_s = 20e-6 + 2 * (2 - 1) / 2 * 2 * 4096 * 4096 / (P2P_GBPS * 1e9) + 12 * 2e-6 / 2  # + half the gaps
    assert pattern[6][1] == pytest.approx(all_to_all_s / (2 * all_to_all_s + 2 * tp_s), rel=1e-9)
    assert pattern[4][1] == pytest.approx(
        2 * TOKENS * 4096 * 8 / (2 * TOKENS * 4096 * 8 + 2 * TOKENS * 2 * 4096 * 14336 * 3 + _attention()),
        rel=1e-9,
    )
    work = instruction_work(job.shape, H200, 4)[(1, 0, "forward")]
    phases = modelled_phases(work, 8, job.planning_job(_target(), 2).layer_pattern)
    dispatches = [p for p in phases if p.kind == "communication"]
    assert len(phases) == 8 * 14 - 7  # 14 runs a layer; a residual and the next layer's norm merge
    assert len(dispatches) == 8 * 4  # TP, dispatch, combine, TP
    assert dispatches[1].duration_s == pytest.approx(work.fixed_s / 8 * pattern[6][1], rel=1e-9)


def _attention() -> float:
    """Attention GEMM and core time of one layer in GEMM-FLOP equivalents (weights of the compute shares)."""
    h, kv, tokens = 4096, 8 * 128, 4096
    gemm = (2 * tokens * h * (h + 2 * kv) + 2 * tokens * h * h) / 2
    core = 4 * tokens * tokens * h / 2
    return gemm + core * 0.80 / 0.60


def _target():
    from megatron_energy.target import parse_target

    return parse_target("iso-time")


def test_kareus_gives_the_all_to_all_a_budget_and_the_share_follows_it() -> None:
    job = JobConfig.load(EXAMPLE)
    workload = job.collective_workload()
    space = class_space("ep.all_to_all", workload)
    assert (space.launches, space.clock_steps) == ((0,), (0,))
    assert set(space.ctas) >= {4, 8, 16, 32}
    collectives = build_collectives(workload)
    share = all_to_all_share(collectives, None, 2.0, H200)
    default_s = 512 * (20e-6 + SENT_BYTES / (16 * 24e9))  # NCCL's default 16 CTAs x 24 GB/s < NVLink
    assert share is not None and share.time_s == pytest.approx(default_s, rel=1e-9)
    assert share.share == pytest.approx(default_s / 2.0)
    model = KareusModel(job.build_dag(), job.synthetic_profile(), H200, collectives, 8)
    eight = {(stage, "ep.all_to_all"): ClassChoice(max_ctas=8) for stage in range(4)}
    assert model.schedule(eight).inline  # the budget reaches the overlap model's instructions
    slower = all_to_all_share(collectives, _point(model, eight), 2.0, H200)
    assert slower is not None and slower.time_s == pytest.approx(512 * (20e-6 + SENT_BYTES / (8 * 24e9)))


def _point(model: KareusModel, choices):
    from megatron_energy.plan import PlanPoint, RankPlan

    ranks = tuple(RankPlan(tuple(model.actions(stage, choices)), 0.0, 0.0) for stage in range(4))
    return PlanPoint("x", 1.0, 1.0, 0.0, ranks)


@pytest.mark.parametrize(
    ("moe", "message"),
    [
        ({"num_experts": 8, "topk": 9}, "moe.topk 9 exceeds moe.num_experts 8"),
        ({"num_experts": 6, "topk": 2, "expert_parallel": 4}, "moe.num_experts 6 is not a multiple"),
        ({"num_experts": 16, "topk": 2, "expert_parallel": 16}, "moe.expert_parallel 16 does not divide"),
        ({"num_experts": 8, "topk": 0}, "moe.topk must be a positive integer"),
        ({"num_experts": 8}, "moe is missing ['topk']"),
        ({"num_experts": 8, "topk": 2, "experts": 3}, "moe has unknown key(s) ['experts']"),
        (
            {"num_experts": 8, "topk": 2, "all_to_all_bandwidth_gbps": -1},
            "moe.all_to_all_bandwidth_gbps must",
        ),
        ({"num_experts": 8, "topk": 2, "overlapped_all_to_all": True}, "only the combined 1F1B schedule"),
        ("eight", "moe must be a mapping"),
    ],
)
def test_bad_moe_settings_name_the_key_and_the_fix(moe: object, message: str) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["moe"] = moe
    with pytest.raises(JobConfigError, match=re.escape(message)):
        JobConfig.from_dict(data, source="job.yaml")


def test_moe_with_tensor_parallelism_needs_sequence_parallelism() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["sequence_parallel"] = False
    with pytest.raises(JobConfigError, match="needs sequence_parallel: true"):
        JobConfig.from_dict(data)
    assert MoeShape.from_dict({"num_experts": 4, "topk": 1}).expert_parallel == 1


@pytest.mark.slow
def test_simulate_compare_plans_every_mode_of_the_moe_example_with_the_all_to_alls_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--config", str(EXAMPLE), "--compare", "--trials", "1", "--points", "3"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│ ")}
    assert {"stock", "perseus", "kareus", "all"} <= set(rows)
    assert "all-to-all (share)" in out and "(modelled: Kareus's contention model" in out
    stock = [cell.strip() for cell in rows["stock"].strip("│").split("│")]
    default_s = 512 * (20e-6 + SENT_BYTES / (16 * 24e9))
    assert stock[-1] == f"{default_s:.4f} s ({100 * default_s / float(stock[2]):.1f} %)"
    for mode in ("perseus", "kareus", "all"):
        assert re.fullmatch(r"\d+\.\d{4} s \(\d+\.\d %\)", rows[mode].strip("│").split("│")[-1].strip())
