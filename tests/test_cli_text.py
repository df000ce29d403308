"""What ``megatron-energy`` prints about itself: ``--version`` and help text free of reST markup."""

from __future__ import annotations

import pytest

from megatron_energy import __version__
from megatron_energy.cli import main


def _printed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _printed(["--version"], capsys).strip() == f"megatron-energy {__version__}"


def test_calibrate_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    text = _printed(["calibrate", "--help"], capsys)
    assert "``" not in text and "::" not in text and 'r"""' not in text
    assert "--energy-gpu-spec PATH.yaml:" in text
    assert "    megatron-energy calibrate --shipped h100-sxm" in text  # the example stays indented
