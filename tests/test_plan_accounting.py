import argparse

import pytest
from profile_family import ProfileFamily, family_profile

from megatron_energy.commands import plan_command
from megatron_energy.commands.accounting import Accounting, format_gap, row_warning_lines
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.stock_clocks import all_max_clocks
from megatron_energy.plan_file import load_plan
from megatron_energy.sim import Simulator


def test_accounting_names_powers_latency_and_their_origins():
    instant = Accounting(85.0, 85.0, "from --blocked-power-w and --idle-power-w", 0.0, "no GPU spec given")
    assert instant.describe() == (
        "energy accounting: blocked 85 W, idle 85 W (from --blocked-power-w and --idle-power-w); clock "
        "switches are instant (no GPU spec given)"
    )
    slow = Accounting(85.0, 65.0, "from --gpu-spec a100", 0.02, "from --gpu-spec a100")
    text = slow.describe()
    assert "blocked 85 W, idle 65 W (from --gpu-spec a100)" in text
    assert "clock switches take 20 ms (from --gpu-spec a100)" in text
    assert "the lower bound does not include" in text and "--switch-latency-ms 0" in text


def test_row_warning_lines_show_a_few_and_count_the_rest():
    assert row_warning_lines(family_profile(ProfileFamily(2), 0)) == []
    noisy = family_profile(ProfileFamily(4, noise=0.01), 3)
    count = len(noisy.row_warnings())
    assert count > 5
    lines = row_warning_lines(noisy)
    assert lines[0].startswith(f"warning: {count} profile row(s) faster at a lower clock")
    assert len(lines) == 1 + 5 + 1 and lines[-1] == f"  ... and {count - 5} more"


def test_gap_rounding_noise_prints_as_zero():
    assert format_gap(-1e-12) == "+0.000 %"
    assert format_gap(0.0) == "+0.000 %"
    assert format_gap(0.0123) == "+1.230 %"
    assert format_gap(-0.001) == "-0.100 %"


def _run_plan(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    return args.func(args)


def test_plan_command_says_its_accounting_and_warns_about_rows(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    csv, out = tmp_path / "noisy.csv", tmp_path / "plan.json"
    profile = family_profile(ProfileFamily(2, noise=0.01), 4)
    profile.to_csv(csv)
    argv = ["--profile", str(csv), "--stages", "2", "--microbatches", "4"]  # the file says it is modelled
    argv += ["--blocked-power-w", "85", "--idle-power-w", "85", "--points", "8", "--out", str(out)]
    assert _run_plan(argv) == 0
    printed = capsys.readouterr().out
    assert (
        "energy accounting: blocked 85 W, idle 85 W (from --blocked-power-w and --idle-power-w); clock "
        "switches are instant (no GPU spec given)"
    ) in printed
    assert f"warning: {len(profile.row_warnings())} profile row(s) faster at a lower clock" in printed
    # The printed and stored baseline is every instruction at 1410 MHz, not the quickest plan.
    dag = PipelineDag.build(pipeline_orders(2, 4))
    all_max = Simulator(dag, profile).run(all_max_clocks(dag, profile))
    plan = load_plan(out)
    assert plan.baseline.iteration_time_s == all_max.iteration_time_s
    assert plan.baseline.energy_j == all_max.total_energy_j
    assert plan.frontier[0].time_s < all_max.iteration_time_s


@pytest.mark.slow
def test_plan_command_says_where_the_switch_latency_came_from(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    csv, out = tmp_path / "profile.csv", tmp_path / "plan.json"
    family_profile(ProfileFamily(2), 0).to_csv(csv)
    argv = ["--profile", str(csv), "--stages", "2", "--microbatches", "4", "--profile-source", "modelled"]
    argv += ["--gpu-spec", "a100-sxm-80gb", "--idle-power-w", "85", "--points", "8", "--out", str(out)]
    assert _run_plan(argv) == 0
    printed = capsys.readouterr().out
    assert "(from --idle-power-w, the other from --gpu-spec a100-sxm-80gb)" in printed
    assert "clock switches take 20 ms (from --gpu-spec a100-sxm-80gb)" in printed
    assert _run_plan([*argv, "--switch-latency-ms", "0"]) == 0
    assert "clock switches are instant (from --switch-latency-ms)" in capsys.readouterr().out
