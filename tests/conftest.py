"""Shared fixtures: copies of the installed megatron-core tree, patched or not; a private clock-lease folder;
the session's one run of ``megatron-energy demo``. The suite's tiers (``--fast``) are the ``tiers`` plugin.

The installed tree itself is never modified, and no test writes clock leases into the machine's run folder.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from log_lines import release_lines

from megatron_energy.dvfs.lease import RUN_DIR_ENV
from megatron_energy.dvfs.spec import SPEC_DIRS_ENV
from megatron_energy.megatron import patching

if TYPE_CHECKING:  # imported where used: pytest-xdist's controller loads this file and runs no test
    from demo_run import DemoRun

pytest_plugins = ("pytester", "tiers")  # pytester: the tiers' own tests

PATCHED_FILES = (
    "megatron/core/pipeline_parallel/schedules.py",
    "megatron/core/pipeline_parallel/p2p_communication.py",
    "megatron/training/arguments.py",
    "megatron/training/training.py",
    str(patching.PACKAGE_INFO),
)


@pytest.fixture(scope="session", autouse=True)
def private_lease_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Clock leases of all tests (and of the processes they start) go to a private folder, not the machine's.

    Session-scoped, so module- and session-scoped fixtures that run jobs are covered too.
    """
    folder = tmp_path_factory.mktemp("leases")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RUN_DIR_ENV, str(folder))
        yield folder


@pytest.fixture(autouse=True)
def spec_folders_of_this_test_only() -> Iterator[None]:
    """Specs a test loads by path are found by name in that test (and its processes) only."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(SPEC_DIRS_ENV, raising=False)
        yield


@pytest.fixture(autouse=True)
def log_lines_of_this_test_only() -> Iterator[None]:
    """Lines captured from ``megatron_energy``'s log (``log_lines.capture_lines``) stop at the test's end."""
    yield
    release_lines()


@pytest.fixture(scope="session")
def patched_megatron_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A full copy of the installed megatron package with the patch set applied; importable from its root."""
    root = tmp_path_factory.mktemp("patched-megatron")
    # copy2 keeps mtimes, so the copied __pycache__ stays valid for every file the patches leave alone
    shutil.copytree(patching.installed_megatron_root() / "megatron", root / "megatron")
    patching.apply(root)
    return root


@pytest.fixture
def megatron_files_copy(tmp_path: Path) -> Callable[[], Path]:
    """Make a minimal unpatched megatron root: only the files the patch set touches, plus the version file."""

    def make() -> Path:
        root = tmp_path / f"megatron-root-{len(list(tmp_path.iterdir()))}"
        for relative in PATCHED_FILES:
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(patching.installed_megatron_root() / relative, target)
        return root

    return make


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The session's one ``megatron-energy demo`` run (``demo_run``), for the tests reading its output."""
    from demo_run import run_demo

    return run_demo(tmp_path_factory.mktemp("demo") / "energy")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the test files that spawn worlds (marked ``world``) first, the order within a file kept.

    Under ``pytest -n 2 --no-loadscope-reorder`` (``scripts/test.sh``) the workers take the files in this
    order, so the quick ones fill the other worker's time at the end.
    """
    worlds = {item.path for item in items if item.get_closest_marker("world")}
    items.sort(key=lambda item: item.path not in worlds)  # stable


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist: a file per worker, the demo's readers together (``file_scheduling``)."""
    from file_scheduling import FileScheduling

    return FileScheduling(config, log)
