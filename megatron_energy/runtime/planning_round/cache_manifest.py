"""The manifest of a job's cache folder, its verification, and moving a failed folder's files aside.

``manifest.json`` lists every artefact of one store with its SHA-256 and size, and the full job fingerprint.
It is written last, so a folder whose store was interrupted fails verification instead of passing with
stale or partial files. A folder that fails is never deleted: :func:`quarantine` moves its files into
``quarantine-<UTC timestamp>-<pid>/`` inside it, kept for inspection; :func:`quarantine_artefacts` moves
only some (the ones that failed) and leaves the rest listed in a rewritten manifest. The manifest is read and
written through :class:`CacheManifest` (pydantic), the checks on its fields.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Final, Literal

from annotated_types import Ge
from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints, ValidationError

from megatron_energy.atomic import LOCK_FILE_NAME, write_atomically
from megatron_energy.energy_dir import MANIFEST, QUARANTINE_PREFIX, is_run_file
from megatron_energy.errors import EnergyError

MANIFEST_SCHEMA_VERSION: Final = 1


class CacheVerificationError(EnergyError):
    """A cache folder failed verification; the message says what failed, in a few words."""


def _artefact_name(name: str) -> str:
    if not is_artefact_name(name):
        raise ValueError(f"{name!r} is not a plain file name of an artefact")
    return name


class ArtefactEntry(BaseModel):
    """One artefact of a store: its checksum and size."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    """SHA-256 of its content (hex)."""
    size_bytes: Annotated[int, Ge(0)]
    """Its size."""


class CacheManifest(BaseModel):
    """``manifest.json``: every artefact of one store, and the job they belong to."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    schema_version: Literal[1]
    """Layout version (:data:`MANIFEST_SCHEMA_VERSION`)."""
    fingerprint: str
    """The full fingerprint of the job the artefacts belong to."""
    artefacts: dict[Annotated[str, AfterValidator(_artefact_name)], ArtefactEntry]
    """File name -> entry, by name."""


def manifest_for(artefacts: Mapping[str, bytes], job_fingerprint: str) -> bytes:
    """The manifest of ``artefacts``: per name its SHA-256 and size, plus the job fingerprint.

    Args:
        artefacts: File name -> content, as written into the folder.
        job_fingerprint: The full fingerprint of the job the artefacts belong to.

    Returns:
        The manifest as UTF-8 JSON.
    """
    entries = {
        name: ArtefactEntry(sha256=hashlib.sha256(content).hexdigest(), size_bytes=len(content))
        for name, content in sorted(artefacts.items())
    }
    return _manifest_bytes(entries, job_fingerprint)


def _manifest_bytes(entries: Mapping[str, ArtefactEntry], job_fingerprint: str) -> bytes:
    """The manifest listing ``entries`` of job ``job_fingerprint``, as UTF-8 JSON."""
    manifest = CacheManifest(
        schema_version=MANIFEST_SCHEMA_VERSION, fingerprint=job_fingerprint, artefacts=dict(entries)
    )
    return json.dumps(manifest.model_dump(), indent=2).encode("utf-8")


def read_verified(folder: Path, job_fingerprint: str, required: tuple[str, ...]) -> dict[str, bytes]:
    """Read and verify every artefact the manifest of ``folder`` lists.

    Args:
        folder: The job's cache folder.
        job_fingerprint: The full fingerprint of this job; a manifest of another job fails.
        required: Artefacts that must be listed (a set stored without them is of no use).

    Returns:
        File name -> verified content.

    Raises:
        CacheVerificationError: The manifest is missing, unparsable or foreign, a required artefact is not
            listed, or a listed file is missing, of the wrong size, has another checksum, or (``.json``) does
            not parse.
    """
    entries = _manifest_entries(folder, job_fingerprint)
    unlisted = [name for name in required if name not in entries]
    if unlisted:
        raise CacheVerificationError(f"the manifest lists no {', '.join(unlisted)}")
    contents, failures = _verify_entries(folder, entries)
    if failures:
        raise CacheVerificationError(next(iter(failures.values())))
    return contents


def failed_artefacts(folder: Path, job_fingerprint: str) -> dict[str, str]:
    """Every artefact of ``folder`` that fails verification, with why (see :func:`read_verified`).

    Raises:
        CacheVerificationError: The manifest itself is missing, unparsable, foreign or malformed.
    """
    return _verify_entries(folder, _manifest_entries(folder, job_fingerprint))[1]


def _verify_entries(
    folder: Path, entries: Mapping[str, ArtefactEntry]
) -> tuple[dict[str, bytes], dict[str, str]]:
    """The verified contents of the listed artefacts, and why each other one failed, by name."""
    contents: dict[str, bytes] = {}
    failures: dict[str, str] = {}
    for name, entry in entries.items():
        try:
            content = (folder / name).read_bytes()
        except FileNotFoundError:
            failures[name] = f"{name} is missing"
            continue
        if len(content) != entry.size_bytes:
            failures[name] = (
                f"{name} has {len(content)} bytes, the manifest says {entry.size_bytes} (truncated or grown)"
            )
        elif hashlib.sha256(content).hexdigest() != entry.sha256:
            failures[name] = f"{name} does not match its checksum (changed after it was written)"
        elif name.endswith(".json") and (problem := _json_problem(content)) is not None:
            failures[name] = f"{name} is not valid JSON ({problem})"
        else:
            contents[name] = content
    return contents, failures


def _json_problem(content: bytes) -> str | None:
    try:
        json.loads(content)
    except ValueError as error:
        return str(error)
    return None


def _manifest_entries(folder: Path, job_fingerprint: str) -> dict[str, ArtefactEntry]:
    try:
        text = (folder / MANIFEST).read_bytes()
        manifest = json.loads(text)
    except FileNotFoundError:
        raise CacheVerificationError(
            f"{MANIFEST} is missing (written by an older version, or the store was interrupted)"
        ) from None
    except ValueError as error:
        raise CacheVerificationError(f"{MANIFEST} is not valid JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("schema_version") != MANIFEST_SCHEMA_VERSION:
        raise CacheVerificationError(f"{MANIFEST} is not a version-{MANIFEST_SCHEMA_VERSION} manifest")
    if manifest.get("fingerprint") != job_fingerprint:
        raise CacheVerificationError(
            f"{MANIFEST} belongs to another job (fingerprint {manifest.get('fingerprint')!r})"
        )
    try:
        return CacheManifest.model_validate_json(text).artefacts
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise CacheVerificationError(
            f"{MANIFEST} has malformed artefact entries ({where}: {first['msg']})"
        ) from None


def is_artefact_name(name: str) -> bool:
    """Whether ``name`` may name an artefact: a plain file name, not hidden, not the manifest."""
    return bool(name) and name == Path(name).name and not name.startswith(".") and name != MANIFEST


def has_cached_files(folder: Path) -> bool:
    """Whether ``folder`` holds any file a store wrote (then a failed verification means corruption).

    A file a run writes beside the cached set (``energy_dir.is_run_file``: a rank's partial profile or power
    trace) is no store's: it neither counts nor moves.
    """
    return bool(_movable_files(folder))


def quarantine(folder: Path) -> Path:
    """Move every file of ``folder`` (not the lock file, not earlier quarantines) into a new subfolder.

    Args:
        folder: The job's cache folder; the caller holds its exclusive lock.

    Returns:
        The new ``quarantine-<UTC timestamp>-<pid>`` folder.
    """
    aside = _new_quarantine(folder)
    for path in _movable_files(folder):
        path.rename(aside / path.name)
    return aside


def quarantine_artefacts(folder: Path, names: tuple[str, ...], job_fingerprint: str) -> Path:
    """Move the artefacts ``names`` of ``folder`` into a new quarantine folder; the manifest lists the rest.

    Args:
        folder: The job's cache folder, whose manifest verifies (:func:`failed_artefacts`); the caller holds
            its exclusive lock.
        names: The artefacts to set aside (a missing one is only taken off the manifest).
        job_fingerprint: The full fingerprint of the job the folder belongs to.

    Returns:
        The new ``quarantine-<UTC timestamp>-<pid>`` folder, holding the moved files.
    """
    entries = _manifest_entries(folder, job_fingerprint)
    aside = _new_quarantine(folder)
    for name in names:
        if (folder / name).is_file():
            (folder / name).rename(aside / name)
    kept = {name: entry for name, entry in entries.items() if name not in names}
    write_atomically(folder / MANIFEST, _manifest_bytes(kept, job_fingerprint))
    return aside


def _new_quarantine(folder: Path) -> Path:
    """A new, empty ``quarantine-<UTC timestamp>-<pid>`` subfolder of ``folder``."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = folder / f"{QUARANTINE_PREFIX}{stamp}-{os.getpid()}"
    aside.mkdir()
    return aside


def _movable_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.name != LOCK_FILE_NAME
        and not (path.is_dir() and path.name.startswith(QUARANTINE_PREFIX))
        and not is_run_file(path.name)
    )
