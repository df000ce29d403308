"""Profiles and plans under ``--energy-dir``, keyed by a fingerprint of the job; atomic and verified.

Layout: ``<dir>/<fingerprint>/{job.json,profile.csv,plan.json,frontier.csv,baseline.json,manifest.json}``
plus ``<dir>/last_job.json``, the facts of the most recent job, so that a miss can say what changed.

:meth:`JobCache.store` writes every artefact atomically under the folder's exclusive lock, then the manifest
(checksum and size per artefact, the job fingerprint). :meth:`JobCache.load` reads under a shared lock and
verifies everything; a folder that fails is moved aside (never deleted) and the load is a miss that says so;
:meth:`JobCache.set_aside` does the same for a verified folder whose content the caller cannot use.
Jobs sharing an ``--energy-dir`` therefore never see a partial set of files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_energy.atomic import folder_lock, write_atomically
from megatron_energy.plan import FINGERPRINT_DIGITS, fingerprint
from megatron_energy.runtime.cache_manifest import (
    MANIFEST_NAME,
    CacheVerificationError,
    has_cached_files,
    is_artefact_name,
    manifest_for,
    quarantine,
    read_verified,
)


def describe_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """List the job facts that differ, as ``name: old -> new``, nested keys dotted.

    Args:
        old: The facts the cache was written for.
        new: The facts of this run.

    Returns:
        One line per changed fact, sorted.
    """
    changes = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            changes += [f"{key}.{line}" for line in describe_changes(before, after)]
        elif before != after:
            changes.append(f"{key}: {before!r} -> {after!r}")
    return changes


JOB_RECORD = "job.json"
REQUIRED_ARTEFACTS: tuple[str, ...] = ("plan.json", "baseline.json", "profile.csv")
"""What a cached job must hold to skip profiling and planning: the plan that runs, the stock baseline it is
measured against, and the profile it was planned from (for reports)."""


@dataclass(frozen=True)
class CacheLoad:
    """What :meth:`JobCache.load` found: verified artefacts, or a miss that says why."""

    folder: Path
    """``<energy dir>/<fingerprint>``."""

    hit: bool
    """Whether every artefact of this job's folder passed verification."""

    message: str
    """One line for the log: a hit, a first run, what changed, or what failed and where it was moved."""

    artefacts: Mapping[str, bytes] = field(default_factory=dict)
    """On a hit, file name -> verified content (read under the lock; use these, not the files)."""

    quarantined: Path | None = None
    """Where a folder that failed verification was moved; None otherwise."""


class JobCache:
    """The cache folder of one job.

    Args:
        root: The ``--energy-dir``.
        parts: The job facts (``JobContext.fingerprint_parts``).
    """

    def __init__(self, root: Path, parts: Mapping[str, Any]) -> None:
        self.root = Path(root)
        self.parts = dict(parts)
        self.full_fingerprint = fingerprint(**self.parts)
        self.fingerprint = self.full_fingerprint[:FINGERPRINT_DIGITS]
        self.folder = self.root / self.fingerprint

    @property
    def profile_path(self) -> Path:
        """The cached profile CSV."""
        return self.folder / "profile.csv"

    @property
    def plan_path(self) -> Path:
        """The cached plan JSON."""
        return self.folder / "plan.json"

    def store(self, artefacts: Mapping[str, bytes | str]) -> None:
        """Write this job's artefacts, each atomically, then their manifest, all under an exclusive lock.

        ``job.json`` (the job facts) is added when not given, and ``<dir>/last_job.json`` is updated, so a
        later miss can say what changed. Loads running at the same time see the old set or the new one.

        Args:
            artefacts: File name -> content (text is stored as UTF-8), e.g. ``profile.csv``,
                ``baseline.json``, ``plan.json``, ``frontier.csv``.

        Raises:
            ValueError: A name is not a plain file name (or is ``manifest.json``, or hidden).
            OSError: The folder cannot be written; a load then fails verification and re-profiles.
        """
        bad = [name for name in artefacts if not is_artefact_name(name)]
        if bad:
            raise ValueError(
                f"artefact names {bad} are not plain file names; use names like profile.csv or plan.json"
            )
        record = self._job_record()
        contents = {name: _bytes(content) for name, content in artefacts.items()}
        contents.setdefault(JOB_RECORD, record.encode("utf-8"))
        with folder_lock(self.folder, "exclusive"):
            for name, content in contents.items():
                write_atomically(self.folder / name, content)
            write_atomically(self.folder / MANIFEST_NAME, manifest_for(contents, self.full_fingerprint))
        write_atomically(self.root / "last_job.json", record)

    def load(self, required: tuple[str, ...] = REQUIRED_ARTEFACTS) -> CacheLoad:
        """Read and verify this job's cached artefacts; move a folder that fails verification aside.

        Verification: the manifest parses, belongs to this job, lists ``required``; every file it lists is
        there with its size and checksum, and ``.json`` files parse. On a failure every file of the folder
        moves into ``<folder>/quarantine-<UTC time>-<pid>/`` (never deleted) and the load is a miss whose
        message names the failure and the quarantine folder.

        Args:
            required: Artefacts the caller needs to skip profiling.

        Returns:
            A hit with the verified contents, or a miss explaining itself.
        """
        if not has_cached_files(self.folder):
            return CacheLoad(self.folder, False, self._explain_miss())
        with folder_lock(self.folder, "shared"):
            try:
                contents = read_verified(self.folder, self.full_fingerprint, required)
            except CacheVerificationError:
                contents = None
        if contents is not None:
            return self._hit(contents)
        with folder_lock(self.folder, "exclusive"):  # a store may have repaired it since the shared lock
            try:
                contents = read_verified(self.folder, self.full_fingerprint, required)
            except CacheVerificationError as failure:
                aside = quarantine(self.folder)
                message = (
                    f"energy cache at {self.folder} failed verification: {failure}; moved its files to "
                    f"{aside} (kept for inspection, delete when done); profiling again"
                )
                return CacheLoad(self.folder, False, message, quarantined=aside)
        return self._hit(contents)

    def set_aside(self) -> Path | None:
        """Move this job's cached files aside although they verified: they cannot be used (never deleted).

        For artefacts that pass the manifest's checks but not the reader's: a re-signed plan of another
        job, a baseline that is not one, a plan some rank cannot run.

        Returns:
            The new quarantine folder, or None when the folder held no cached file (nothing was moved).

        Raises:
            OSError: The files cannot be moved.
        """
        with folder_lock(self.folder, "exclusive"):
            if not has_cached_files(self.folder):
                return None
            return quarantine(self.folder)

    def _hit(self, contents: Mapping[str, bytes]) -> CacheLoad:
        return CacheLoad(self.folder, True, f"energy cache hit: reusing verified {self.folder}", contents)

    def _job_record(self) -> str:
        return json.dumps({"fingerprint": self.fingerprint, "parts": self.parts}, indent=2, default=str)

    def _explain_miss(self) -> str:
        """A first run for this job, or what changed since the most recent job in this ``--energy-dir``."""
        last = self.root / "last_job.json"
        try:
            previous = json.loads(last.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            previous = None
        if isinstance(previous, dict) and previous.get("fingerprint") != self.fingerprint:
            changes = describe_changes(previous.get("parts", {}), self.parts)
            return (
                "energy cache miss, profiling again: the job changed since the cached one ("
                + "; ".join(changes or ["unknown change"])
                + ")"
            )
        return "energy cache empty for this job: profiling"


def _bytes(content: bytes | str) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content
