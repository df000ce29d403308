"""The README's headline savings are what a named command prints today (issue 44, item 6).

The "What to expect" table's first two rows quote ``megatron-energy simulate --switch-latency-sweep
10ms,10us`` over the example jobs (``configs/examples/``). That command takes minutes on two cores, so its
output is committed (:data:`SWEEP_OUTPUT`, written by the command itself) and

* the fast test holds the README to the committed output: each job's saving at 10 ms (instruction level)
  and at 10 µs (phase level) with its band, rounded as the README rounds, and the phase level's gain;
* the slow test runs the command again on the quickest example job and compares its rows with the committed
  ones, so the committed output stays what the command prints (refresh it with the command on the results
  page when a model change moves a figure, and the README with it).
"""

from __future__ import annotations

import contextlib
import io
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from megatron_energy.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS_PAGE = ROOT / "docs" / "results" / "2026-12-06-headline-figures.md"
SWEEP_OUTPUT = ROOT / "docs" / "results" / "data" / "2026-12-06-headline-sweep.md"
COMMAND = "megatron-energy simulate --switch-latency-sweep 10ms,10us"
README_JOBS = {
    "gpt3-xl-pp4-h100": "GPT-3 XL PP=4 on H100",
    "llama-7b-pp4-tp2-h200": "Llama-7B PP=4 TP=2 on H200",
    "llama-70b-pp8-tp8-a100": "Llama-70B PP=8 TP=8 on A100",
}
"""The example jobs the README quotes, as it names them, in its order."""
SAVING = re.compile(r"(-?\d+\.\d+) % \((-?\d+\.\d+) to (-?\d+\.\d+) %, modelled\)")


def sweep_rows(text: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(job, latency) -> (instruction level, phase level) cells of the sweep's Markdown rows."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0] in README_JOBS:
            rows[cells[0], cells[1]] = (cells[3], cells[4])
    return rows


def nominal(cell: str) -> float:
    """A sweep cell's saving, without its band."""
    match = SAVING.fullmatch(cell)
    assert match is not None, cell
    return float(match[1])


def one_decimal(cell: str) -> str:
    """A sweep cell as the README quotes it, half away from zero: ``-26.6 % (-19.3 to -34.8 %, modelled)``."""
    match = SAVING.fullmatch(cell)
    assert match is not None, cell
    value, low, high = (Decimal(figure).quantize(Decimal("0.1"), ROUND_HALF_UP) for figure in match.groups())
    return f"{value} % ({low} to {high} %, modelled)"


def readme_row(starts: str) -> str:
    (row,) = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith(starts)]
    return row


def test_the_readmes_headline_savings_are_the_committed_output_of_the_named_command() -> None:
    rows = sweep_rows(SWEEP_OUTPUT.read_text(encoding="utf-8"))
    instruction = readme_row("| energy change at the same iteration time, clock per instruction, 10 ms")
    expected = "; ".join(
        f"{name}{' (spec calibrated 2026-12-06)' if job.startswith('gpt3') else ''}: "
        f"{one_decimal(rows[job, '10 ms'][0])}"
        for job, name in README_JOBS.items()
    )
    assert f"| {expected} |" in instruction
    phase = readme_row("| the same with phase-level clocks at a Blackwell-class 10 µs switch")
    quoted = " / ".join(one_decimal(rows[job, "10 µs"][1]) for job in README_JOBS)
    gains = [nominal(rows[job, "10 µs"][0]) - nominal(rows[job, "10 µs"][1]) for job in README_JOBS]
    assert f"| {quoted}; {min(gains):.2f} to {max(gains):.2f} points more than the instruction level" in phase
    for row in (instruction, phase):
        assert COMMAND in row and "docs/results/2026-12-06-headline-figures.md" in row


def test_the_results_page_names_the_command_and_the_committed_output() -> None:
    page = RESULTS_PAGE.read_text(encoding="utf-8")
    assert COMMAND in page and f"data/{SWEEP_OUTPUT.name}" in page


@pytest.mark.slow
def test_the_command_prints_the_committed_rows_today() -> None:
    """Minutes for every job on two cores: the quickest example job stands for them."""
    job = "gpt3-xl-pp4-h100"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(
            [
                "simulate",
                "--config",
                str(ROOT / "configs" / "examples" / f"{job}.yaml"),
                "--switch-latency-sweep",
                "10ms,10us",
            ]
        )
    assert status == 0
    today = {key: cells for key, cells in sweep_rows(out.getvalue()).items() if key[0] == job}
    committed = {key: cells for key, cells in sweep_rows(SWEEP_OUTPUT.read_text()).items() if key[0] == job}
    assert today == committed and len(today) == 2
