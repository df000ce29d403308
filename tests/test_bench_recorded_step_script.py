"""lab/bench_recorded_step.py on the CPU: the jobs' commands, a run's figures, the deadline (runs faked)."""

import json
from pathlib import Path

import bench_recorded_step as script
import pytest
from bench_overhead import Finished, Harness

from megatron_energy.runtime.profiling.recorded_step import RecordedStepCost

pytestmark = pytest.mark.lab  # the lab equipment (lab/), not the installed package

COST = RecordedStepCost(7, 1980, 2, 4.0, 3, 0.9, 35.0, 12.0, 3.1)
TIMELINES = "[energy] phases inside instructions: measured kernel timelines (torch.profiler) of 2 classes"


def megatron_line(iteration: int, ms: float) -> str:
    return (
        f" [2026-12-06 02:44:38.493685] iteration {iteration:8d}/{12:8d} | consumed samples: 96 "
        f"| elapsed time per iteration (ms): {ms:.1f} | learning rate: 9.0E-05 | lm loss: 9.8E+00 |"
    )


def run_output(times_ms: dict[int, float], cost: RecordedStepCost | None = COST, read: bool = True) -> str:
    lines = [megatron_line(i, ms) for i, ms in sorted(times_ms.items())]
    if cost is not None:  # logged once the trace is written: after the next iteration's line
        lines.insert(cost.iteration + 1, cost.line(0))
    return "\n".join([*lines, *([TIMELINES] if read else [])])


TIMES = {1: 5000.0, 2: 990.0, 3: 960.0, 4: 300.0, 5: 310.0, 6: 305.0, 7: 372.0, 8: 340.0, 9: 301.0, 10: 299.0}


def test_a_run_gives_the_recorded_step_against_the_median_normal_step():
    figures = script.job_figures(run_output(TIMES), warmup=3)
    assert figures["recorded_iteration"] == 7 and figures["recorded_ms"] == 372.0
    # normal: after the warm-up, without the recorded step and the one after it
    assert figures["normal_iterations"] == [4, 5, 6, 9, 10] and figures["normal_median_ms"] == 301.0
    assert figures["ratio"] == pytest.approx(372.0 / 301.0)
    assert figures["next_ms"] == 340.0 and figures["next_ratio"] == pytest.approx(340.0 / 301.0)
    assert figures["recorded_line"] == {
        "instances": 2,
        "start_ms": 4.0,
        "toggles": 3,
        "toggles_ms": 0.9,
        "stop_ms": 35.0,
        "export_ms": 12.0,
        "trace_mib": 3.1,
        "error": None,
    }
    assert figures["timelines"] == TIMELINES
    line = script.report_line("host-bound", figures)
    assert "1.24x, within the 1.3x target" in line and "the step after it 340.0 ms (1.13x)" in line
    assert "stop 35.0 ms, export 12.0 ms" in line
    over = script.job_figures(run_output({**TIMES, 7: 900.0}, read=False), warmup=3)
    assert "OVER the 1.3x target" in script.report_line("host-bound", over)
    assert "timelines not read before the run ended" in script.report_line("host-bound", over)


def test_a_run_without_its_recorded_step_says_so():
    with pytest.raises(script.RunFailedError, match="no recorded step was logged: raise --iters"):
        script.job_figures(run_output(TIMES, cost=None), warmup=3)
    late = RecordedStepCost(11, 1980, 2, 4.0, 3, 0.9, 35.0, 12.0, 3.1)
    with pytest.raises(script.RunFailedError, match="no time for iteration 11"):
        script.job_figures(run_output(TIMES, cost=None) + "\n" + late.line(0), warmup=3)


def test_each_job_runs_the_plugin_in_kernel_mode_dry_with_the_fewest_profile_steps(tmp_path):
    args = script.parse_args(["--out", str(tmp_path), "--iters", "12"])
    commands = {name: script.job_command(args, job) for name, job in script.JOBS.items()}
    for name, command in commands.items():
        text = " ".join(command)
        assert "-m torch.distributed.run --nproc-per-node=1" in text
        assert "-m megatron_energy.launch scripts/pretrain_gpt.py" in text
        assert "--energy-optimise --energy-dry-run --energy-mode kernel" in text
        assert f"--energy-dir {tmp_path / f'energy-{name}'} --energy-profile-iters 1" in text
        assert "--train-iters 12" in text and "--transformer-impl local" in text
        assert ("--swiglu" in text) == (name == "user-shaped")
    assert "--micro-batch-size 2 --global-batch-size 16" in " ".join(commands["gpu-bound"])
    assert "--micro-batch-size 1 --global-batch-size 4" in " ".join(commands["host-bound"])
    user = " ".join(commands["user-shaped"])
    for flag in ("--group-query-attention --num-query-groups 4", "--normalization RMSNorm", "--manual-gc"):
        assert flag in user


def test_jobs_run_on_fresh_energy_dirs_until_the_deadline_and_the_json_keeps_them(tmp_path):
    now = [0.0]
    seen_dirs: list[bool] = []

    def runner(command, env, clock):
        energy = Path(command[command.index("--energy-dir") + 1])
        seen_dirs.append(energy.exists())
        started = clock()
        now[0] += 100.0  # each job takes 100 s
        lines = tuple((clock(), line) for line in run_output(TIMES).splitlines())
        return Finished(0, lines, started, clock())

    stale = tmp_path / "energy-gpu-bound" / "job" / "plan.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")  # an earlier run's plan: reused, it would skip profiling
    out = tmp_path / "figures.json"
    args = script.parse_args(["--out", str(tmp_path), "--deadline-s", "250", "--json", str(out)])
    results = script.run_jobs(args, Harness(lambda: now[0], None, runner))
    assert seen_dirs == [False, False]  # emptied before each job
    assert list(results["jobs"]) == ["gpu-bound", "user-shaped", "host-bound"]
    assert results["jobs"]["host-bound"] == {"skipped": "deadline"}  # 200 s + 100 s > 250 s
    assert results["jobs"]["gpu-bound"]["ratio"] == pytest.approx(372.0 / 301.0)
    assert json.loads(out.read_text()) == results
    assert (tmp_path / "log-user-shaped.txt").exists()


def test_job_names_are_checked():
    assert script.parse_args(["--jobs", "host-bound,gpu-bound"]).jobs == ("host-bound", "gpu-bound")
    with pytest.raises(SystemExit):
        script.parse_args(["--jobs", "host-bound,tiny"])
