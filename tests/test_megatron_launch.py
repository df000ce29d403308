"""``python -m megatron_energy.launch``: flags stripped, modes refused, one trace per rank of a gloo world."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from launcher_world import run_launcher, traced_plan_argv

from megatron_energy import launch
from megatron_energy.events import read_trace
from megatron_energy.megatron.modes import UnsupportedModeError, refused_in_argv
from megatron_energy.pipeline.profile_csv import read_profile_csv
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan_file import load_plan

NUM_MICROBATCHES = 8
GROUP_SIZE = 4
TRAIN_ITERS = 9  # 8 profiling steps (stock: a settling step, the baseline's 4-step pilot and 1 synchronous
# step; 1500 MHz: a settling and a measured step), then the plan runs
# PP=2 x VPP=2, 8 microbatches (global batch 16 / micro batch 2), in groups of 4 per virtual stage
MEGATRON_ARGS = [
    "--num-layers", "4", "--hidden-size", "16", "--num-attention-heads", "2",
    "--seq-length", "8", "--max-position-embeddings", "8", "--vocab-size", "64",
    "--micro-batch-size", "2", "--global-batch-size", "16", "--train-iters", str(TRAIN_ITERS), "--lr", "1e-4",
    "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
    "--microbatch-group-size-per-virtual-pipeline-stage", str(GROUP_SIZE),
    "--mock-data", "--tokenizer-type", "NullTokenizer",
]  # fmt: skip


def test_split_command_takes_out_exactly_the_energy_flags() -> None:
    config, script, megatron_args = launch.split_command(
        [
            "--energy-trace",
            "t.jsonl",
            "pretrain_gpt.py",
            "--num-layers",
            "2",
            "--energy-optimise",
            "--lr",
            "1e-4",
        ]
    )
    assert script == "pretrain_gpt.py"
    assert megatron_args == ["--num-layers", "2", "--lr", "1e-4"]
    assert config.optimise and config.trace == Path("t.jsonl")


def test_listeners_follow_the_flags(tmp_path: Path) -> None:
    from megatron_energy.config import EnergyConfig
    from megatron_energy.events import TraceWriter
    from megatron_energy.megatron.session_factory import DeferredSession

    assert launch.build_listeners(EnergyConfig()) == []
    listeners = launch.build_listeners(EnergyConfig(optimise=True, trace=tmp_path / "t.jsonl"))
    assert [type(listener) for listener in listeners] == [TraceWriter, DeferredSession]
    launch.close_listeners(listeners)


def test_launcher_without_energy_flags_only_runs_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, pathlib\npathlib.Path(sys.argv[0]).with_suffix('.out').write_text(repr(sys.argv))\n"
    )
    assert launch.main([str(script), "--num-layers", "2"]) == 0
    assert (tmp_path / "train.out").read_text() == repr([str(script), "--num-layers", "2"])


@pytest.mark.parametrize(
    ("megatron_args", "flag"),
    [
        (
            ["--overlap-moe-expert-parallel-comm", "--pipeline-model-parallel-size", "2"],
            "--overlap-moe-expert-parallel-comm with --pipeline-model-parallel-size 2 and no virtual stages",
        ),
        (
            ["--overlap-moe-expert-parallel-comm", "--energy-mode", "kareus"],
            "--overlap-moe-expert-parallel-comm with --energy-mode kareus",
        ),
        (
            ["--cuda-graph-impl=full_iteration", "--energy-mode", "kareus"],
            "--cuda-graph-impl full_iteration with --energy-mode kareus",
        ),
        (["--hybrid-context-parallel"], "--hybrid-context-parallel"),
    ],
)
def test_launcher_refuses_modes_whose_instructions_cannot_be_observed(
    megatron_args: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert launch.main(["pretrain_gpt.py", "--num-layers", "2", *megatron_args, "--energy-optimise"]) == 2
    message = capsys.readouterr().err
    assert f"cannot be used with {flag}:" in message
    assert "Use " in message or "Drop " in message


def test_launcher_accepts_per_layer_cuda_graphs() -> None:
    assert refused_in_argv(["--cuda-graph-impl", "local", "--cuda-graph-modules", "attn", "mlp"]) == []


@pytest.mark.parametrize(
    "megatron_args",
    [
        [],
        ["--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2"],
        ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"],
    ],
)
def test_launcher_accepts_the_combined_1f1b_schedules_megatron_core_runs(megatron_args: list[str]) -> None:
    argv = ["--overlap-moe-expert-parallel-comm", *megatron_args]
    assert refused_in_argv(argv, "perseus") == []
    assert refused_in_argv(argv, None) == []  # a trace only


def test_patched_training_refuses_the_combined_1f1b_schedule() -> None:
    args = argparse.Namespace(overlap_moe_expert_parallel_comm=True, energy_optimise=True, energy_trace=None)
    with pytest.raises(UnsupportedModeError, match=r"on the patched path.*python -m megatron_energy\.launch"):
        launch.attach_to_training(args, model_config=object())


def test_patched_training_refuses_the_same_modes() -> None:
    args = argparse.Namespace(cuda_graph_impl="full_iteration", energy_optimise=True, energy_trace=None)
    with pytest.raises(UnsupportedModeError, match="--cuda-graph-impl full_iteration"):
        launch.attach_to_training(args, model_config=object())


def _check_rank_trace(events: list[dict], rank: int, expected: list[tuple]) -> None:
    assert {event["rank"] for event in events} == {rank}
    assert all(
        set(event) >= {"step", "event", "kind", "microbatch", "chunk", "host_time_s"} for event in events
    )
    times = [event["host_time_s"] for event in events]
    assert times == sorted(times)
    boundaries = [(event["event"], event["step"]) for event in events if event["event"].startswith("step_")]
    assert boundaries == [(edge, step) for step in range(TRAIN_ITERS) for edge in ("step_begin", "step_end")]
    for step in range(TRAIN_ITERS):
        in_step = [event for event in events if event["step"] == step]
        begins = [
            (e["kind"], e["microbatch"], e["chunk"]) for e in in_step if e["event"] == "instruction_begin"
        ]
        ends = [(e["kind"], e["microbatch"], e["chunk"]) for e in in_step if e["event"] == "instruction_end"]
        assert begins == ends == expected
        p2p = [event for event in in_step if event["event"].startswith("p2p_")]
        assert p2p and all(event["op"] for event in p2p)


@pytest.mark.world
def test_the_launcher_traces_and_plans_megatrons_interleaved_order_per_rank(tmp_path: Path) -> None:
    """The executed order (non-default group size) is the order the hooks see AND the order the plan has.

    Regression: the plan used to be solved on orders rebuilt with the default group size, so its DAG was not
    the executed one; now the adapter computes the orders once and every DAG is built from them.
    """
    trace = tmp_path / "trace.jsonl"
    run = run_launcher(traced_plan_argv(MEGATRON_ARGS, tmp_path), 2, tmp_path)
    assert run.statuses == (0, 0), run.output[-4000:]
    assert not trace.exists(), "with 2 ranks every rank writes its own FILE.rankN"
    expected = pipeline_orders(2, NUM_MICROBATCHES, 2, microbatch_group_size=GROUP_SIZE)
    assert expected != pipeline_orders(2, NUM_MICROBATCHES, 2), "the group size must matter for this test"
    for rank in (0, 1):
        _check_rank_trace(
            read_trace(tmp_path / f"trace.jsonl.rank{rank}"),
            rank,
            [(i.kind, i.microbatch, i.chunk) for i in expected.stage(rank)],
        )
    assert "not optimising" not in run.output and "too short to profile" not in run.output  # 9 is enough
    (plan_file,) = (tmp_path / "energy").glob("*/plan.json")
    plan = load_plan(plan_file)
    for rank in (0, 1):
        for point in plan.points:
            planned = [action.at.instruction for action in point.ranks[rank].actions]
            assert planned == list(expected.stage(rank))


@pytest.mark.world
def test_a_job_shorter_than_profiling_says_so_at_start(tmp_path: Path) -> None:
    """Issue 44: ``--train-iters 5`` exited 0 with no plan, no profile kept and no word."""
    argv = traced_plan_argv(MEGATRON_ARGS, tmp_path)
    argv[argv.index("--train-iters") + 1] = "5"
    run = run_launcher(argv, 2, tmp_path)
    assert run.statuses == (0, 0), run.output[-4000:]
    (line,) = [line for line in run.log(0).read_text().splitlines() if "too short to profile" in line]
    assert "take at least 9 iterations" in line and "the job has 5 left (--train-iters 5)" in line
    assert "keep no profile" in line and "give --train-iters 9 or more" in line
    said = [text for text in run.log(0).read_text().splitlines() if text.startswith("[energy]")]
    said = [text for text in said if "Megatron's argument list" not in text]  # the launcher's, at its start
    assert said.index(line) < 3, said  # at start: after the GPU's line, before anything of the first step
    assert "too short to profile" not in run.log(1).read_text(), "rank 0 says it, once"
    assert not list((tmp_path / "energy").glob("*/plan.json"))


@pytest.mark.world
def test_a_job_cut_short_in_profiling_keeps_each_ranks_finished_clocks(tmp_path: Path) -> None:
    """Issue 44: at the launcher's exit, every rank keeps the clocks it finished; rank 0 says where."""
    argv = traced_plan_argv(MEGATRON_ARGS, tmp_path)
    argv[argv.index("--train-iters") + 1] = "7"  # the stock clock's 6 steps finish; 1500 MHz does not
    run = run_launcher(argv, 2, tmp_path)
    assert run.statuses == (0, 0), run.output[-4000:]
    (start,) = [line for line in run.log(0).read_text().splitlines() if "too short to profile" in line]
    assert "(at most 1 of 2: 1980 MHz, the stock clock first)" in start
    (folder,) = (tmp_path / "energy").glob("*/profile.partial.rank0.csv")
    for rank in (0, 1):
        table = read_profile_csv(folder.parent / f"profile.partial.rank{rank}.csv")
        assert table.source == "simulated" and {row.frequency for row in table.rows} == {1980}
        assert {(row.stage, row.chunk, row.instruction) for row in table.rows} == {
            (rank, chunk, kind) for chunk in (0, 1) for kind in ("forward", "backward")
        }
    (end,) = [line for line in run.log(0).read_text().splitlines() if "ended while profiling" in line]
    assert str(folder) in end and "the stock clock only, 1 of 2 clocks (1980 MHz)" in end
    assert "ended while profiling" not in run.log(1).read_text(), "rank 0 says it, once"
    assert not list((tmp_path / "energy").glob("*/profile.csv"))
