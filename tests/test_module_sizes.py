"""Every module of the package is at most :data:`MAX_LINES` lines, but the few the allow-list names.

A module past the limit does more than one job; split it by responsibility (one job per file, names that say
what each holds). The allow-list names the modules still waiting for their split, each with why; it only
shrinks, and a module that has come under the limit must leave it (the test says so).
"""

from __future__ import annotations

from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "megatron_energy"

MAX_LINES = 500
"""The most lines a module of the package may have."""

OVER_THE_LIMIT: dict[str, str] = {
    "runtime/session.py": "others edit it now; the lead splits it next",
    "megatron/hooks.py": "others edit it now; the lead splits it next",
}
"""Modules (relative to the package) allowed past :data:`MAX_LINES` for now, each with why."""


def line_count(path: Path) -> int:
    """Lines of a source file, as ``wc -l`` counts them (a last line without a newline counts too)."""
    return len(path.read_text(encoding="utf-8").splitlines())


def module_sizes(root: Path = PACKAGE_ROOT) -> dict[str, int]:
    """Every module under ``root`` (relative POSIX path) and its line count."""
    return {path.relative_to(root).as_posix(): line_count(path) for path in sorted(root.rglob("*.py"))}


def oversized(sizes: dict[str, int], allowed: dict[str, str]) -> list[str]:
    """The modules past :data:`MAX_LINES` that ``allowed`` does not name, each with its size."""
    return [
        f"{name}: {lines} lines" for name, lines in sizes.items() if lines > MAX_LINES and name not in allowed
    ]


def test_every_module_is_at_most_500_lines() -> None:
    over = oversized(module_sizes(), OVER_THE_LIMIT)
    assert not over, f"modules past {MAX_LINES} lines (split each by responsibility): {over}"


def test_the_allow_list_names_only_modules_still_over_the_limit() -> None:
    sizes = module_sizes()
    stale = [name for name in OVER_THE_LIMIT if sizes.get(name, 0) <= MAX_LINES]
    assert not stale, (
        f"these modules are gone or at most {MAX_LINES} lines now: drop them from the list: {stale}"
    )


@pytest.mark.parametrize(("lines", "found"), [(MAX_LINES, []), (MAX_LINES + 1, ["big.py: 501 lines"])])
def test_the_check_sees_a_module_one_line_past_the_limit(
    tmp_path: Path, lines: int, found: list[str]
) -> None:
    (tmp_path / "big.py").write_text("x = 1\n" * lines)
    (tmp_path / "listed.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(module_sizes(tmp_path), {"listed.py": "waiting"}) == found
