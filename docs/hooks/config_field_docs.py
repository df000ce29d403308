"""griffe extension: each ``EnergyConfig`` field's API docs from the flag it declares.

``EnergyConfig``'s fields carry their documentation in their metadata (``EnergyFlag.help``), not in attribute
docstrings, so griffe, reading the source, finds none and mkdocstrings would list no field. This extension
(named under ``mkdocstrings``'s ``extensions`` in ``mkdocs.yml``) gives each field the docstring of its flag:
the flag's spellings and default, then ``EnergyFlag.text``, the text ``--help`` and the flag reference show
(``docs/hooks/flag_reference.py``); and it shows the field's default in place of its ``field(...)`` call.
``tests/test_flag_reference.py`` checks it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import griffe

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the package of this checkout, not another

from megatron_energy.config import ENERGY_FLAGS, EnergyConfig

CONFIG_PATH = "megatron_energy.config.energy_config.EnergyConfig"
"""Where griffe finds the class."""


def field_docstring(name: str) -> str:
    """The API docs of ``EnergyConfig`` field ``name``: its flag, that flag's default, and its text.

    Args:
        name: A field of ``EnergyConfig``.

    Returns:
        Markdown: one paragraph naming the flag and its aliases and default, then the flag's text.
    """
    flag = ENERGY_FLAGS[name]
    canonical, *aliases = flag.options
    alias = "".join(f" (alias ``{spelling}``)" for spelling in aliases)
    default = flag.shown(getattr(EnergyConfig(), name))
    return f"Flag ``{canonical}``{alias}, default ``{default}``.\n\n{flag.text()}"


class EnergyConfigFieldDocs(griffe.Extension):
    """Gives each ``EnergyConfig`` field its flag's docstring and its default as its value."""

    def on_class(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        """Document the fields once griffe has built ``EnergyConfig`` (a griffe event)."""
        if cls.path != CONFIG_PATH:
            return
        defaults = EnergyConfig()
        for name in ENERGY_FLAGS:
            attribute = cls.members[name]
            assert isinstance(attribute, griffe.Attribute), f"EnergyConfig.{name} is not an attribute"
            attribute.docstring = griffe.Docstring(field_docstring(name), parent=attribute)
            attribute.value = repr(getattr(defaults, name))
