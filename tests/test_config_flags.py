"""The --energy-* flags: parsed through Megatron's own parser, bad values and contradictions rejected."""

import argparse
import sys
from pathlib import Path

import pytest

from megatron_energy.config import EnergyConfig, add_energy_args
from megatron_energy.target import EnergyTarget


def _parse(argv: list[str]) -> argparse.Namespace:
    return add_energy_args(argparse.ArgumentParser(prog="pretrain_gpt.py")).parse_args(argv)


@pytest.mark.slow
def test_flags_parse_through_megatron_parse_args(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.training.arguments import parse_args

    monkeypatch.setattr(
        sys,
        "argv",
        [
            "pretrain_gpt.py",
            "--num-layers", "2",
            "--energy-optimize",
            "--energy-target", "slowdown:0.05",
            "--energy-freq-grid", "1980,1605,1410",
            "--energy-backend", "simulated",
            "--energy-gpu-spec", "h100-sxm",
            "--energy-dir", "/tmp/energy-x",
        ],
    )  # fmt: skip
    args = parse_args(extra_args_provider=add_energy_args)
    assert args.num_layers == 2  # Megatron's own flags are untouched
    config = EnergyConfig.from_args(args)
    assert config.optimise is True
    assert config.target == EnergyTarget("slowdown", 0.05)
    assert config.freq_grid == (1980, 1605, 1410)
    assert config.backend == "simulated"
    assert config.gpu_spec == "h100-sxm"
    assert config.dir == Path("/tmp/energy-x")


def test_defaults_without_flags() -> None:
    config = EnergyConfig.from_args(_parse([]))
    assert config == EnergyConfig()
    assert str(config.target) == "iso-time"
    assert config.dir == Path("energy")


def test_no_flag_shadows_a_megatron_flag() -> None:
    from megatron.training.arguments import add_megatron_arguments

    megatron_parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    megatron_flags = {opt for action in megatron_parser._actions for opt in action.option_strings}
    ours = {
        opt for action in add_energy_args(argparse.ArgumentParser())._actions for opt in action.option_strings
    }
    ours -= {"-h", "--help"}
    assert ours, "no energy flags registered"
    assert all(flag.startswith("--energy-") for flag in ours)
    assert not ours & megatron_flags


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--energy-optimise", "--energy-target", "fast"], "is not a target"),
        (["--energy-optimise", "--energy-target", "slowdown:1.5"], "strictly between 0 and 1"),
        (["--energy-optimise", "--energy-target", "slowdown:abc"], "strictly between 0 and 1"),
        (
            ["--energy-optimise", "--energy-mode", "turbo"],
            "unknown --energy-mode 'turbo'; use one of perseus, kareus",
        ),
        (["--energy-optimise", "--energy-backend", "nvml"], "invalid choice"),
        (["--energy-optimise", "--energy-profile-iters", "0"], "whole number >= 1"),
        (["--energy-optimise", "--energy-freq-grid", "1980"], "fewer than two distinct clocks"),
        (["--energy-optimise", "--energy-freq-grid", "1980,fast"], "is not a clock list"),
        (["--energy-optimise", "--energy-freq-grid", "1980,19800"], "outside 100-4000 MHz"),
        (["--energy-optimise", "--energy-safety-tolerance", "2"], "strictly between 0 and 1"),
        (["--energy-target", "min-energy"], "no effect without --energy-optimise"),
        (["--energy-dry-run"], "no effect without --energy-optimise"),
        (
            ["--energy-optimise", "--energy-mode", "phase"],
            "unknown --energy-mode 'phase'; use one of perseus, kareus, kernel",
        ),
        (
            ["--energy-optimise", "--energy-backend", "zeus", "--energy-gpu-spec", "h200"],
            "drop --energy-gpu-spec",
        ),
        (["--energy-optimise", "--energy-backend", "simulated"], "needs --energy-gpu-spec"),
    ],
)
def test_bad_values_are_rejected_with_their_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parse(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_trace_alone_is_allowed() -> None:
    config = EnergyConfig.from_args(_parse(["--energy-trace", "events.jsonl"]))
    assert config.trace == Path("events.jsonl")
    assert config.optimise is False


def test_freq_grid_auto_is_none() -> None:
    assert (
        EnergyConfig.from_args(_parse(["--energy-optimise", "--energy-freq-grid", "auto"])).freq_grid is None
    )


def test_energy_argv_gives_the_config_back_through_the_flags() -> None:
    from megatron_energy.config import energy_argv

    config = EnergyConfig(
        optimise=True,
        target=EnergyTarget("slowdown", 0.05),
        backend="simulated",
        gpu_spec="h200",
        dir=Path("/tmp/e"),
        profile_iters=3,
        freq_grid=(1980, 1500),
        log_file=Path("/tmp/e/log.jsonl"),
        safety_tolerance=0.1,
    )
    argv = energy_argv(config)
    assert "--energy-mode" not in argv  # left at its default
    assert EnergyConfig.from_args(_parse(argv)) == config
    assert energy_argv(EnergyConfig()) == []


def test_a_subset_of_the_flags_with_other_defaults_shares_types_and_checks() -> None:
    parser = add_energy_args(
        argparse.ArgumentParser(prog="demo"), only=("target", "gpu_spec"), defaults={"gpu_spec": "h100-sxm"}
    )
    parser.set_defaults(energy_optimise=True, energy_backend="simulated")
    options = {opt for action in parser._actions for opt in action.option_strings} - {"-h", "--help"}
    assert options == {"--energy-target", "--energy-gpu-spec"}
    config = EnergyConfig.from_args(parser.parse_args(["--energy-target", "min-energy"]))
    assert config.gpu_spec == "h100-sxm" and str(config.target) == "min-energy"
    help_text = " ".join(parser.format_help().split())
    assert "(default: h100-sxm)" in help_text and "(default: iso-time)" in help_text
    with pytest.raises(SystemExit):
        parser.parse_args(["--energy-gpu-spec", "no-such-gpu"])
