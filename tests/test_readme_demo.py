"""The README's demo figures come from the demo: one run of plain ``megatron-energy demo`` (its defaults,
as the README tells a newcomer to run it) against every figure the README quotes of it.

The table, the left-out line and the last ``[energy]`` line are compared line for line (the simulated GPUs
make the demo deterministic); the figures in the prose (the command's iterations, the profiled clocks and
iterations, the iterations under the plan, the run's planned iteration time, the share of the instant-switch
saving that survives the switch latency) are read from the README and computed from the run.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from megatron_energy.cli import main
from megatron_energy.plan_file import load_plan
from megatron_energy.report.job_report import latest_job_folder

pytestmark = pytest.mark.world  # the demo's torch.distributed.run of four ranks

README = Path(__file__).resolve().parents[1] / "README.md"
TABLE_TITLE = "target iso-time: every figure modelled"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    energy_dir = tmp_path_factory.mktemp("readme-demo")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["demo", "--energy-dir", str(energy_dir)]) == 0
    return out.getvalue().splitlines(), latest_job_folder(energy_dir)


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _blocks(text: str) -> list[list[str]]:
    """The README's fenced blocks, as lines."""
    return [block.splitlines() for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)]


def _quoted(pattern: str) -> str:
    (found,) = re.findall(pattern, _readme())
    return found


def test_the_readmes_table_and_energy_line_are_what_the_demo_prints(demo) -> None:
    lines, _ = demo
    (table,) = [block for block in _blocks(_readme()) if block[0].endswith(TABLE_TITLE)]
    start = lines.index(table[0])
    assert lines[start : start + len(table)] == table
    (energy,) = [block for block in _blocks(_readme()) if block[0].startswith("[energy] iteration ")]
    (quoted,) = energy
    iteration = quoted.split(" | ")[0]
    assert [line for line in lines if line.startswith(f"{iteration} |")] == [quoted]


def test_the_readmes_prose_figures_are_the_demos(demo) -> None:
    lines, job = demo
    (command,) = [line for line in lines if line.startswith("launcher command: ")]
    assert re.search(rf"--train-iters {_quoted(r'--train-iters (\d+) ')}\b", command)
    profiling = [line for line in lines if re.match(r"\[energy\] iteration \d+ \| profiling", line)]
    planned = [line for line in lines if re.match(r"\[energy\] iteration \d+ \| planned", line)]
    clocks, iterations = re.findall(r"profiles a (\d+)-clock grid \((\d+) iterations", _readme())[0]
    profiled_mhz = {row.split(",")[2] for row in (job / "profile.csv").read_text().splitlines()[1:]}
    assert (int(clocks), int(iterations)) == (len(profiled_mhz), len(profiling))
    assert int(_quoted(r"runs the plan for (\d+) iterations")) == len(planned)
    (run_row,) = [line for line in lines if line.startswith("│ iteration time, run (modelled)")]
    assert f"hence {_quoted(r'hence ([\d.]+) ms')} ms" in f"hence {run_row.split('│')[3].split()[0]} ms"
    plan = load_plan(job / "plan.json")
    target = plan.target_point
    instant = min(s.energy_j for s in plan.frontier if s.time_s <= target.deadline_s * (1 + 1e-9))
    survives = (plan.baseline.energy_j - target.energy_j) / (plan.baseline.energy_j - instant)
    assert int(_quoted(r"(\d+) % of the instant-switch saving survives")) == round(100 * survives)
