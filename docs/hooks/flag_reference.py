"""mkdocs hook: the flag reference page, generated from ``megatron_energy.config`` at every build.

``docs/reference/flags.md`` holds the marker ``<!-- flag-reference -->``; each build replaces it with one
entry per ``ENERGY_FLAGS`` flag: its options, value, default and text. The text is ``flag_text``, the same one
``--help`` shows (each ``EnergyConfig`` field's docstring), so the page cannot drift from the code;
``tests/test_flag_reference.py`` checks it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the package of this checkout, not another

from megatron_energy.config import ENERGY_FLAGS, EnergyConfig, EnergyFlag, flag_text, shown_default

MARKER = "<!-- flag-reference -->"
"""Where in ``docs/reference/flags.md`` the generated entries go."""


def _code(text: str) -> str:
    """The docstrings' reStructuredText ````code```` as Markdown's single backquotes."""
    return text.replace("``", "`")


def flag_entry(flag: EnergyFlag) -> str:
    """One flag's entry: a heading, its spellings and value, its default, and its text.

    Args:
        flag: One of ``ENERGY_FLAGS``.

    Returns:
        Markdown: a heading naming the flag, a line with its usage, aliases and default, then its text.
    """
    canonical, *aliases = flag.options
    settings = flag.settings
    if settings.get("action") == "store_true":
        usage = canonical
    elif "choices" in settings:
        usage = f"{canonical} {{{','.join(settings['choices'])}}}"
    else:
        usage = f"{canonical} {settings.get('metavar', 'VALUE')}"
    alias = "".join(f" (alias `{name}`)" for name in aliases)
    default = shown_default(flag, getattr(EnergyConfig(), flag.config_field))
    return f"### `{canonical}`\n\n`{usage}`{alias} · default: `{default}`\n\n{_code(flag_text(flag))}\n"


def flag_reference() -> str:
    """Every flag's entry, in ``--help`` order."""
    return "\n".join(flag_entry(flag) for flag in ENERGY_FLAGS)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace the marker on the flag reference page with the generated entries (an mkdocs event)."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, flag_reference())
