"""The manifest of a job's cache folder, its verification, and moving a failed folder's files aside.

``manifest.json`` lists every artefact of one store with its SHA-256 and size, and the full job fingerprint.
It is written last, so a folder whose store was interrupted fails verification instead of passing with
stale or partial files. A folder that fails is never deleted: :func:`quarantine` moves its files into
``quarantine-<UTC timestamp>-<pid>/`` inside it, kept for inspection. The manifest is read and written
through :class:`CacheManifest` (pydantic), the checks on its fields.
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

from megatron_energy.atomic import LOCK_FILE_NAME
from megatron_energy.energy_dir import MANIFEST, QUARANTINE_PREFIX
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
    manifest = CacheManifest(
        schema_version=MANIFEST_SCHEMA_VERSION, fingerprint=job_fingerprint, artefacts=entries
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
    contents = {}
    for name, entry in entries.items():
        path = folder / name
        try:
            content = path.read_bytes()
        except FileNotFoundError:
            raise CacheVerificationError(f"{name} is missing") from None
        if len(content) != entry.size_bytes:
            raise CacheVerificationError(
                f"{name} has {len(content)} bytes, the manifest says {entry.size_bytes} (truncated or grown)"
            )
        if hashlib.sha256(content).hexdigest() != entry.sha256:
            raise CacheVerificationError(f"{name} does not match its checksum (changed after it was written)")
        if name.endswith(".json"):
            try:
                json.loads(content)
            except ValueError as error:
                raise CacheVerificationError(f"{name} is not valid JSON ({error})") from None
        contents[name] = content
    return contents


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
    """Whether ``folder`` holds any file a store wrote (then a failed verification means corruption)."""
    return bool(_movable_files(folder))


def quarantine(folder: Path) -> Path:
    """Move every file of ``folder`` (not the lock file, not earlier quarantines) into a new subfolder.

    Args:
        folder: The job's cache folder; the caller holds its exclusive lock.

    Returns:
        The new ``quarantine-<UTC timestamp>-<pid>`` folder.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = folder / f"{QUARANTINE_PREFIX}{stamp}-{os.getpid()}"
    aside.mkdir()
    for path in _movable_files(folder):
        path.rename(aside / path.name)
    return aside


def _movable_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.name != LOCK_FILE_NAME and not (path.is_dir() and path.name.startswith(QUARANTINE_PREFIX))
    )
