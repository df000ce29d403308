"""lab/power_swing_trace.py on the CPU: iteration ends from stamped lines, a trace's figures, the commands."""

from pathlib import Path

import numpy as np
import power_swing_trace as script
import pytest

from megatron_energy.dvfs.power_sampler import PowerSamples
from megatron_energy.runtime.energy_log.power_trace_file import PowerTraceWriter, read_power_trace

pytestmark = pytest.mark.lab  # the lab equipment (lab/), not the installed package


def megatron_line(iteration: int, ms: float = 1000.0) -> str:
    return (
        f" [2026-12-06 02:44:38.493685] iteration {iteration:8d}/{12:8d} | consumed samples: 96 "
        f"| elapsed time per iteration (ms): {ms:.1f} | learning rate: 9.0E-05 | lm loss: 9.8E+00 |"
    )


STAMPED = [(0.5, "building GPT model ..."), *((float(i), megatron_line(i)) for i in range(1, 7))]
"""Megatron's lines of a 1 s step, stamped as they arrived; iteration i ends at i s."""


def stock_reads(seconds: float = 6.0) -> PowerSamples:
    """NVML reads every 10 ms, field refreshed every 100 ms: 600 W, and 300 W for the 0.2 s before each step
    ends (the optimizer step and the gradient sync)."""
    times = np.round(np.arange(0.0, seconds, 0.01), 9)
    refreshed = np.floor(times / 0.1 + 1e-9) * 0.1
    instant = np.where(refreshed % 1.0 >= 0.8 - 1e-9, 300.0, 600.0)
    return PowerSamples(
        times,
        np.full_like(times, 540.0),
        instant,
        np.full_like(times, 1980.0),
        "measured",
        "field",
        0.01,
        0.1,
    )


def test_the_iteration_ends_are_the_stamps_of_megatrons_lines():
    assert script.iteration_ends([*STAMPED, (7.5, megatron_line(6))]) == [(i, float(i)) for i in range(1, 7)]


def test_a_runs_figures_leave_the_warm_up_out_and_read_each_iterations_swing(tmp_path: Path):
    path = tmp_path / "gpu-bound-plain.csv"
    PowerTraceWriter(path, "csv", rank=0, gpu=0).append(stock_reads(), script.iteration_ends(STAMPED))
    trace = read_power_trace(path)
    figures = script.run_figures(trace.samples, trace.ends, warmup=2)
    brief = figures["summary"]
    assert brief["iterations"] == 4  # iterations 3-6, from the end of iteration 2
    assert brief["iteration_s_median"] == pytest.approx(1.0)
    assert (brief["swing_w_median"], brief["trough_w_median"], brief["peak_w_median"]) == pytest.approx(
        (300.0, 300.0, 600.0)
    )
    assert brief["ramp_up_w_per_s_max"] == pytest.approx(3000.0)  # 300 W in one 100 ms refresh
    assert brief["ramp_down_w_per_s_max"] == pytest.approx(3000.0)
    assert brief["band_share_median"] > 0.9  # a 1 Hz wave read up to 5 Hz
    assert figures["figures"]["band_hz"] == pytest.approx((0.1, 5.0))
    line = script.summary_line("gpu-bound-plain", figures)
    assert line.startswith("gpu-bound-plain (measured, field, reads every 10 ms): 4 iterations of 1000 ms")
    assert "swing median 300 W" in line and "band share 0.1-5 Hz median" in line


def test_a_run_without_kept_iterations_says_so():
    assert script.run_figures(stock_reads(), [(1, 1.0)], warmup=1) == {}
    assert script.summary_line("x", {}) == "x: no kept iteration was read"


def test_the_plain_run_is_megatron_alone_and_the_plugin_run_a_dry_run_tracing_power(tmp_path: Path):
    args = script.parse_args(["--out", str(tmp_path), "--work", str(tmp_path / "work"), "--plugin-ms", "25"])
    job = script.JOBS["host-bound"]
    plain = script.command(args, job, plugin=False)
    plugin = script.command(args, job, plugin=True)
    assert "megatron_energy.launch" not in plain and not any(a.startswith("--energy") for a in plain)
    assert plain[plain.index("--global-batch-size") + 1] == "4"
    assert plugin[plugin.index("--energy-power-trace") + 1] == "csv"
    assert plugin[plugin.index("--energy-power-sample-ms") + 1] == "25.0"
    assert "--energy-dry-run" in plugin and plugin[plugin.index("--energy-dir") + 1].endswith(
        "energy-host-bound"
    )


def test_bad_flags_are_refused(capsys: pytest.CaptureFixture[str]):
    for argv, says in (
        (["--jobs", "gpu-bound,huge"], "unknown job(s) huge"),
        (["--period-ms", "1"], "10-1000 ms"),
    ):
        with pytest.raises(SystemExit):
            script.parse_args(argv)
        assert says in capsys.readouterr().err


def test_the_plugins_profiling_iterations_are_left_out_with_the_warm_up():
    text = "\n".join(
        f"[energy] iteration {i} | {phase} (clocks not set) | J/iter measured: s0=1.0 | total=1.0"
        for i, phase in ((1, "profiling"), (9, "profiling"), (10, "stock (planning)"), (11, "planned"))
    )
    assert script.kept_after(text, warmup=5) == 9
    assert script.kept_after(text.replace("iteration 9 | profiling", "iteration 9 | planned"), warmup=5) == 5
    assert script.kept_after("no plugin here", warmup=5) == 5
