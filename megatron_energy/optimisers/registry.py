"""``--energy-mode`` → optimiser: the one registry every entry point dispatches through.

``perseus`` is the clock-per-instruction optimiser; ``kareus`` chooses the launch point and CTA (SM) budget
of every collective class jointly with the clock (alone: at stock clocks; it needs the job's collective
workload, ``PlanningJob.collectives``); ``kernel`` gives each phase of kernels inside and outside
instructions its own clock under the switch latency (``megatron_energy.optimisers.kernel``). ``all`` composes
every released optimiser in :data:`COMPOSITION_ORDER` (``megatron_energy.optimisers.composition`` says how):
Perseus's clocks, then Kareus's collectives on them, then phase clocks. A named mode whose optimiser has not
landed gives an error that says so, at flag-parsing time (:func:`mode_problem`) and at :func:`resolve`.
Tests add optimisers with :func:`register`; an installed plugin package adds one without touching this
package by declaring an entry point in the ``megatron_energy.optimisers`` group (``name = module:factory``,
e.g. in its ``pyproject.toml``: ``[project.entry-points."megatron_energy.optimisers"]`` then
``toy = "toy:ToyOptimiser"``).
Entry points are read once, on first use; a registered name wins over an entry point of the same name.

The registry names factories by import path and imports them only when resolved, so the flag parser can
ask it which modes exist without importing any planner.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from megatron_energy.errors import UnknownModeError

if TYPE_CHECKING:
    from megatron_energy.optimisers.interface import Optimiser

COMPOSITION_ORDER: tuple[str, ...] = ("perseus", "kareus", "kernel")
"""The order ``all`` runs the optimisers in: clocks per instruction first, then collectives, then phases."""

UNRELEASED: dict[str, str] = {}
"""Modes that are named but whose optimisers have not landed yet, with what they will do."""

Factory = Callable[[], "Optimiser"] | str
"""A zero-argument callable returning an optimiser, or its ``module:attribute`` import path."""

_FACTORIES: dict[str, Factory] = {
    "perseus": "megatron_energy.optimisers.perseus.clock_optimiser:PerseusOptimiser",
    "kareus": "megatron_energy.optimisers.kareus.collective_optimiser:KareusOptimiser",
    "kernel": "megatron_energy.optimisers.kernel.phase_optimiser:PhaseOptimiser",
}

ENTRY_POINT_GROUP = "megatron_energy.optimisers"
"""The entry-point group plugin packages declare their optimisers in."""


def register(name: str, factory: Factory) -> None:
    """Make ``factory`` the optimiser of ``--energy-mode name`` (replacing any registered one)."""
    _FACTORIES[name] = factory


def unregister(name: str) -> None:
    """Forget a registered optimiser (tests, plugins)."""
    _FACTORIES.pop(name, None)


def registered() -> dict[str, Factory]:
    """Every optimiser registered in this process, the built-in ones included (a copy).

    A planner process registers them again (``runtime.planning_round.planner_process``), so it resolves
    ``--energy-mode`` as this process does; each factory travels by import path, or pickled by reference.
    """
    return dict(_FACTORIES)


@cache
def _plugin_factories() -> dict[str, Factory]:
    """Optimisers installed packages declare as entry points (read once per process)."""
    return {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP)}


def _factories() -> dict[str, Factory]:
    """Every optimiser known now: entry points, then registered ones (which win)."""
    return {**_plugin_factories(), **_FACTORIES}


def released_modes() -> list[str]:
    """Modes that resolve to an optimiser, ``all`` included."""
    return [*_factories(), "all"]


def mode_problem(mode: str) -> str | None:
    """Why ``--energy-mode mode`` cannot run, with what to use instead; ``None`` when it can."""
    if mode == "all" or mode in _factories():
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
        from megatron_energy.optimisers.composition import ComposedOptimiser

        factories = _factories()
        return ComposedOptimiser([_build(factories[name]) for name in COMPOSITION_ORDER if name in factories])
    return _build(_factories()[mode])


def _build(factory: Factory) -> Optimiser:
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        return getattr(importlib.import_module(module), attribute)()
    return factory()
