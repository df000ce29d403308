"""One exception root: every public error class the package defines derives from ``EnergyError``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import megatron_energy
from megatron_energy.errors import EnergyError


def public_error_classes() -> list[type[BaseException]]:
    """The public exception classes defined (not imported) in every module of the package."""
    found = []
    for module_info in pkgutil.walk_packages(megatron_energy.__path__, prefix="megatron_energy."):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found.append(value)
    return found


def test_every_public_error_derives_from_the_root() -> None:
    errors = public_error_classes()
    assert len(errors) >= 10
    strays = [f"{e.__module__}.{e.__qualname__}" for e in errors if not issubclass(e, EnergyError)]
    assert not strays, "errors outside the EnergyError root: " + ", ".join(strays)
