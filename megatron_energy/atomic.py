"""Atomic file writes: readers see the old file or the new one, never half of either."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (parent folders are created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    temporary.replace(path)
