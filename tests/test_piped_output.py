"""Output piped or redirected to a file keeps every table cell whole and on one line (no ``…``)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from megatron_energy.cli import main

EXAMPLE = Path(__file__).resolve().parents[1] / "configs" / "examples" / "gpt3-xl-pp4-h100.yaml"


def _piped(argv: list[str]) -> str:
    out = io.StringIO()  # not a terminal, as `megatron-energy ... > file` or `| less`
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "header"),
    [
        (["simulate", "--config", str(EXAMPLE)], "blocked J"),
        (["plan", "--config", str(EXAMPLE), "--points", "4"], "energy per iteration (J)"),
    ],
)
def test_tables_are_not_cut_when_piped(argv: list[str], header: str, tmp_path: Path) -> None:
    if argv[0] == "plan":
        argv = [*argv, "--out", str(tmp_path / "plan.json")]
    out = _piped(argv)
    assert header in out
    assert "…" not in out, out
