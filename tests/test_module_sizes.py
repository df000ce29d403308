"""Every module of the package is at most :data:`MAX_LINES` lines.

A module past the limit does more than one job; split it by responsibility (one job per file, names that say
what each holds).
"""

from __future__ import annotations

from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "megatron_energy"

MAX_LINES = 500
"""The most lines a module of the package may have."""


def line_count(path: Path) -> int:
    """Lines of a source file, as ``wc -l`` counts them (a last line without a newline counts too)."""
    return len(path.read_text(encoding="utf-8").splitlines())


def module_sizes(root: Path = PACKAGE_ROOT) -> dict[str, int]:
    """Every module under ``root`` (relative POSIX path) and its line count."""
    return {path.relative_to(root).as_posix(): line_count(path) for path in sorted(root.rglob("*.py"))}


def oversized(sizes: dict[str, int]) -> list[str]:
    """The modules past :data:`MAX_LINES`, each with its size."""
    return [f"{name}: {lines} lines" for name, lines in sizes.items() if lines > MAX_LINES]


def test_every_module_is_at_most_500_lines() -> None:
    over = oversized(module_sizes())
    assert not over, f"modules past {MAX_LINES} lines (split each by responsibility): {over}"


@pytest.mark.parametrize(("lines", "found"), [(MAX_LINES, []), (MAX_LINES + 1, ["big.py: 501 lines"])])
def test_the_check_sees_a_module_one_line_past_the_limit(
    tmp_path: Path, lines: int, found: list[str]
) -> None:
    (tmp_path / "big.py").write_text("x = 1\n" * lines)
    assert oversized(module_sizes(tmp_path)) == found
