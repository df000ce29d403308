"""Issue 44 item 1: ``megatron-energy estimate -- <Megatron arguments>``.

Each example job is written here as the Megatron command line and node layout it describes (its YAML's
comments say how it runs); read by ``estimate``, each must give the example's own job. Then the refusals, each
naming the flag and the fix, and an estimate end to end whose Perseus iso-time saving is what ``plan`` prints
for the job YAML ``--save-job`` wrote.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from megatron_energy.cli import main
from megatron_energy.commands import estimate as estimate_command
from megatron_energy.commands.estimate_modes import estimate_job
from megatron_energy.commands.megatron_command_line import (
    MegatronCommandLineError,
    NodeLayout,
    read_megatron_job,
)
from megatron_energy.dvfs.spec import available_gpu_specs, load_gpu_spec
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.target import parse_target

EXAMPLES = Path(__file__).resolve().parents[1] / "configs" / "examples"

LLAMA_70B = (
    "pretrain_gpt.py --pipeline-model-parallel-size 8 --tensor-model-parallel-size 8 --sequence-parallel "
    "--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 "
    "--group-query-attention --num-query-groups 8 --seq-length 4096 --micro-batch-size 1 "
    "--global-batch-size 512 --swiglu --bf16 --padded-vocab-size 32000"
)
COMMAND_LINES = {
    "gpt3-xl-pp4-h100": (
        "--pipeline-model-parallel-size 4 --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
        "--seq-length 2048 --micro-batch-size 4 --global-batch-size 512 --padded-vocab-size 50257 --bf16",
        32,
    ),
    "llama-7b-pp4-tp2-h200": (
        "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4 "
        "--tensor-model-parallel-size 2 --sequence-parallel --num-layers 32 --hidden-size 4096 "
        "--ffn-hidden-size 11008 --num-attention-heads 32 --seq-length 4096 --micro-batch-size 1 "
        "--global-batch-size 256 --swiglu --bf16 --padded-vocab-size 32000",
        32,
    ),
    "llama-70b-pp8-tp8-a100": (LLAMA_70B, 256),
    "mixtral-8x7b-pp4-tp2-ep4-h200": (
        "--pipeline-model-parallel-size 4 --tensor-model-parallel-size 2 --sequence-parallel --num-layers 32 "
        "--hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention "
        "--num-query-groups 8 --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --swiglu --bf16 "
        "--padded-vocab-size 32000 --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 4",
        32,
    ),
}
"""Each example job as its Megatron arguments and GPU count (8 GPUs a node)."""


def _read(arguments: str, gpus: int, gpu: str = "h100-sxm", per_node: int = 8) -> JobConfig:
    spec = load_gpu_spec(gpu)
    layout = NodeLayout(gpus, per_node, spec.nic_bandwidth_gbps)
    return JobConfig.from_file(read_megatron_job(arguments.split(), layout, gpu, spec).job)


def _comparable(job: JobConfig) -> dict[str, object]:
    """A job's fields that the work depends on (name, description and the shape's name left out)."""
    fields = dataclasses.asdict(job)
    for name in ("name", "description", "model_name"):
        del fields[name]
    return fields


@pytest.mark.parametrize("example", sorted(COMMAND_LINES))
def test_each_example_is_the_job_its_megatron_command_line_describes(example: str) -> None:
    expected = JobConfig.load(EXAMPLES / f"{example}.yaml")
    arguments, gpus = COMMAND_LINES[example]
    assert _comparable(_read(arguments, gpus, expected.gpu)) == _comparable(expected)


def test_defaults_are_megatrons_and_what_was_derived_or_ignored_is_said() -> None:
    spec = load_gpu_spec("h100-sxm")
    arguments = [
        *("pretrain_gpt.py", "--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "8"),
        *("--seq-length", "512", "--micro-batch-size", "2", "--vocab-size", "50257", "--swiglu"),
        *("--lr", "1e-4", "--train-iters", "10", "--use-flash-attn"),
    ]
    read = read_megatron_job(arguments, NodeLayout(4, 8, 50.0), "h100-sxm", spec)
    job = JobConfig.from_file(read.job)
    assert job.shape.vocab_size == 50304  # padded to a multiple of 128, as Megatron pads
    assert job.shape.ffn_hidden_size == int(4 * 1024 * 2 / 3 / 64) * 64  # Megatron's SwiGLU width
    assert job.shape.params_dtype == "fp32"  # neither --bf16 nor --fp16
    assert (job.data_parallel, job.num_microbatches, job.pipeline_bandwidth_gbps) == (4, 1, None)
    assert [flag for flag in read.ignored if flag.startswith("--")] == [
        "--lr",
        "--train-iters",
        "--use-flash-attn",
    ]
    assert any("padded to 50304" in note for note in read.notes)


def test_groups_that_span_nodes_cross_the_nic() -> None:
    arguments = (
        "--tensor-model-parallel-size 2 --sequence-parallel --num-layers 8 --hidden-size 1024 "
        "--num-attention-heads 8 --seq-length 512 --micro-batch-size 1 --global-batch-size 64 "
        "--padded-vocab-size 32000 --num-experts 16 --expert-model-parallel-size 16"
    )
    job = _read(arguments, 32, per_node=8)  # TP2 x DP16: the data-parallel and expert groups span nodes
    assert job.data_parallel_bandwidth_gbps == 50.0 and job.pipeline_bandwidth_gbps is None  # PP = 1
    assert job.shape.moe is not None and job.shape.moe.all_to_all_bandwidth_gbps == 50.0
    inside = _read(arguments.replace("16", "4"), 8, per_node=8)  # one node: NVLink everywhere
    assert inside.data_parallel_bandwidth_gbps is None and inside.shape.moe.all_to_all_bandwidth_gbps is None  # type: ignore[union-attr]


BASE = (
    "--pipeline-model-parallel-size 2 --num-layers 8 --hidden-size 1024 --num-attention-heads 8 "
    "--seq-length 512 --micro-batch-size 1 --global-batch-size 16 --padded-vocab-size 32000 --bf16"
)


@pytest.mark.parametrize(
    ("arguments", "gpus", "message"),
    [
        (BASE.replace("--num-layers 8", "--num-layers 7"), 8, "--num-layers 7 does not split evenly"),
        (BASE, 7, "7 GPUs do not split into --pipeline-model-parallel-size 2"),
        (BASE.replace("--global-batch-size 16", "--global-batch-size 10"), 8, "is not a multiple of"),
        (BASE + " --context-parallel-size 2", 8, "context parallelism is not modelled"),
        (BASE + " --recompute-granularity full", 8, "full activation recompute"),
        (BASE + " --num-query-groups 2", 8, "only with --group-query-attention"),
        (BASE + " --fp16", 8, "--bf16 and --fp16 both given"),
        (BASE.replace("--num-layers 8 ", ""), 8, "have no --num-layers"),
        (BASE.replace("--padded-vocab-size 32000", ""), 8, "no --vocab-size"),
        (BASE.replace("--num-layers 8", "--num-layers eight"), 8, "'eight' must be a whole number"),
        (BASE + " --num-experts 4 --expert-model-parallel-size 3", 8, "expert-parallel size must divide"),
        (BASE + " --num-layers-per-virtual-pipeline-stage 3", 8, "not a multiple of"),
        (BASE + " --use-tp-pp-dp-mapping", 8, "--use-tp-pp-dp-mapping: it orders ranks"),
        (BASE + " --decoder-last-pipeline-num-layers 2", 8, "an uneven last stage is not modelled"),
    ],
)
def test_a_job_the_model_or_megatron_refuses_is_refused_naming_the_flag(
    arguments: str, gpus: int, message: str
) -> None:
    with pytest.raises(MegatronCommandLineError, match=re.escape(message)):
        _read(arguments, gpus)


def _estimate(capfd: pytest.CaptureFixture[str], *options: str) -> tuple[int, str, str]:
    try:
        status = main(["estimate", *options])
    except SystemExit as stop:  # argparse's refusals
        status = int(stop.code or 0)
    out, err = capfd.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--gpus", "8", *BASE.split()), "unrecognized arguments before --: --pipeline-model-parallel-size"),
        (("--gpus", "8", "--", *BASE.split()), "give --gpu-spec NAME"),
        (("--gpu-spec", "h100-sxm", "--", *BASE.split()), "give --gpus N"),
        (("--gpu-spec", "h100-sxm", "--gpus", "8"), "no Megatron arguments"),
        (("--gpu-spec", "tpu-v9", "--gpus", "8", "--", *BASE.split()), "tpu-v9"),
        (
            ("--gpu-spec", "h100-sxm", "--gpus", "8", "--switch-evaluations", "0", "--", *BASE.split()),
            "--switch-evaluations",
        ),
    ],
)
def test_command_line_mistakes_get_one_line_naming_the_fix(
    capfd: pytest.CaptureFixture[str], options: tuple[str, ...], message: str
) -> None:
    status, out, err = _estimate(capfd, *options)
    assert status == 2 and out == "" and message in err and "Traceback" not in err
    if "--gpu-spec NAME" in message:
        assert all(name in err for name in available_gpu_specs())


@pytest.mark.slow
def test_estimate_prints_every_mode_and_target_and_its_iso_time_saving_is_plans(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "job.yaml"
    quick = ("--points", "6", "--trials", "2")
    status, out, err = _estimate(
        capfd, "--gpu-spec", "h100-sxm", "--gpus", "4", "--target", "iso-time", "--target", "slowdown:0.05",
        *quick, "--save-job", str(saved), "--", "pretrain_gpt.py", *BASE.split(), "--lr", "1e-4",
    )  # fmt: skip
    assert status == 0, err
    assert "estimate: [1/2] iso-time" in err and "estimate: done" in err  # progress, one line a stage
    progress = [line for line in err.splitlines() if "estimate:" in line]
    assert all(line.startswith("estimate: ") and line.endswith(" s)") for line in progress), progress
    rows = {
        tuple(cell.strip() for cell in line.split("│")[1:3]): line for line in out.splitlines() if "│" in line
    }
    for target in ("iso-time", "slowdown:0.05"):
        for mode in ("perseus", "kareus", "kernel", "all"):
            assert (target, mode) in rows
    assert "every figure modelled (h100-sxm" in out and "ignored Megatron arguments" in out and "--lr" in out
    perseus = re.search(r"(-?\d+\.\d+ %|no change) \(", rows[("iso-time", "perseus")])
    assert perseus is not None
    assert yaml.safe_load(saved.read_text())["pipeline_stages"] == 2
    assert main(["plan", "--config", str(saved), "--points", "6", "--out", str(tmp_path / "plan.json")]) == 0
    (energy_row,) = [line for line in capfd.readouterr().out.splitlines() if "energy per iteration" in line]
    assert f"{perseus.group(1)} (" in energy_row  # plan's saving of the same job, to the printed digit


def test_the_search_budgets_given_reach_the_planners(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, int] = {}

    def planned(config, targets, budget, points, progress, switch_evaluations):  # type: ignore[no-untyped-def]
        seen.update(trials=budget.trials, points=points, switch_evaluations=switch_evaluations)
        raise ValueError("planned no further")

    monkeypatch.setattr(estimate_command, "estimate_job", planned)
    budgets = ("--trials", "3", "--points", "7", "--switch-evaluations", "50")
    status, _, err = _estimate(capfd, "--gpu-spec", "h100-sxm", "--gpus", "4", *budgets, "--", *BASE.split())
    assert status == 2 and "planned no further" in err
    assert seen == {"trials": 3, "points": 7, "switch_evaluations": 50}


@pytest.mark.slow
def test_planning_kareus_alone_beside_the_sweep_gives_the_figures_of_one_process() -> None:
    job = JobConfig.load(EXAMPLES / "gpt3-xl-pp4-h100.yaml")
    targets = [parse_target("iso-time"), parse_target("min-energy")]
    budget = SearchBudget(trials=2)
    figures = [
        [
            (row.target, row.mode, row.plan)
            for row in estimate_job(job, targets, budget, 4, workers=workers).rows
        ]
        for workers in (1, 2)
    ]
    assert figures[0] == figures[1]
    assert any(mode == "kareus" and plan is not None for _, mode, plan in figures[1])
