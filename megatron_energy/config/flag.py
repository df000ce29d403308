"""One ``--energy-*`` flag, declared on the ``EnergyConfig`` field it fills.

Every field of ``EnergyConfig`` carries an :class:`EnergyFlag` in its ``metadata`` (under :data:`FLAG`). The
flag holds all there is to say about it (spellings, how its text is read, the rule its value obeys, its help
text), so the field is the one definition that the parser, ``--help``, the docs' flag reference and the
config's own checks all read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from megatron_energy.config.checks import Check, choice_check
from megatron_energy.config.values import checked_value

FLAG = "energy_flag"
"""The key of a field's :class:`EnergyFlag` in its ``metadata``."""


@dataclass(frozen=True)
class EnergyFlag:
    """How one ``EnergyConfig`` field is set on the command line, and what its value may be."""

    options: tuple[str, ...]
    """Option strings, the canonical one first."""

    help: str
    """What the flag does, with reStructuredText ````code```` markup: ``--help`` shows it plain, the docs'
    flag reference as Markdown (:meth:`text`)."""

    parse: Callable[[str], Any] | None = None
    """Text -> value (with ``check``, the flag's ``argparse`` type); ``None``: the text itself."""

    check: Check | None = None
    """The rule the value obeys: the ``argparse`` type applies it to the parsed text, ``EnergyConfig`` to its
    field."""

    choices: tuple[str, ...] | None = None
    """The values the flag takes (``argparse`` refuses others, and ``EnergyConfig`` too)."""

    metavar: str | None = None
    """How the usage and help name the value."""

    switch: bool = False
    """An on/off switch without a value (``store_true``)."""

    path: bool = False
    """The config holds the text as a ``Path`` (the parsed namespace keeps the text, as Megatron's do)."""

    needs_optimise: bool = True
    """The flag has no effect without ``--energy-optimise`` (given alone, the command line is refused)."""

    unset: str = "none"
    """How the help names the value ``None``."""

    known: Callable[[], Sequence[str]] | None = None
    """The values this flag knows of, listed after its text (e.g. the shipped GPU specs); ``None``: none."""

    def text(self) -> str:
        """What the flag does: :attr:`help` on one line, plus the values it knows of.

        The one text of a flag: ``--help`` shows it without markup, the docs' flag reference as Markdown
        (``docs/hooks/flag_reference.py``); ``tests/test_flag_reference.py`` holds the two to it.

        Returns:
            One paragraph with ````code```` markup.
        """
        text = " ".join(self.help.split())
        if self.known is not None:
            text = f"{text.removesuffix('.')}; known: {', '.join(f'``{name}``' for name in self.known())}."
        return text

    def shown(self, value: object) -> str:
        """A value of the flag's field as ``--help``, the docs' flag reference and a command line show it.

        Args:
            value: A value of its ``EnergyConfig`` field.

        Returns:
            ``on``/``off`` for switches, :attr:`unset` for ``None``, a comma-separated list for a tuple.
        """
        if isinstance(value, bool):
            return "on" if value else "off"
        if value is None:
            return self.unset
        if isinstance(value, tuple):
            return ",".join(str(item) for item in value)
        return str(value)

    def problem(self, value: object) -> str | None:
        """What is wrong with ``value`` for this flag's field (its check, or its choices), or ``None``."""
        if self.check is not None:
            return self.check(value)
        if self.choices is not None:
            return choice_check(self.choices)(value)
        return None

    def argparse_settings(self) -> dict[str, Any]:
        """``action``, ``choices``, ``type`` and ``metavar`` for ``add_argument``, those the flag has."""
        if self.switch:
            return {"action": "store_true"}
        settings: dict[str, Any] = {}
        if self.choices is not None:
            settings["choices"] = self.choices
        if self.parse is not None:
            settings["type"] = (
                self.parse
                if self.check is None
                else partial(checked_value, parse=self.parse, check=self.check)
            )
        if self.metavar is not None:
            settings["metavar"] = self.metavar
        return settings


def flag_dest(name: str) -> str:
    """The ``argparse`` destination of field ``name``'s flag (on Megatron's args too): ``energy_<name>``."""
    return f"energy_{name}"
