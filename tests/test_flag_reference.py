"""The docs' flag reference and ``--help`` say the same of every flag: one text per ``EnergyConfig`` field.

The reference page is what the mkdocs hook (``docs/hooks/flag_reference.py``) makes of
``docs/reference/flags.md`` at build time; the help is what ``argparse`` prints for the flags
``add_energy_args`` adds. Both must carry the help each field declares (``EnergyFlag.text``) and the same
default.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from dataclasses import fields
from pathlib import Path
from types import ModuleType

import pytest

from megatron_energy.config import ENERGY_FLAGS, EnergyConfig, add_energy_args

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "flags.md"
ENTRY = re.compile(
    r"^### `(?P<flag>--[\w-]+)`\n\n`(?P<usage>[^`]+)`(?P<aliases>(?: \(alias `[^`]+`\))*) · default: "
    r"`(?P<default>[^`]*)`\n\n(?P<text>[^\n]+)\n",
    re.MULTILINE,
)


def _hook() -> ModuleType:
    path = ROOT / "docs" / "hooks" / "flag_reference.py"
    spec = importlib.util.spec_from_file_location("flag_reference_hook", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> dict[str, re.Match[str]]:
    """The generated page's entries by canonical flag, as the docs build renders the page."""
    markdown = _hook().on_page_markdown(PAGE.read_text(encoding="utf-8"), page=None)
    entries = {match["flag"]: match for match in ENTRY.finditer(markdown)}
    assert markdown.count("\n### ") == len(entries), "an entry the pattern does not read"
    return entries


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[list[str], str]]:
    """Each flag's option strings and help line, as ``--help`` prints it."""
    parser = add_energy_args(argparse.ArgumentParser(prog="test"))
    formatter = parser._get_formatter()
    return {
        action.option_strings[0]: (action.option_strings, formatter._expand_help(action))
        for action in parser._actions
        if action.dest.startswith("energy_")
    }


def _plain(markdown: str) -> str:
    return markdown.replace("`", "")


def test_every_config_field_has_a_flag_with_a_help_text() -> None:
    names = [spec.name for spec in fields(EnergyConfig)]
    assert list(ENERGY_FLAGS) == names
    for name in names:
        assert len(ENERGY_FLAGS[name].help.split()) >= 5, f"EnergyConfig.{name} has no help text"


def test_the_checked_in_page_carries_the_generated_entries_and_they_are_current() -> None:
    """Issue 44: the page was empty on GitHub (its entries existed only in the built site)."""
    text = PAGE.read_text(encoding="utf-8")
    hook = _hook()
    assert text == hook.with_reference(text), (
        "docs/reference/flags.md is out of date: run `python docs/hooks/flag_reference.py`"
    )
    assert text.count("\n### `--energy-") == len(ENERGY_FLAGS)
    head = text.split(hook.START)[0]
    assert not re.search(r"^#{2,} ", head, re.MULTILINE), "hand-written flag entries in the page"


def test_each_flags_help_is_its_reference_entry(reference, helps) -> None:
    assert sorted(reference) == sorted(helps)
    for flag, (options, help_line) in helps.items():
        entry = reference[flag]
        aliases = re.findall(r"`([^`]+)`", entry["aliases"])
        assert [flag, *aliases] == options
        assert entry["usage"].startswith(flag)
        text = _plain(entry["text"])
        assert help_line == f"{text.removesuffix('.')} (default: {entry['default']}).", flag


def test_the_text_is_the_help_the_config_field_declares(reference) -> None:
    for flag in ENERGY_FLAGS.values():
        text = reference[flag.options[0]]["text"].replace("`", "``")
        assert text.startswith(" ".join(flag.help.split()).removesuffix(".")), flag.options[0]
