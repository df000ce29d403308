"""The package's imports only run down its layers (see the ``megatron_energy`` package docstring).

Every ``import`` in the package, at module level or inside a function, is read from the source with
:mod:`ast`; an import of a higher layer, of the test tree, or of a heavy dependency outside the layer that
owns it fails here with the offending module and line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "megatron_energy"

LAYERS: dict[str, int] = {
    "megatron_energy": 0,
    "megatron_energy.errors": 0,
    "megatron_energy.atomic": 0,
    "megatron_energy.events": 0,
    "megatron_energy.stats": 0,
    "megatron_energy.plugin_threads": 0,
    "megatron_energy.dvfs.spec": 0,
    "megatron_energy.pipeline": 1,
    "megatron_energy.sim": 1,
    "megatron_energy.plan": 1,
    "megatron_energy.plan_outcome": 2,
    "megatron_energy.dvfs.model": 1,
    "megatron_energy.dvfs.calibration": 1,
    "megatron_energy.config": 2,
    "megatron_energy.config_checks": 2,
    "megatron_energy.optimiser": 2,
    "megatron_energy.composition": 2,
    "megatron_energy.registry": 2,
    "megatron_energy.perseus": 2,
    "megatron_energy.kareus": 2,
    "megatron_energy.phases": 2,
    "megatron_energy.runtime": 3,
    "megatron_energy.dvfs": 3,
    "megatron_energy.megatron": 4,
    "megatron_energy.commands": 5,
    "megatron_energy.report": 5,
    "megatron_energy.launch": 5,
    "megatron_energy.cli": 5,
    "megatron_energy.job": 5,
    "megatron_energy.demo_model": 5,
    "megatron_energy.demo_model.cpu_shims": 6,
    "megatron_energy.demo_model.tiny_gpt": 6,
    "megatron_energy.demo_model.pretrain_tiny_gpt": 6,
}
"""The layer of each module or package prefix; the longest matching prefix decides."""

OWNERS: dict[str, tuple[str, ...]] = {
    "megatron": ("megatron_energy.megatron", "megatron_energy.demo_model"),
    "zeus": ("megatron_energy.dvfs",),
    "pynvml": ("megatron_energy.dvfs",),
}
"""Third-party packages only some rooms of the package may import (the demo's training job is a Megatron
training script, run by the launcher like ``pretrain_gpt.py``)."""

LOWEST_TORCH_LAYER = 3
"""Layers below this one are pure Python + numpy/scipy/networkx: no torch."""


@dataclass(frozen=True)
class ImportEdge:
    """One import statement: who imports what, where."""

    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}"


def module_name(path: Path, root: Path = PACKAGE_ROOT) -> str:
    """The dotted module name of a source file under the package directory ``root``."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = PACKAGE_ROOT) -> list[ImportEdge]:
    """Every import in one source file under ``root``, relative imports resolved to absolute names."""
    importer = module_name(path, root)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            edges.extend(ImportEdge(importer, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            edges.append(ImportEdge(importer, name, node.lineno))
    return edges


def all_edges() -> list[ImportEdge]:
    """The imports of every module in the package."""
    return [edge for path in sorted(PACKAGE_ROOT.rglob("*.py")) for edge in imports_of(path)]


def layer_of(module: str) -> int:
    """The layer of a package module: its longest prefix in :data:`LAYERS`."""
    matches = [prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")]
    if not matches:
        raise AssertionError(f"{module} has no layer: add it to LAYERS and to the package docstring")
    return LAYERS[max(matches, key=len)]


def is_within(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or one of its submodules."""
    return module == package or module.startswith(package + ".")


def test_every_module_has_a_layer() -> None:
    for path in PACKAGE_ROOT.rglob("*.py"):
        layer_of(module_name(path))


def test_imports_only_run_down_the_layers() -> None:
    upward = [
        f"{edge} (layer {layer_of(edge.importer)} -> {layer_of(edge.imported)})"
        for edge in all_edges()
        if is_within(edge.imported, "megatron_energy") and layer_of(edge.imported) > layer_of(edge.importer)
    ]
    assert not upward, "imports that run up a layer:\n" + "\n".join(upward)


def test_the_package_imports_nothing_from_the_test_tree() -> None:
    from_tests = [str(edge) for edge in all_edges() if is_within(edge.imported, "tests")]
    assert not from_tests, "\n".join(from_tests)


@pytest.mark.parametrize("dependency", sorted(OWNERS))
def test_a_heavy_dependency_is_imported_by_its_owner_only(dependency: str) -> None:
    owners = OWNERS[dependency]
    strays = [
        str(edge)
        for edge in all_edges()
        if is_within(edge.imported, dependency) and not any(is_within(edge.importer, o) for o in owners)
    ]
    assert not strays, f"only {', '.join(owners)} may import {dependency}:\n" + "\n".join(strays)


def test_lower_layers_do_not_import_torch() -> None:
    strays = [
        str(edge)
        for edge in all_edges()
        if is_within(edge.imported, "torch") and layer_of(edge.importer) < LOWEST_TORCH_LAYER
    ]
    assert not strays, "\n".join(strays)


def test_the_layer_checker_sees_a_relative_upward_import(tmp_path: Path) -> None:
    root = tmp_path / "megatron_energy"
    (root / "pipeline").mkdir(parents=True)
    probe = root / "pipeline" / "probe.py"
    probe.write_text("def late():\n    from ..runtime import session\n")
    (edge,) = imports_of(probe, root)
    assert (edge.importer, edge.imported, edge.line) == (
        "megatron_energy.pipeline.probe",
        "megatron_energy.runtime",
        2,
    )
    assert layer_of(edge.imported) > layer_of(edge.importer)
