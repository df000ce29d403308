"""The README's "What would it save on my job?" section: its table is what its command prints today.

The section holds one ``bash`` block (the command) and one ``text`` block (its table); the command is run as
written and every row of the table compared cell by cell. (The README's other figures are another test's.)
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from megatron_energy.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## What would it save on my job?"


def _section() -> tuple[list[str], list[list[str]]]:
    """The section's command (arguments after ``megatron-energy``) and its table's rows (cells)."""
    text = README.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    (command,) = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    (table,) = re.findall(r"```text\n(.*?)```", text, flags=re.S)
    arguments = shlex.split(command.replace("\\\n", " "))
    assert arguments[0] == "megatron-energy"
    return arguments[1:], _rows(table)


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


@pytest.mark.slow
def test_the_readme_table_is_what_the_command_prints(capfd: pytest.CaptureFixture[str]) -> None:
    arguments, rows = _section()
    assert main(arguments) == 0
    assert _rows(capfd.readouterr().out) == rows
