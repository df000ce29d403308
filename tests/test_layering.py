"""The package's imports only run down its layers (see the ``megatron_energy`` package docstring).

Every ``import`` in the package, at module level or inside a function, is read from the source with
:mod:`ast`; an import of a higher layer, of the test tree, or of a heavy dependency outside the layer that
owns it fails here with the offending module and line.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "megatron_energy"

LAYERS: dict[str, int] = {
    "megatron_energy": 0,
    "megatron_energy.errors": 0,
    "megatron_energy.atomic": 0,
    "megatron_energy.log": 0,
    "megatron_energy.events": 0,
    "megatron_energy.stats": 0,
    "megatron_energy.power_swing": 0,
    "megatron_energy.plugin_threads": 0,
    "megatron_energy.dvfs.spec": 0,
    "megatron_energy.dvfs.kernel_classes": 0,
    "megatron_energy.dvfs.spec_ranges": 0,
    "megatron_energy.dvfs.clock_switch": 0,
    "megatron_energy.target": 1,
    "megatron_energy.smooth_bound": 1,
    "megatron_energy.pipeline": 1,
    "megatron_energy.sim": 1,
    "megatron_energy.plan": 1,
    "megatron_energy.plan_file": 1,
    "megatron_energy.plan_band": 1,
    "megatron_energy.plan_smoothing": 1,
    "megatron_energy.plan_outcome": 2,
    "megatron_energy.dvfs.model": 1,
    "megatron_energy.dvfs.calibration": 1,
    "megatron_energy.dvfs.calibration_fit": 1,
    "megatron_energy.dvfs.calibrated_spec": 1,
    "megatron_energy.config": 2,
    "megatron_energy.job": 2,
    "megatron_energy.job_file": 1,
    "megatron_energy.energy_dir": 2,
    "megatron_energy.optimisers": 2,
    "megatron_energy.runtime": 3,
    "megatron_energy.dvfs": 3,
    "megatron_energy.megatron": 4,
    "megatron_energy.commands": 5,
    "megatron_energy.report": 5,
    "megatron_energy.launch": 5,
    "megatron_energy.launch_errors": 5,
    "megatron_energy.launch_output": 5,
    "megatron_energy.cli": 5,
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

CONCRETE_OPTIMISERS: tuple[str, ...] = (
    "megatron_energy.optimisers.perseus",
    "megatron_energy.optimisers.kareus",
    "megatron_energy.optimisers.kernel",
)
"""The optimisers behind the interface (``optimisers/interface.py``); only the command layer, the registry
(by name, through its factories) and each optimiser itself may import one."""

COMMAND_LAYER = 5
"""``commands/``, ``report/``, ``cli``, ``launch``: what a user calls."""

TYPE_NAME = re.compile(r"^[A-Z][a-z0-9]+[A-Za-z0-9]*$")
"""A class or type alias name (CamelCase); a constant (``UPPER_CASE``) or function is not one."""

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
            # ``from megatron_energy import perseus`` imports the submodule: one edge per submodule named
            edges.extend(
                ImportEdge(importer, f"{name}.{alias.name}", node.lineno)
                for alias in node.names
                if is_submodule(f"{name}.{alias.name}", root)
            )
    return edges


def is_submodule(module: str, root: Path = PACKAGE_ROOT) -> bool:
    """Whether ``module`` names a module or package of the package under ``root``."""
    if not is_within(module, root.name):
        return False
    path = root.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


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


@pytest.mark.slow
def test_imports_only_run_down_the_layers() -> None:
    upward = [
        f"{edge} (layer {layer_of(edge.importer)} -> {layer_of(edge.imported)})"
        for edge in all_edges()
        if is_within(edge.imported, "megatron_energy") and layer_of(edge.imported) > layer_of(edge.importer)
    ]
    assert not upward, "imports that run up a layer:\n" + "\n".join(upward)


@pytest.mark.slow
def test_the_package_imports_nothing_from_the_test_tree() -> None:
    from_tests = [str(edge) for edge in all_edges() if is_within(edge.imported, "tests")]
    assert not from_tests, "\n".join(from_tests)


@pytest.mark.slow
@pytest.mark.parametrize("dependency", sorted(OWNERS))
def test_a_heavy_dependency_is_imported_by_its_owner_only(dependency: str) -> None:
    owners = OWNERS[dependency]
    strays = [
        str(edge)
        for edge in all_edges()
        if is_within(edge.imported, dependency) and not any(is_within(edge.importer, o) for o in owners)
    ]
    assert not strays, f"only {', '.join(owners)} may import {dependency}:\n" + "\n".join(strays)


@pytest.mark.slow
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


def import_cycles(edges: list[ImportEdge]) -> list[list[str]]:
    """Every cycle of package modules importing each other (module level or inside functions alike)."""
    graph = nx.DiGraph(
        (edge.importer, edge.imported) for edge in edges if is_within(edge.imported, "megatron_energy")
    )
    return [cycle for cycle in nx.simple_cycles(graph) if len(cycle) > 1]


@pytest.mark.slow
def test_no_import_cycle_in_the_package() -> None:
    cycles = import_cycles(all_edges())
    assert not cycles, "import cycles (break each by moving the shared type down):\n" + "\n".join(
        " -> ".join([*cycle, cycle[0]]) for cycle in cycles
    )


def test_the_cycle_checker_sees_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    root = tmp_path / "megatron_energy"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from megatron_energy import b\n")
    (root / "b.py").write_text("def late():\n    from megatron_energy.a import x\n")
    edges = [edge for path in sorted(root.rglob("*.py")) for edge in imports_of(path, root)]
    assert [set(cycle) for cycle in import_cycles(edges)] == [{"megatron_energy.a", "megatron_energy.b"}]


@pytest.mark.slow
def test_nothing_below_the_command_layer_imports_a_concrete_optimiser() -> None:
    strays = [
        str(edge)
        for edge in all_edges()
        if any(is_within(edge.imported, optimiser) for optimiser in CONCRETE_OPTIMISERS)
        and not any(is_within(edge.importer, optimiser) for optimiser in CONCRETE_OPTIMISERS)
        and layer_of(edge.importer) < COMMAND_LAYER
    ]
    assert not strays, (
        "below the command layer only the optimisers import each other (the runtime reaches them through "
        "optimiser.Optimiser and the registry; what it needs from a job lives in pipeline/):\n"
        + "\n".join(strays)
    )


@pytest.mark.slow
def test_each_concrete_optimiser_is_a_leaf() -> None:
    def owner(module: str) -> str | None:
        return next((name for name in CONCRETE_OPTIMISERS if is_within(module, name)), None)

    crossings = [
        str(edge)
        for edge in all_edges()
        if owner(edge.importer) is not None
        and owner(edge.imported) is not None
        and owner(edge.importer) != owner(edge.imported)
    ]
    assert not crossings, "an optimiser imports another (move what both need into pipeline/):\n" + "\n".join(
        crossings
    )


def test_no_two_modules_share_a_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in PACKAGE_ROOT.rglob("*.py"):
        if path.name != "__init__.py":
            by_name[path.stem].append(module_name(path))
    clashes = {name: sorted(modules) for name, modules in by_name.items() if len(modules) > 1}
    assert not clashes, f"module names used twice: {clashes}"


def type_definitions(path: Path) -> list[str]:
    """The class and type-alias names a module defines at its top level."""
    names = []
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.TypeAlias):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target if isinstance(node, ast.AnnAssign) else node.name]
            )
            names.extend(target.id for target in targets if isinstance(target, ast.Name))
    return [name for name in names if TYPE_NAME.match(name)]


@pytest.mark.slow
def test_a_type_is_defined_once() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in PACKAGE_ROOT.rglob("*.py"):
        for name in type_definitions(path):
            where[name].append(module_name(path))
    twice = {name: sorted(modules) for name, modules in where.items() if len(modules) > 1}
    assert not twice, f"types defined in more than one module (import the one definition): {twice}"
