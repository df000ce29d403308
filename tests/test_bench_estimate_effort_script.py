"""lab/bench_estimate_effort.py on the CPU: its settings, and the rows of a real (small) estimate."""

import argparse

import bench_estimate_effort as script
import pytest

from megatron_energy.commands.estimate_modes import estimate_job
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.kareus.search import SearchBudget
from megatron_energy.target import parse_target

pytestmark = pytest.mark.lab  # the lab equipment (lab/), not the installed package


def test_a_setting_is_three_positive_budgets() -> None:
    assert script.setting("10,24,200") == (10, 24, 200)
    for wrong in ("10,24", "0,24,200", "10,24,x"):
        with pytest.raises((argparse.ArgumentTypeError, ValueError)):
            script.setting(wrong)


@pytest.mark.slow
def test_each_planned_row_is_listed_in_percent_against_stock() -> None:
    job = JobConfig.load(script.ROOT / "configs" / "examples" / "gpt3-xl-pp4-h100.yaml")
    estimate = estimate_job(job, [parse_target("iso-time")], SearchBudget(trials=2), 4, workers=1)
    rows = script.figures(estimate)
    assert set(rows) == {f"iso-time {row.mode}" for row in estimate.rows if row.plan is not None}
    perseus = estimate.row(parse_target("iso-time"), "perseus")
    assert rows["iso-time perseus"] == (100 * perseus.saving, 100 * perseus.time_change)
    assert rows["iso-time perseus"][0] < 0  # Perseus saves on the example job at iso-time
