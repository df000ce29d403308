"""Check, apply and revert the megatron-core patch set (``patches/megatron-core-X.Y/000N-*.patch``).

The patches are ``git format-patch`` files whose paths are relative to the *megatron root*: the folder
that contains ``megatron/`` (a Megatron-LM checkout, or the ``site-packages`` folder of an installed
megatron-core). They are applied with ``git apply``, which takes the exact context or nothing: never
fuzz, because a fuzzed hook lands in the wrong place silently. ``git apply --reverse --check`` tells an
already-patched tree apart. A patch set is pinned to one megatron-core minor version, read from the tree's
``megatron/core/package_info.py``; another version is refused with both versions named.

This module never imports megatron: it only reads and patches files.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from megatron_energy.errors import EnergyRuntimeError

PATCHED_SERIES = "0.19"
"""The megatron-core minor version the shipped patch set is written for."""

PACKAGE_INFO = Path("megatron") / "core" / "package_info.py"

PatchState = Literal["unpatched", "applied", "conflict"]


class PatchError(EnergyRuntimeError):
    """The patch set cannot be checked, applied or reverted here; the message says why and what to do."""


def installed_megatron_root() -> Path:
    """The folder containing ``megatron/`` of the megatron-core that Python would import (not imported).

    Raises:
        PatchError: megatron-core is not installed.
    """
    spec = importlib.util.find_spec("megatron.core")
    if spec is None or spec.origin is None:
        raise PatchError(
            "megatron-core is not installed here; pass --megatron-root DIR (the folder with megatron/)"
        )
    return Path(spec.origin).resolve().parents[2]


def patch_set_dir(series: str = PATCHED_SERIES) -> Path:
    """Where the patch set for ``series`` lives: the repository checkout first, then the installed data files.

    Raises:
        PatchError: Neither place has it.
    """
    name = f"megatron-core-{series}"
    candidates = [
        Path(__file__).resolve().parents[2] / "patches" / name,
        Path(sys.prefix) / "share" / "megatron_energy" / "patches" / name,
    ]
    for candidate in candidates:
        if sorted(candidate.glob("*.patch")):
            return candidate
    raise PatchError(
        f"no patch set {name} found in {' or '.join(map(str, candidates))}; reinstall megatron_energy"
    )


def tree_version(root: Path) -> str:
    """The megatron-core version of the tree at ``root``, read from ``megatron/core/package_info.py``.

    Raises:
        PatchError: ``root`` does not contain a megatron-core tree.
    """
    info = Path(root) / PACKAGE_INFO
    if not info.is_file():
        raise PatchError(
            f"{root} has no {PACKAGE_INFO}; --megatron-root must be the folder that contains megatron/ "
            "(a Megatron-LM checkout, or site-packages of an installed megatron-core)"
        )
    text = info.read_text(encoding="utf-8")
    parts = [re.search(rf"^{name}\s*=\s*(\d+)", text, re.MULTILINE) for name in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise PatchError(f"cannot read MAJOR/MINOR/PATCH from {info}")
    return ".".join(match.group(1) for match in parts if match)


@dataclass(frozen=True)
class PatchStatus:
    """Where each patch of the set stands on one tree.

    Attributes:
        root: The megatron root.
        version: The tree's megatron-core version.
        states: Each patch file and its state: applies cleanly, already applied, or neither.
        conflict_files: The tree's files (relative to the root) that the conflicting patches cannot patch.
    """

    root: Path
    version: str
    states: tuple[tuple[Path, PatchState], ...]
    conflict_files: tuple[str, ...] = ()

    def patches_in(self, state: PatchState) -> list[Path]:
        """The patches in ``state``, in set order."""
        return [patch for patch, patch_state in self.states if patch_state == state]

    @property
    def fully_applied(self) -> bool:
        """Every patch of the set is applied."""
        return all(state == "applied" for _, state in self.states)

    @property
    def nothing_applied(self) -> bool:
        """No patch of the set is applied (some may conflict)."""
        return not self.patches_in("applied")

    def describe(self) -> str:
        """One line per patch, for the command line."""
        return "\n".join(f"  {patch.name}: {state}" for patch, state in self.states)


def _git_apply(root: Path, patches: list[Path], *options: str) -> subprocess.CompletedProcess[str]:
    """Run ``git apply`` in ``root`` as a plain directory, even inside some other git repository.

    Inside a repository ``git apply`` takes paths relative to the repository top and silently skips paths
    outside the current directory; ``GIT_CEILING_DIRECTORIES`` stops the search for a repository above
    ``root`` (a Megatron-LM checkout whose top is ``root`` is still used as such).
    """
    git = shutil.which("git")
    if git is None:
        raise PatchError("git is needed to apply the patch set (it never fuzzes); install git")
    environment = dict(os.environ, GIT_CEILING_DIRECTORIES=str(Path(root).resolve().parent))
    return subprocess.run(
        [git, "apply", *options, *map(str, patches)],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )


def _require_series(root: Path, version: str, series: str) -> None:
    if version != series and not version.startswith(f"{series}."):
        raise PatchError(
            f"the megatron-core tree at {root} is version {version}, but the patch set is for {series}.x "
            f"(patches/megatron-core-{series}); install megatron-core {series}.x, or run through `python -m "
            "megatron_energy.launch`, which needs no patch"
        )


def check(root: Path, series: str = PATCHED_SERIES) -> PatchStatus:
    """Find out which patches apply cleanly to ``root`` and which are already applied.

    Args:
        root: The megatron root (folder containing ``megatron/``).
        series: The patch set's megatron-core minor version.

    Returns:
        The state of every patch.

    Raises:
        PatchError: The tree is missing, of another version, or git is unavailable.
    """
    root = Path(root)
    version = tree_version(root)
    _require_series(root, version, series)
    states: list[tuple[Path, PatchState]] = []
    conflict_files: set[str] = set()
    for patch in sorted(patch_set_dir(series).glob("*.patch")):
        forward = _git_apply(root, [patch], "--check")
        if forward.returncode == 0:
            states.append((patch, "unpatched"))
        elif _git_apply(root, [patch], "--check", "--reverse").returncode == 0:
            states.append((patch, "applied"))
        else:
            states.append((patch, "conflict"))
            conflict_files.update(_failed_files(forward.stderr) or [f"(a file of {patch.name})"])
    return PatchStatus(root, version, tuple(states), tuple(sorted(conflict_files)))


def _failed_files(git_stderr: str) -> list[str]:
    """The files ``git apply --check`` names in its errors (``error: [patch failed: ]PATH:...``)."""
    return re.findall(r"^error: (?:patch failed: )?([^:\n]+):", git_stderr, re.MULTILINE)


def _refuse_conflicts(status: PatchStatus, action: str) -> None:
    conflicts = status.patches_in("conflict")
    if conflicts:
        raise PatchError(
            f"cannot {action}, nothing was changed: {', '.join(p.name for p in conflicts)} neither applies "
            f"nor reverts cleanly on megatron-core {status.version} at {status.root}, because "
            f"{', '.join(status.conflict_files)} differ from the pinned release; restore those files "
            f"(reinstall megatron-core {status.version}, or `git checkout` them in a Megatron-LM checkout), "
            "then retry"
        )


def apply(root: Path, series: str = PATCHED_SERIES) -> PatchStatus:
    """Apply the patches of the set that are not applied yet, all or none.

    Raises:
        PatchError: A patch conflicts, or ``check`` fails.
    """
    status = check(root, series)
    _refuse_conflicts(status, "apply the patch set")
    pending = status.patches_in("unpatched")
    if pending:
        result = _git_apply(Path(root), pending)
        if result.returncode != 0:
            raise PatchError(f"git apply failed on {root}:\n{result.stderr.strip()}")
    return check(root, series)


def revert(root: Path, series: str = PATCHED_SERIES) -> PatchStatus:
    """Take the applied patches of the set back out, all or none.

    Raises:
        PatchError: A patch conflicts, or ``check`` fails.
    """
    status = check(root, series)
    _refuse_conflicts(status, "revert the patch set")
    applied = status.patches_in("applied")
    if applied:
        result = _git_apply(Path(root), list(reversed(applied)), "--reverse")
        if result.returncode != 0:
            raise PatchError(f"git apply --reverse failed on {root}:\n{result.stderr.strip()}")
    return check(root, series)
