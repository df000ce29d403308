"""mkdocs hook: the flag reference page, generated from ``megatron_energy.config`` at every build.

``docs/reference/flags.md`` holds the marker ``<!-- flag-reference -->``; each build replaces it with one
entry per ``ENERGY_FLAGS`` flag: its options, value, default and text. The text is ``EnergyFlag.text``, the
same one ``--help`` shows (the help each ``EnergyConfig`` field declares), so the page cannot drift from the
code;
``tests/test_flag_reference.py`` checks it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the package of this checkout, not another

from megatron_energy.config import ENERGY_FLAGS, EnergyConfig, EnergyFlag

MARKER = "<!-- flag-reference -->"
"""Where in ``docs/reference/flags.md`` the generated entries go."""


def _code(text: str) -> str:
    """The docstrings' reStructuredText ````code```` as Markdown's single backquotes."""
    return text.replace("``", "`")


def flag_entry(name: str, flag: EnergyFlag) -> str:
    """One flag's entry: a heading, its spellings and value, its default, and its text.

    Args:
        name: The ``EnergyConfig`` field the flag fills.
        flag: Its flag, ``ENERGY_FLAGS[name]``.

    Returns:
        Markdown: a heading naming the flag, a line with its usage, aliases and default, then its text.
    """
    canonical, *aliases = flag.options
    if flag.switch:
        usage = canonical
    elif flag.choices is not None:
        usage = f"{canonical} {{{','.join(flag.choices)}}}"
    else:
        usage = f"{canonical} {flag.metavar or 'VALUE'}"
    alias = "".join(f" (alias `{spelling}`)" for spelling in aliases)
    default = flag.shown(getattr(EnergyConfig(), name))
    return f"### `{canonical}`\n\n`{usage}`{alias} · default: `{default}`\n\n{_code(flag.text())}\n"


def flag_reference() -> str:
    """Every flag's entry, in ``--help`` order."""
    return "\n".join(flag_entry(name, flag) for name, flag in ENERGY_FLAGS.items())


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace the marker on the flag reference page with the generated entries (an mkdocs event)."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, flag_reference())
