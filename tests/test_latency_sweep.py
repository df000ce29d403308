"""``megatron-energy simulate --switch-latency-sweep``: duration parsing and the modelled sweep's rows."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from megatron_energy.commands import simulate
from megatron_energy.commands.latency_sweep import example_jobs, parse_duration, parse_latencies

EXAMPLE = str(Path(__file__).resolve().parents[1] / "configs" / "examples" / "gpt3-xl-pp4-h100.yaml")


def _run_simulate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    simulate.register(parser.add_subparsers())
    args = parser.parse_args(["simulate", *argv])
    return args.func(args)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10ms", 0.010), ("1ms", 0.001), ("100us", 1e-4), ("10µs", 1e-5), ("0.5s", 0.5), (" 2.5 ms ", 0.0025)],
)
def test_durations_are_read_with_their_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10", "not a duration: write a number and a unit"),
        ("10 minutes", "not a duration"),
        ("ms", "not a duration"),
        ("-1ms", "not a duration"),
        ("0us", "must be a positive duration"),
    ],
)
def test_bad_durations_are_refused_with_a_message(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


def test_a_latency_list_keeps_its_order_and_refuses_an_empty_one() -> None:
    assert parse_latencies("10ms,1ms,100us,10us") == pytest.approx([1e-2, 1e-3, 1e-4, 1e-5])
    with pytest.raises(ValueError, match="at least one switch latency"):
        parse_latencies(" , ")
    with pytest.raises(ValueError, match="no example job"):
        example_jobs(["gpt-5"])


def test_the_command_refuses_bad_input(capsys) -> None:
    with pytest.raises(SystemExit) as refused:
        _run_simulate(["--switch-latency-sweep", "10ms,fast"])
    assert refused.value.code == 2 and "'fast' is not a duration" in capsys.readouterr().err
    assert _run_simulate(["--switch-latency-sweep", "10ms", "--compare"]) == 2
    assert "drop --plan, --compare and --trace" in capsys.readouterr().err
    assert _run_simulate([]) == 2
    assert "--config is required" in capsys.readouterr().err


@pytest.mark.slow
def test_the_sweep_prints_modelled_savings_that_grow_as_switches_get_faster(capsys) -> None:
    assert _run_simulate(["--config", EXAMPLE, "--switch-latency-sweep", "10ms,10us"]) == 0
    out = capsys.readouterr().out
    assert "(modelled)" in out.splitlines()[0] and "every figure modelled" in out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| gpt3-xl-pp4-h100")]
    assert [row[1].strip() for row in rows] == ["10 ms", "10 µs"]
    instruction = [float(row[3].split("%")[0]) for row in rows]  # energy changes: negative is a saving
    phase = [float(row[4].split("%")[0]) for row in rows]
    assert all(p <= i < 0 for p, i in zip(phase, instruction, strict=True))
    assert all(re.search(r"\([+-][\d.]+ to [+-][\d.]+ %, modelled\)", row[3] + row[4]) for row in rows)
    assert phase[1] < phase[0]  # 10 µs switches let memory-bound phases inside instructions drop their clock
    assert all(row[5].strip() == "+0.00%" for row in rows)  # iso-time
