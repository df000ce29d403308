"""Profiles and plans saved under ``--energy-dir``, keyed by a fingerprint of the job.

Layout: ``<dir>/<fingerprint>/{job.json,profile.csv,plan.json,frontier.csv,baseline.json}`` plus
``<dir>/last_job.json``, the facts of the most recent job, so that a miss can say what changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_energy.atomic import write_atomically
from megatron_energy.plan import fingerprint

FINGERPRINT_DIGITS = 16
"""Hex digits of the job fingerprint kept in folder names."""


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


@dataclass(frozen=True)
class CacheLookup:
    """Where a job's cached files live and why the cache did or did not hit."""

    folder: Path
    """``<energy dir>/<fingerprint>``."""

    hit: bool
    """Whether a profile for exactly this job is there."""

    message: str
    """One line for the log: a hit, a first run, or what changed since the cached job."""


class JobCache:
    """The cache folder of one job.

    Args:
        root: The ``--energy-dir``.
        parts: The job facts (``JobContext.fingerprint_parts``).
    """

    def __init__(self, root: Path, parts: Mapping[str, Any]) -> None:
        self.root = Path(root)
        self.parts = dict(parts)
        self.fingerprint = fingerprint(**self.parts)[:FINGERPRINT_DIGITS]
        self.folder = self.root / self.fingerprint

    @property
    def profile_path(self) -> Path:
        """The cached profile CSV."""
        return self.folder / "profile.csv"

    @property
    def plan_path(self) -> Path:
        """The cached plan JSON."""
        return self.folder / "plan.json"

    @property
    def frontier_path(self) -> Path:
        """The cached frontier (time, energy per point; for plots and reports)."""
        return self.folder / "frontier.csv"

    def write(self, name: str, text: str) -> None:
        """Write one artefact of this job's folder atomically."""
        write_atomically(self.folder / name, text)

    def lookup(self) -> CacheLookup:
        """Check for a cached profile of this job, and explain a miss."""
        if self.profile_path.exists():
            return CacheLookup(self.folder, True, f"energy cache hit: reusing {self.profile_path}")
        last = self.root / "last_job.json"
        if last.exists():
            try:
                previous = json.loads(last.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                previous = None
            if isinstance(previous, dict) and previous.get("fingerprint") != self.fingerprint:
                changes = describe_changes(previous.get("parts", {}), self.parts)
                return CacheLookup(
                    self.folder,
                    False,
                    "energy cache miss, profiling again: the job changed since the cached one ("
                    + "; ".join(changes or ["unknown change"])
                    + ")",
                )
        return CacheLookup(self.folder, False, "energy cache empty for this job: profiling")

    def remember(self) -> None:
        """Record this job as the most recent one (and its facts in its folder)."""
        record = json.dumps({"fingerprint": self.fingerprint, "parts": self.parts}, indent=2, default=str)
        write_atomically(self.folder / "job.json", record)
        write_atomically(self.root / "last_job.json", record)
