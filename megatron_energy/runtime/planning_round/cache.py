"""Profiles and plans under ``--energy-dir``, keyed by a fingerprint of the job; atomic and verified.

The folder of a job is ``<dir>/<fingerprint>`` (its files are named in ``megatron_energy.energy_dir``), and
``<dir>/last_job.json`` records the job that ran most recently (stored or loaded), so that a miss can say
what changed and ``megatron-energy report`` finds that job.

:meth:`JobCache.store` writes every artefact atomically under the folder's exclusive lock, then the manifest
(checksum and size per artefact, the job fingerprint). :meth:`JobCache.load` reads under a shared lock and
verifies everything; a folder that fails is moved aside (never deleted) and the load is a miss that says so,
unless only what planning made from the profile failed (a corrupt ``plan.json``): then those files alone move
aside and the plan is rebuilt from the verified profile, without profiling again;
:meth:`JobCache.set_aside` does the same for a verified folder whose content the caller cannot use.
Jobs sharing an ``--energy-dir`` therefore never see a partial set of files.

The job facts (``energy_dir.JobFacts``) hold the planning inputs apart (``JobFacts.planning``: mode, target,
switch latency, phase switching, GPU spec), so they are part of the fingerprint. A job whose folder is empty
but whose profile facts match a cached run with other planning inputs is re-planned from that run's verified
artefacts (the ``replan`` a cache is given, ``runtime.planning_round.replanning.Replanner``) and stored in its
own folder: the line says which input changed, and nothing is profiled again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_energy.atomic import folder_lock, write_atomically
from megatron_energy.energy_dir import (
    JOB_RECORD,
    LAST_JOB,
    MANIFEST,
    PLAN,
    PLANNED_ARTEFACTS,
    PROFILE,
    PROFILE_ARTEFACTS,
    REQUIRED_ARTEFACTS,
    JobFacts,
    JobRecord,
)
from megatron_energy.errors import TargetUnreachableError
from megatron_energy.plan import SCHEMA_VERSION
from megatron_energy.plan_file import stale_plan_version
from megatron_energy.runtime.planning_round.cache_manifest import (
    CacheVerificationError,
    failed_artefacts,
    has_cached_files,
    is_artefact_name,
    manifest_for,
    quarantine,
    quarantine_artefacts,
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

    unreachable: str | None = None
    """Why this job's target cannot be met, found by planning again from the profile its folder holds
    (``errors.TargetUnreachableError``): profiling again would end the same way. None otherwise."""


class JobCache:
    """The cache folder of one job.

    Args:
        root: The ``--energy-dir``.
        facts: The job facts (``JobContext.job_facts``, with the session's grid, planning inputs and clock
            control).
        replan: Given another run's verified artefacts and this job's fingerprint, this job's artefacts
            planned from them; ``None``: a job with an empty folder profiles.
    """

    def __init__(
        self,
        root: Path,
        facts: JobFacts,
        replan: Callable[[Mapping[str, bytes], str], Mapping[str, bytes | str]] | None = None,
    ) -> None:
        self.root = Path(root)
        self.facts = facts
        self.parts = facts.to_parts()
        self.replan = replan
        self.full_fingerprint = facts.full_fingerprint
        self.fingerprint = facts.fingerprint
        self.folder = self.root / self.fingerprint

    @property
    def profile_path(self) -> Path:
        """The cached profile CSV."""
        return self.folder / PROFILE

    @property
    def plan_path(self) -> Path:
        """The cached plan JSON."""
        return self.folder / PLAN

    def store(self, artefacts: Mapping[str, bytes | str]) -> None:
        """Write this job's artefacts, each atomically, then their manifest, all under an exclusive lock.

        ``job.json`` (the job facts) is added when not given, and ``<dir>/last_job.json`` is updated, so a
        later miss can say what changed. Loads running at the same time see the old set or the new one.

        Args:
            artefacts: File name -> content (text is stored as UTF-8), e.g. ``profile.csv``,
                ``baseline.json``, ``plan.json``, ``frontier.csv``.

        Raises:
            ValueError: A name is not a plain file name (or is the manifest's, or hidden).
            OSError: The folder cannot be written; a load then fails verification and re-profiles.
        """
        bad = [name for name in artefacts if not is_artefact_name(name)]
        if bad:
            raise ValueError(
                f"artefact names {bad} are not plain file names; use names like {PROFILE} or {PLAN}"
            )
        record = self._job_record()
        contents = {name: _bytes(content) for name, content in artefacts.items()}
        contents.setdefault(JOB_RECORD, record.encode("utf-8"))
        with folder_lock(self.folder, "exclusive"):
            for name, content in contents.items():
                write_atomically(self.folder / name, content)
            write_atomically(self.folder / MANIFEST, manifest_for(contents, self.full_fingerprint))
        write_atomically(self.root / LAST_JOB, record)

    def load(self, required: tuple[str, ...] = REQUIRED_ARTEFACTS) -> CacheLoad:
        """Read and verify this job's cached artefacts; move a folder that fails verification aside.

        Verification: the manifest parses, belongs to this job, lists ``required``; every file it lists is
        there with its size and checksum, and ``.json`` files parse. On a failure every file of the folder
        moves into ``<folder>/quarantine-<UTC time>-<pid>/`` (never deleted) and the load is a miss whose
        message names the failure and the quarantine folder.

        A job whose folder is empty is re-planned from a cached run of it with other planning inputs, when
        there is one (see the module docstring). A hit (re-planned or not), or a cached profile whose target
        is out of reach (``CacheLoad.unreachable``), makes this job the most recent one
        (``<dir>/last_job.json``), so the summary and ``megatron-energy report`` describe the job that runs.

        Args:
            required: Artefacts the caller needs to skip profiling.

        Returns:
            A hit with the verified contents, or a miss explaining itself.
        """
        if not has_cached_files(self.folder):
            return self._replanned(required) or CacheLoad(self.folder, False, self._explain_miss())
        if self._holds_profile_only(required):
            return self._replanned_from_own_profile(required)
        loaded = self._verified(required)
        if loaded.hit:
            self._record_as_last()
        return loaded

    def _record_as_last(self) -> None:
        """Make this job the most recent one (``<dir>/last_job.json``); a read-only record costs only that."""
        with contextlib.suppress(OSError):  # the report then loses its default, not the run its cache
            write_atomically(self.root / LAST_JOB, self._job_record())

    def _verified(self, required: tuple[str, ...], rebuild_plan: bool = True) -> CacheLoad:
        """Read and verify the artefacts of a folder that holds some (see :meth:`load`).

        Where only what planning made (``PLANNED_ARTEFACTS``) fails and ``rebuild_plan``, those files alone
        move aside and the plan is rebuilt from the verified profile (:meth:`_plan_rebuilt`).
        """
        with folder_lock(self.folder, "shared"):
            try:
                contents: Mapping[str, bytes] | None = read_verified(
                    self.folder, self.full_fingerprint, required
                )
            except CacheVerificationError:
                contents = None
        if contents is not None:
            return self._hit(contents)
        with folder_lock(self.folder, "exclusive"):  # a store may have repaired it since the shared lock
            try:
                contents = read_verified(self.folder, self.full_fingerprint, required)
            except CacheVerificationError as failure:
                failed = self._failed_planned_artefacts() if rebuild_plan else {}
                if not failed:
                    aside = quarantine(self.folder)
                    message = (
                        f"energy cache at {self.folder} failed verification: {failure}; moved its files to "
                        f"{aside} (kept for inspection, delete when done); profiling again"
                    )
                    return CacheLoad(self.folder, False, message, quarantined=aside)
                aside = quarantine_artefacts(self.folder, tuple(failed), self.full_fingerprint)
        if contents is None:
            return self._plan_rebuilt(required, failed, aside)
        return self._hit(contents)

    def _failed_planned_artefacts(self) -> dict[str, str]:
        """Why each failing artefact failed, where all are ``PLANNED_ARTEFACTS`` and a replan is given.

        Empty otherwise (the manifest, the profile or its inputs failed: the folder moves aside whole).
        """
        if self.replan is None:
            return {}
        try:
            failed = failed_artefacts(self.folder, self.full_fingerprint)
        except CacheVerificationError:
            return {}
        return failed if set(failed) <= set(PLANNED_ARTEFACTS) else {}

    def _plan_rebuilt(self, required: tuple[str, ...], failed: Mapping[str, str], aside: Path) -> CacheLoad:
        """The plan made again from the profile the folder keeps, once ``failed`` moved to ``aside``."""
        rebuilt = self._replanned_from_own_profile(required)
        outcome = (
            "rebuilt the plan from the verified profile, without profiling again"
            if rebuilt.hit
            else rebuilt.message
        )
        message = (
            f"energy cache at {self.folder} failed verification: {'; '.join(failed.values())}; moved "
            f"{', '.join(failed)} to {aside} (kept for inspection, delete when done); {outcome}"
        )
        return dataclasses.replace(rebuilt, message=message, quarantined=aside)

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

    def _holds_profile_only(self, required: tuple[str, ...]) -> bool:
        """Whether the folder holds a profile and no plan, as a run whose target was unmet leaves it."""
        names = {path.name for path in self.folder.iterdir()}
        return PLAN in required and PLAN not in names and set(PROFILE_ARTEFACTS) <= names

    def _replanned_from_own_profile(self, required: tuple[str, ...]) -> CacheLoad:
        """This job planned again from the profile its folder holds without a plan (its target was unmet)."""
        own = self._verified(PROFILE_ARTEFACTS)
        if not own.hit:
            return own
        if self.replan is None:
            return CacheLoad(self.folder, False, self._explain_miss())
        try:
            self.store(self.replan(own.artefacts, self.fingerprint))
            stored = self._verified(required, rebuild_plan=False)
        except TargetUnreachableError as problem:  # the same profile and target: profiling would end alike
            self._record_as_last()  # the job that runs is this one, on its cached profile
            return CacheLoad(
                self.folder,
                False,
                f"energy cache at {self.folder} holds this job's profile but no plan; planning from it found "
                "the target out of reach again, so the job is not profiled again",
                unreachable=str(problem),
            )
        except Exception as problem:  # the profile could not be planned from: profile again
            return CacheLoad(
                self.folder,
                False,
                f"energy cache at {self.folder} holds this job's profile but no plan; planning from it "
                f"failed again ({problem}); profiling again",
            )
        if stored.hit:
            return dataclasses.replace(
                stored, message=f"energy cache: planned from the profile cached in {self.folder}"
            )
        return stored

    def _replanned(self, required: tuple[str, ...]) -> CacheLoad | None:
        """This job planned and stored from a cached run with other planning inputs; ``None`` without one.

        A re-plan that fails is a miss that says why (the job then profiles).
        """
        if self.replan is None or (found := self._planning_sibling()) is None:
            return None
        facts, sibling = found
        changed = "; ".join(describe_changes(_planning_of(facts), _planning_of(self.facts)))
        try:
            self.store(self.replan(sibling.artefacts, self.fingerprint))
            stored = self._verified(required, rebuild_plan=False)
        except Exception as problem:  # any failure means: profile again
            return CacheLoad(
                self.folder,
                False,
                f"energy cache miss: planning inputs changed since {sibling.folder} ({changed}); cannot "
                f"re-plan from its profile ({problem}); profiling again",
            )
        if not stored.hit:
            return stored
        message = (
            f"energy cache: planning inputs changed since {sibling.folder} ({changed}); re-planned from its "
            f"verified profile without profiling again, stored in {self.folder}"
        )
        return CacheLoad(self.folder, True, message, stored.artefacts)

    def _planning_sibling(self) -> tuple[JobFacts, CacheLoad] | None:
        """The most recent verified run of this job, profiled alike, with other planning inputs."""
        mine = _canonical(self.facts.profile_facts().to_parts())
        candidates = []
        for path in self.root.glob(f"*/{JOB_RECORD}"):
            if path.parent == self.folder:
                continue
            try:
                facts = JobRecord.read(path).facts
                written_s = path.stat().st_mtime
            except (OSError, ValueError):
                continue  # not a job record (or removed meanwhile): no run to re-plan from
            if _canonical(facts.profile_facts().to_parts()) == mine:
                candidates.append((written_s, facts))
        for _, facts in sorted(candidates, key=lambda candidate: candidate[0], reverse=True):
            sibling = JobCache(self.root, facts)._verified(PROFILE_ARTEFACTS)
            if sibling.hit:
                return facts, sibling
        return None

    def _hit(self, contents: Mapping[str, bytes]) -> CacheLoad:
        """Verified contents; a miss when their plan was written by another schema version (profile again)."""
        plan = contents.get(PLAN)
        version = None if plan is None else stale_plan_version(plan.decode("utf-8"))
        if version is not None:
            return CacheLoad(
                self.folder,
                False,
                f"energy cache at {self.folder} holds a schema-version-{version} plan, which this "
                f"megatron_energy does not read (it writes version {SCHEMA_VERSION}): profiling again",
            )
        return CacheLoad(self.folder, True, f"energy cache hit: reusing verified {self.folder}", contents)

    def _job_record(self) -> str:
        return JobRecord.of(self.facts).to_json()

    def _explain_miss(self) -> str:
        """A first run for this job, or what changed since the most recent job in this ``--energy-dir``."""
        try:
            previous: JobRecord | None = JobRecord.read(self.root / LAST_JOB)
        except (OSError, ValueError):
            previous = None
        if previous is not None and previous.fingerprint != self.fingerprint:
            changes = describe_changes(_as_read_back(previous.facts.to_parts()), _as_read_back(self.parts))
            return (
                "energy cache miss, profiling again: the job changed since the cached one ("
                + "; ".join(changes or ["unknown change"])
                + ")"
            )
        return "energy cache empty for this job: profiling"


def _planning_of(facts: JobFacts) -> dict[str, Any]:
    """The planning inputs among the job facts, as read back from JSON, under the record's key."""
    return _as_read_back({"planning": {} if facts.planning is None else facts.planning.to_parts()})


def _as_read_back(facts: Mapping[str, Any]) -> dict[str, Any]:
    """Facts as a job record holds them once read back (tuples as lists), so only real changes differ."""
    result: dict[str, Any] = json.loads(_canonical(facts))
    return result


def _canonical(facts: Mapping[str, Any]) -> str:
    """Facts as canonical JSON, so facts read back from a file compare equal to the ones in memory."""
    return json.dumps(facts, sort_keys=True, default=str)


def _bytes(content: bytes | str) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content
