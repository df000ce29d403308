"""The README and every docs page name only repository files that exist.

A path such as ``scripts/...``, ``lab/...``, ``megatron_energy/...``, ``configs/...``, ``docs/...``,
``tests/...`` or ``patches/...`` must name a file or folder of this checkout. A path that stops at a
placeholder (``<job>``, ``*``, ``{...}``, or a name in capitals such as ``NAME.yaml``) must name an existing
folder up to there. A dated results page may
quote a tool that is gone, if it says so: ``\\`path\\` (no longer in the repository``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
REPOSITORY_PATH = re.compile(
    r"(?<![\w./-])((?:scripts|lab|megatron_energy|configs|docs|tests|patches)/[\w./-]*)(?P<placeholder>[<*{])?"
)
GONE = "` (no longer in the repository"
CAPITALS = re.compile(r"^[A-Z][A-Z_]*(\.\w+)?$")
"""A file name that stands for any (``NAME.yaml``)."""


def named_paths(text: str) -> list[str]:
    """The repository paths ``text`` names; a path cut short by a placeholder as its folder."""
    paths = []
    for match in REPOSITORY_PATH.finditer(text):
        path = match[1].rstrip(".")
        folder, _, name = path.rpartition("/")
        paths.append(folder if match["placeholder"] or CAPITALS.match(name) else path)
    return paths


def missing_paths(page: Path) -> list[str]:
    """The paths ``page`` names that do not exist and that it does not say are gone."""
    text = page.read_text(encoding="utf-8")
    flat = " ".join(text.split())
    return sorted(
        {path for path in named_paths(text) if not (ROOT / path).exists() and f"{path}{GONE}" not in flat}
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_the_page_names_no_missing_file(page: Path) -> None:
    assert missing_paths(page) == []


def test_the_checker_finds_missing_files_and_reads_placeholders(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "`scripts/gpt_job.py`, lab/gpt_job.py, configs/examples/<job>.yaml, configs/examples/*.yaml, "
        "configs/gpus/NAME.yaml, configs/nowhere/NAME.yaml, "
        "https://example.org/docs/nowhere.md, `lab/gone.py` (no longer\nin the repository), docs/none/.",
        encoding="utf-8",
    )
    assert missing_paths(page) == ["configs/nowhere", "docs/none/", "scripts/gpt_job.py"]
