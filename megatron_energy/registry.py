"""``--energy-mode`` → optimiser: the one registry every entry point dispatches through.

``perseus`` is the clock-per-instruction optimiser. ``kareus`` (collective launch points and SM budgets)
and ``kernel`` (phase-level clocks) are named modes whose optimisers have not landed yet: asking for them
gives an error that says so, at flag-parsing time (:func:`mode_problem`) and at :func:`resolve`. ``all``
composes every released optimiser in :data:`COMPOSITION_ORDER` (``megatron_energy.composition`` says how).
Tests and plugins add optimisers with :func:`register`.

The registry names factories by import path and imports them only when resolved, so the flag parser can
ask it which modes exist without importing any planner.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from megatron_energy.errors import EnergyValueError

if TYPE_CHECKING:
    from megatron_energy.optimiser import Optimiser

COMPOSITION_ORDER: tuple[str, ...] = ("perseus", "kareus", "kernel")
"""The order ``all`` runs the optimisers in: clocks per instruction first, then collectives, then phases."""

UNRELEASED: dict[str, str] = {
    "kareus": "collective launch points and SM budgets (Kareus-style)",
    "kernel": "phase-level (kernel-group) clocks",
}
"""Modes that are named but whose optimisers have not landed yet, with what they will do."""

Factory = Callable[[], "Optimiser"] | str
"""A zero-argument callable returning an optimiser, or its ``module:attribute`` import path."""

_FACTORIES: dict[str, Factory] = {"perseus": "megatron_energy.perseus.optimiser:PerseusOptimiser"}


class UnknownModeError(EnergyValueError):
    """``--energy-mode`` names no released optimiser."""


def register(name: str, factory: Factory) -> None:
    """Make ``factory`` the optimiser of ``--energy-mode name`` (replacing any registered one)."""
    _FACTORIES[name] = factory


def unregister(name: str) -> None:
    """Forget a registered optimiser (tests, plugins)."""
    _FACTORIES.pop(name, None)


def released_modes() -> list[str]:
    """Modes that resolve to an optimiser, ``all`` included."""
    return [*_FACTORIES, "all"]


def mode_problem(mode: str) -> str | None:
    """Why ``--energy-mode mode`` cannot run, with what to use instead; ``None`` when it can."""
    if mode == "all" or mode in _FACTORIES:
        return None
    released = ", ".join(released_modes())
    if mode in UNRELEASED:
        return (
            f"--energy-mode {mode} ({UNRELEASED[mode]}) is not available in this release; "
            f"use one of {released}"
        )
    return f"unknown --energy-mode {mode!r}; use one of {released}"


def resolve(mode: str) -> Optimiser:
    """The optimiser for ``--energy-mode mode``.

    Raises:
        UnknownModeError: The mode is not released (yet) or unknown; the message lists the released ones.
    """
    problem = mode_problem(mode)
    if problem is not None:
        raise UnknownModeError(problem)
    if mode == "all":
        from megatron_energy.composition import ComposedOptimiser

        return ComposedOptimiser(
            [_build(_FACTORIES[name]) for name in COMPOSITION_ORDER if name in _FACTORIES]
        )
    return _build(_FACTORIES[mode])


def _build(factory: Factory) -> Optimiser:
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        return getattr(importlib.import_module(module), attribute)()
    return factory()
