"""The README's "What would it save on my job?" section: its table is what its command prints.

The section holds one ``bash`` block (the command) and one ``text`` block (its table). The command's output
is committed beside the estimate's results page (``docs/results/data/2026-12-06-estimate-70b.txt``, the
command after ``$ ``, then what it printed); the README must show exactly that command and table. Running the
command takes minutes on two cores (the 70B job: ``docs/results/2026-12-06-estimate.md``), so the suite
re-runs it only with ``MEGATRON_ENERGY_LONG_TESTS=1``; that estimate's savings equal ``plan``'s is held by
``test_estimate_command.py`` on a quicker job. (The README's other figures are another test's.)
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from megatron_energy.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMITTED = ROOT / "docs" / "results" / "data" / "2026-12-06-estimate-70b.txt"
SECTION = "## What would it save on my job?"


def _arguments(command: str) -> list[str]:
    """A shell command line as ``megatron-energy``'s arguments."""
    arguments = shlex.split(command.replace("\\\n", " "))
    assert arguments[0] == "megatron-energy"
    return arguments[1:]


def _section() -> tuple[list[str], list[list[str]]]:
    """The section's command (arguments after ``megatron-energy``) and its table's rows (cells)."""
    text = README.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    (command,) = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    (table,) = re.findall(r"```text\n(.*?)```", text, flags=re.S)
    return _arguments(command), _rows(table)


def _committed() -> tuple[list[str], list[list[str]]]:
    """The committed run: its command and its table's rows."""
    text = COMMITTED.read_text(encoding="utf-8").removeprefix("$ ")
    command, output = _split_command(text)
    return _arguments(command), _rows(output)


def _split_command(text: str) -> tuple[str, str]:
    """The command (its continued lines) and what follows it."""
    lines = text.splitlines(keepends=True)
    end = next(i for i, line in enumerate(lines) if not line.rstrip("\n").endswith("\\"))
    return "".join(lines[: end + 1]), "".join(lines[end + 1 :])


def _rows(table: str) -> list[list[str]]:
    """The body rows of a printed table, each as its stripped cells."""
    return [
        [cell.strip() for cell in line.strip().strip("│").split("│")]
        for line in table.splitlines()
        if line.startswith("│")
    ]


def test_the_section_names_one_command_and_a_table_of_every_mode() -> None:
    arguments, rows = _section()
    assert arguments[0] == "estimate" and "--" in arguments
    assert {row[1] for row in rows} == {"perseus", "kareus", "kernel", "all"}
    assert all("modelled" in row[3] for row in rows)


def test_the_readme_shows_the_committed_run_of_its_command() -> None:
    assert _section() == _committed()


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("MEGATRON_ENERGY_LONG_TESTS") != "1",
    reason="the 70B estimate takes minutes on two cores: set MEGATRON_ENERGY_LONG_TESTS=1 to run it",
)
def test_the_command_prints_the_committed_table_today(capfd: pytest.CaptureFixture[str]) -> None:
    arguments, rows = _committed()
    assert main(arguments) == 0
    assert _rows(capfd.readouterr().out) == rows
