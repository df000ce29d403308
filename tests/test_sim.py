import argparse
import json
import random
from itertools import pairwise
from pathlib import Path

import pytest

from megatron_energy.commands import plan_command, simulate
from megatron_energy.errors import EnergyValueError
from megatron_energy.job import JobConfig
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import IterationTail, TailStep
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan_file import load_plan
from megatron_energy.sim import Simulator, StagePowers
from megatron_energy.sim.trace import write_trace

EXAMPLES = Path(__file__).resolve().parents[1] / "configs" / "examples"
EXAMPLE = str(EXAMPLES / "gpt3-xl-pp4-h100.yaml")


def _profile(times, stages, chunks=1, blocked_w=50.0, idle_w=30.0):
    """Two clocks per instruction: fast (1500 MHz, time t, 100 W) and slow (1000 MHz, 1.5 t, 60 W)."""
    options = {}
    for stage in range(stages):
        for kind in ("forward", "backward"):
            for chunk in range(chunks):
                t = times[(stage, kind)]
                options[Work(stage, chunk, kind)] = [
                    ClockOption(1500, t, 100 * t),
                    ClockOption(1000, 1.5 * t, 90 * t),
                ]
    return Profile(options, "test-gpu", "modelled", blocked_w, idle_w)


TIMES_2X2 = {(0, "forward"): 1.0, (0, "backward"): 2.0, (1, "forward"): 2.0, (1, "backward"): 3.0}


def test_energy_accounting_by_hand():
    dag = PipelineDag.build(pipeline_orders(2, 2))
    result = Simulator(dag, _profile(TIMES_2X2, 2)).run()
    assert result.iteration_time_s == 13.0
    stage0, stage1 = result.stages
    # Stage 0 computes 6 s and its last backward ends at 13; stage 1 computes 10 s and ends at 11.
    assert (stage0.busy_s, stage0.blocked_s, stage0.idle_s) == (6.0, 7.0, 0.0)
    assert (stage1.busy_s, stage1.blocked_s, stage1.idle_s) == (10.0, 1.0, 2.0)
    assert stage0.busy_energy_j == pytest.approx(600.0)
    assert stage0.blocked_energy_j == pytest.approx(7 * 50.0)
    assert stage1.idle_energy_j == pytest.approx(2 * 30.0)
    assert result.total_energy_j == pytest.approx(600 + 350 + 1000 + 50 + 60)
    assert result.gpu_name == "test-gpu" and result.profile_source == "modelled"


def test_a_measured_tail_counts_its_measured_energy_and_no_idle_power_over_it():
    tail = IterationTail.measured(outside_s=0.5, stage_energy_j=(40.0, 70.0))
    dag = PipelineDag.build(pipeline_orders(2, 2), tail=tail)
    plain = Simulator(PipelineDag.build(pipeline_orders(2, 2)), _profile(TIMES_2X2, 2)).run()
    result = Simulator(dag, _profile(TIMES_2X2, 2)).run()
    assert result.iteration_time_s == 13.5  # the pipeline's 13 s, then the 0.5 s tail
    stage0, stage1 = result.stages
    assert (stage0.tail_s, stage0.tail_energy_j, stage0.idle_s) == (0.5, 40.0, 0.0)
    # stage 1's tail starts when its last backward ends (11 s); it then waits 2 s at idle power
    assert (stage1.tail_s, stage1.tail_energy_j, stage1.idle_s) == (0.5, 70.0, 2.0)
    assert stage1.idle_energy_j == pytest.approx(2 * 30.0)
    assert result.total_energy_j == pytest.approx(plain.total_energy_j + 40.0 + 70.0)
    assert [node for node in dag.nodes if isinstance(node, TailStep) and node.stage == 0] == [
        TailStep("dp_sync", 0),
        TailStep("optimizer", 0),
        TailStep("outside", 0),
    ]
    with pytest.raises(EnergyValueError, match="3 stage energies for 2 stages"):
        PipelineDag.build(pipeline_orders(2, 2), tail=IterationTail.measured(0.5, (1.0, 2.0, 3.0)))
    with pytest.raises(EnergyValueError):
        IterationTail.measured(-0.5, (1.0, 2.0))


def test_slowing_work_with_slack_keeps_the_time_and_saves_energy():
    dag = PipelineDag.build(pipeline_orders(2, 2))
    simulator = Simulator(dag, _profile(TIMES_2X2, 2))
    fast = simulator.run()
    # B(0,0) has 3 s of slack and takes 2 s; at 1000 MHz it takes 3 s (+1 s) and 180 J instead of 200 J.
    slow = simulator.run({Instruction(0, 0, 0, "backward"): 1000})
    assert slow.iteration_time_s == fast.iteration_time_s
    assert slow.stages[0].busy_s == fast.stages[0].busy_s + 1.0
    assert slow.stages[0].blocked_s == fast.stages[0].blocked_s - 1.0
    assert slow.total_energy_j == pytest.approx(fast.total_energy_j - 20.0 - 1.0 * 50.0)
    # On the critical path the same change lengthens the iteration.
    assert (
        simulator.run({Instruction(1, 0, 1, "backward"): 1000}).iteration_time_s
        == fast.iteration_time_s + 1.5
    )
    with pytest.raises(ValueError, match="no profiled option at 1234 MHz"):
        simulator.run({Instruction(0, 0, 0, "forward"): 1234})
    with pytest.raises(ValueError, match="not an instruction of this pipeline"):
        simulator.run({("backward", 0, 0, 0): 1000})  # a key of another shape is refused, not ignored


@pytest.mark.parametrize(("stages", "microbatches"), [(4, 8), (2, 5)])
def test_balanced_pipeline_simulates_to_the_textbook_time(stages, microbatches):
    times = {
        (s, kind): (1.0 if kind == "forward" else 2.0)
        for s in range(stages)
        for kind in ("forward", "backward")
    }
    result = Simulator(
        PipelineDag.build(pipeline_orders(stages, microbatches)), _profile(times, stages)
    ).run()
    assert result.iteration_time_s == (microbatches + stages - 1) * 3.0


def test_busy_blocked_tail_idle_add_up_to_the_iteration_on_every_stage():
    job = JobConfig.load(EXAMPLES / "llama-7b-pp4-tp2-h200.yaml")
    spec = job.spec()
    dag = job.build_dag(spec=spec)
    profile = job.synthetic_profile(spec)
    rng = random.Random(3)
    clocks = {node: rng.choice(spec.sm_clocks_mhz[:40]) for node in dag.compute_nodes()}
    for result in (Simulator(dag, profile).run(), Simulator(dag, profile).run(clocks)):
        for stage in result.stages:
            total = stage.busy_s + stage.blocked_s + stage.tail_s + stage.idle_s
            assert total == pytest.approx(result.iteration_time_s, rel=1e-12)
            assert min(stage.busy_s, stage.blocked_s, stage.idle_s) >= 0
            assert stage.tail_s == pytest.approx(dag.tail.time_s) and stage.tail_s > 0
    powers = StagePowers(blocked_power_w=1.0, idle_power_w=2.0)
    result = Simulator(dag, profile, powers).run()
    assert result.stages[1].blocked_energy_j == pytest.approx(result.stages[1].blocked_s)
    assert result.stages[1].idle_energy_j == pytest.approx(2 * result.stages[1].idle_s)
    assert result.stages[1].tail_energy_j == pytest.approx(2 * result.stages[1].tail_s)  # modelled tail


def test_trace_is_valid_json_with_one_compute_track_per_stage(tmp_path):
    stages, microbatches, chunks = 4, 8, 2
    dag = PipelineDag.build(pipeline_orders(stages, microbatches, chunks))
    times = {(s, kind): 0.01 * (1 + s) for s in range(stages) for kind in ("forward", "backward")}
    simulator = Simulator(dag, _profile(times, stages, chunks))
    result = simulator.run()
    document = json.loads(write_trace(result, simulator.powers, tmp_path / "trace.json").read_text())
    events = document["traceEvents"]
    assert document["otherData"]["source"] == "modelled"
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert all("modelled" in name for name in names.values())
    compute = [e for e in events if e["ph"] == "X" and e["cat"] in ("forward", "backward")]
    assert {(e["pid"], e["tid"]) for e in compute} == {(stage, 0) for stage in range(stages)}
    for stage in range(stages):
        on_stage = sorted((e for e in compute if e["pid"] == stage), key=lambda e: e["ts"])
        assert len(on_stage) == 2 * microbatches * chunks
        assert all(
            e["args"]["clock_in_effect_mhz"] == e["args"]["clock_requested_mhz"] == 1500 for e in on_stage
        )
        assert all(e["args"]["source"] == "modelled" and e["name"].endswith("@1500 MHz") for e in on_stage)
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-6 for a, b in pairwise(on_stage))
    sends = [e for e in events if e["ph"] == "X" and e["cat"] == "send"]
    assert len(sends) == 2 * microbatches * (stages * chunks - 1)
    assert {e["pid"] for e in sends} == {stages}
    assert all("modelled" in e["name"] for e in events if e["ph"] == "C")


def _run_simulate(argv):
    parser = argparse.ArgumentParser()
    simulate.register(parser.add_subparsers())
    args = parser.parse_args(["simulate", *argv])
    return args.func(args)


def _run_plan(argv):
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    return args.func(args)


def test_simulate_command_prints_modelled_table_and_writes_trace(tmp_path, capsys):
    assert _run_simulate(["--config", EXAMPLE, "--trace", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "modelled" in out and "h100-sxm" in out and "iteration time" in out
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["gpu"] == "h100-sxm"
    with pytest.raises(SystemExit) as refused:  # a missing config is refused while parsing
        _run_simulate(["--config", str(tmp_path / "missing.yaml")])
    assert refused.value.code == 2 and "missing.yaml is not a file" in capsys.readouterr().err


@pytest.mark.slow
def test_a_plan_made_for_the_job_config_simulates_to_its_own_prediction(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert _run_plan(["--config", EXAMPLE, "--points", "3", "--out", str(plan_path)]) == 0
    capsys.readouterr()
    plan = load_plan(plan_path)
    job = JobConfig.load(EXAMPLE)
    assert plan.fingerprint == job.fingerprint() and plan.switch_latency_s == job.spec().switch_latency_s

    assert _run_simulate(["--config", EXAMPLE, "--plan", str(plan_path)]) == 0
    out = capsys.readouterr().out
    assert "under the plan" in out and "versus every instruction at its fastest clock" in out
    # the round trip is exact: the same DAG, profile and switch latency on both sides
    spec = job.spec()
    simulator = Simulator(
        job.build_dag(spec=spec), job.synthetic_profile(spec), switch_latency_s=plan.switch_latency_s
    )
    clocks = {
        i: c for stage in range(plan.num_stages) for i, c in plan.target_point.clock_table(stage).items()
    }
    replay = simulator.run(clocks)
    assert replay.iteration_time_s == pytest.approx(plan.target_point.iteration_time_s, rel=1e-9)
    assert replay.total_energy_j == pytest.approx(plan.target_point.energy_j, rel=1e-9)
    assert replay.iteration_time_s <= plan.baseline.iteration_time_s * (1 + 1e-9)  # iso-time holds


@pytest.mark.slow
def test_simulate_refuses_a_plan_made_for_another_job(tmp_path, capsys):
    other = tmp_path / "wider.yaml"  # the same model on twice the replicas: fewer microbatches per pipeline
    other.write_text(Path(EXAMPLE).read_text().replace("data_parallel: 8", "data_parallel: 16"))
    plan_path = tmp_path / "plan.json"
    assert _run_plan(["--config", str(other), "--points", "4", "--out", str(plan_path)]) == 0
    capsys.readouterr()
    assert _run_simulate(["--config", EXAMPLE, "--plan", str(plan_path)]) == 2
    err = capsys.readouterr().err
    assert "another job" in err
    assert load_plan(plan_path).fingerprint in err and JobConfig.load(EXAMPLE).fingerprint() in err


def test_a_pass_resumed_from_an_earlier_one_is_the_whole_pass_to_the_last_float():
    """``Simulator.evaluate_options`` resumed from a checkpoint equals the whole pass, for any move.

    Moves change a run of neighbouring options or options scattered over the iteration, stages' last
    instructions included; every figure of the pass (stale parts too) and every stage state must agree.
    """
    job = JobConfig.load(EXAMPLE)
    spec = job.spec()
    profile = job.synthetic_profile(spec)
    simulator = Simulator(job.build_dag(spec=spec), profile, switch_latency_s=spec.switch_latency_s)
    positions = simulator.compute_positions()
    nodes = sorted(positions, key=positions.__getitem__)
    options = [list(profile.options(node.work)) for node in nodes]
    base = [choices[0] for choices in options]
    *_, checkpoint = simulator.evaluate_options(base)
    assert checkpoint is not None
    rng = random.Random(0)
    stale_in_both = 0
    for move in range(60):
        trial = list(base)
        if move % 2:
            first = rng.randrange(len(trial))
            changed = range(first, min(first + rng.randint(1, 6), len(trial)))
        else:
            changed = rng.sample(range(len(trial)), rng.randint(1, 12))
        for position in changed:
            trial[position] = rng.choice(options[position])
        whole = simulator.evaluate_options(trial)
        resumed = simulator.evaluate_options(trial, checkpoint)
        assert whole[:2] == resumed[:2]
        assert whole[2] is not None and resumed[2] is not None
        assert whole[2].passed == resumed[2].passed and whole[2].states == resumed[2].states
        stale_in_both += any(whole[2].passed.stale_clock_mhz) and any(checkpoint.passed.stale_clock_mhz)
        checkpoint = resumed[2] if move % 3 == 0 else checkpoint  # resume from later passes too
    assert stale_in_both > 5  # the moves left instructions running at stale clocks, before and after
    assert simulator.evaluate_options(list(base), checkpoint)[:2] == simulator.evaluate_options(base)[:2]
    # and the public pass agrees: evaluate() of the same clocks gives the same floats
    clocks = {node: option.clock_mhz for node, option in zip(nodes, base, strict=True)}
    assert simulator.evaluate(clocks) == simulator.evaluate_options(base)[:2]
