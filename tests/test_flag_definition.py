"""Each ``--energy-*`` flag has one definition, its ``EnergyConfig`` field; each rule is checked in one place.

The flag table is read from the fields' metadata (no source file parsed), the flags that need
``--energy-optimise`` are those whose field says so, the parser that checks a command line is a subclass (no
parser's method replaced), and a command line is held to the config's rules by building the config.
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import fields
from pathlib import Path

import pytest

import megatron_energy.config
from megatron_energy.config import (
    ENERGY_FLAGS,
    EnergyArgumentParser,
    EnergyConfig,
    EnergyConfigError,
    EnergyFlag,
    add_energy_args,
)
from megatron_energy.config.flag import FLAG
from megatron_energy.target import parse_target

SAMPLE_VALUES: dict[str, list[str]] = {
    "optimise": [],
    "mode": ["perseus"],
    "target": ["min-energy"],
    "backend": ["auto"],
    "gpu_spec": ["h100-sxm"],
    "dry_run": [],
    "dir": ["energy"],
    "profile_iters": ["2"],
    "freq_grid": ["1980,1500"],
    "trace": ["events.jsonl"],
    "log_file": ["log.jsonl"],
    "grid_gco2_per_kwh": ["400"],
    "safety_tolerance": ["0.05"],
    "safety_steps": ["3"],
    "overhead_check": ["2"],
    "phase_switching": ["auto"],
    "memory_clock": ["auto"],
    "planning": ["auto"],
    "log_level": ["info"],
    "log_ranks": ["all"],
    "show_megatron_log": [],
    "power_sample_ms": ["20"],
    "power_trace": ["csv"],
}
"""A valid value for each flag (none for a switch): given alone, only the optimise rule can refuse it."""


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str | None:
    """The parser's error line for ``argv``, or ``None`` when it parses."""
    parser = add_energy_args(argparse.ArgumentParser(prog="pretrain_gpt.py"))
    try:
        parser.parse_args(argv)
    except SystemExit as exit_info:
        assert exit_info.code == 2
        return capsys.readouterr().err.splitlines()[-1]
    return None


def test_each_flag_is_declared_on_the_config_field_it_fills() -> None:
    declared = {spec.name: spec.metadata[FLAG] for spec in fields(EnergyConfig)}
    assert declared == ENERGY_FLAGS
    assert all(isinstance(flag, EnergyFlag) for flag in ENERGY_FLAGS.values())
    assert set(SAMPLE_VALUES) == set(ENERGY_FLAGS)


def test_the_config_package_reads_no_source_file() -> None:
    init = Path(megatron_energy.config.__file__)
    sources = sorted(init.parent.glob("*.py")) if init.name == "__init__.py" else [init]
    for source in sources:
        imported = {
            alias.name
            for node in ast.walk(ast.parse(source.read_text()))
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        assert not imported & {"ast", "inspect", "tokenize"}, f"{source.name} reads source code"
        assert "getsource" not in source.read_text(), source.name


def test_the_flags_that_need_optimise_are_those_whose_field_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    needing = {name for name, flag in ENERGY_FLAGS.items() if flag.needs_optimise}
    assert needing == set(ENERGY_FLAGS) - {"optimise", "dir", "trace"}
    for name, flag in ENERGY_FLAGS.items():
        refusal = _refusal([flag.options[0], *SAMPLE_VALUES[name]], capsys)
        if name in needing:
            assert refusal == (
                f"pretrain_gpt.py: error: {flag.options[0]}: no effect without --energy-optimise; add "
                "--energy-optimise or drop them (--energy-trace alone is fine)"
            )
        else:
            assert refusal is None, name


def test_several_such_flags_are_named_in_help_order(capsys: pytest.CaptureFixture[str]) -> None:
    refusal = _refusal(
        ["--energy-planning", "wait", "--energy-log-file", "l.jsonl", "--energy-mode", "all"], capsys
    )
    assert refusal is not None
    assert "error: --energy-mode, --energy-log-file, --energy-planning: no effect without" in refusal


def test_adding_the_flags_replaces_no_method_of_a_parser() -> None:
    plain = argparse.ArgumentParser(prog="pretrain_gpt.py")
    plain.add_argument("--num-layers", type=int)
    checking = add_energy_args(plain)
    assert isinstance(checking, EnergyArgumentParser)
    assert "parse_known_args" not in vars(plain) and "parse_known_args" not in vars(checking)
    own = EnergyArgumentParser(prog="launcher")
    assert add_energy_args(own) is own


def test_the_extending_parser_reads_and_shows_the_arguments_of_the_one_it_extends() -> None:
    plain = argparse.ArgumentParser(
        prog="pretrain_gpt.py", description="Megatron-LM Arguments", allow_abbrev=False
    )
    network = plain.add_argument_group("network size")
    network.add_argument("--num-layers", type=int, help="layers")
    plain.set_defaults(seed=1234)
    checking = add_energy_args(plain)
    assert checking._actions == plain._actions
    assert checking.format_help() == plain.format_help()
    parsed = checking.parse_args(["--num-layers", "2", "--energy-optimise", "--energy-mode", "all"])
    assert (parsed.num_layers, parsed.seed, parsed.energy_mode) == (2, 1234, "all")
    with pytest.raises(SystemExit):
        checking.parse_args(["--num-lay", "2"])  # no abbreviations, as the extended parser


def test_a_value_rule_is_the_fields_and_the_config_holds_every_field_to_it() -> None:
    checked = {
        name for name, flag in ENERGY_FLAGS.items() if flag.check is not None or flag.choices is not None
    }
    assert checked == {
        "backend",
        "profile_iters",
        "freq_grid",
        "safety_tolerance",
        "safety_steps",
        "overhead_check",
        "grid_gco2_per_kwh",
        "phase_switching",
        "memory_clock",
        "planning",
        "log_level",
        "log_ranks",
        "power_sample_ms",
        "power_trace",
    }
    for name in checked:
        flag = ENERGY_FLAGS[name]
        with pytest.raises(EnergyConfigError) as refused:
            EnergyConfig(**{name: "bogus"})
        (problem,) = refused.value.problems
        assert problem == f"{name}='bogus' ({flag.options[0]}) {flag.problem('bogus')}"


def test_a_command_line_is_refused_in_the_configs_own_words(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--energy-optimise", "--energy-mode", "kareus", "--energy-target", "power:400"]
    with pytest.raises(EnergyConfigError) as refused:
        EnergyConfig(mode="kareus", target=parse_target("power:400"))
    assert _refusal(argv, capsys) == f"pretrain_gpt.py: error: {refused.value.problems[0]}"


def test_the_demo_refuses_a_contradiction_while_parsing(capsys: pytest.CaptureFixture[str]) -> None:
    from megatron_energy.cli import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["demo", "--energy-mode", "kernel", "--energy-target", "power:400"])
    assert exit_info.value.code == 2
    assert "megatron-energy demo: error: --energy-target power:400 needs a planner" in capsys.readouterr().err


def test_a_power_sampling_period_faster_than_nvml_refreshes_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _refusal(["--energy-optimise", "--energy-power-sample-ms", "0"], capsys) is None
    refusal = _refusal(["--energy-optimise", "--energy-power-sample-ms", "5"], capsys)
    assert refusal is not None and "must be 0 (off) or a period of 10-1000 ms" in refusal
    assert EnergyConfig(power_sample_ms=20, power_trace="jsonl").power_trace == "jsonl"
    with pytest.raises(EnergyConfigError, match="needs power readings, but --energy-power-sample-ms is 0"):
        EnergyConfig(power_sample_ms=0, power_trace="csv")
