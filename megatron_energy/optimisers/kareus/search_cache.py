"""Search results cached by job fingerprint: a rerun of the same job (and search inputs) skips the search.

One JSON file per fingerprint, ``<directory>/<fingerprint>/kareus_search.json``, written atomically (as plans
are, ``runtime/planning_round/cache.py``), holding the SHA-256 of the search inputs (deadline, base clocks,
budget) and the chosen :class:`~megatron_energy.optimisers.kareus.choices.ClassChoice` per (stage, class). A
file for other inputs, or one that does not parse, is a miss (and is overwritten by the next store).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from megatron_energy.atomic import write_atomically
from megatron_energy.optimisers.kareus.choices import ChoiceKey, ClassChoice

FILE_NAME = "kareus_search.json"


class SearchCache:
    """Cached search results under one directory (module docstring)."""

    def __init__(self, directory: str | Path):
        """Cache under ``directory`` (created on the first store)."""
        self.directory = Path(directory)

    def path(self, fingerprint: str) -> Path:
        """The cache file of one fingerprint."""
        return self.directory / fingerprint / FILE_NAME

    def load(self, fingerprint: str, inputs: object) -> dict[ChoiceKey, ClassChoice] | None:
        """The cached choices for these inputs, or ``None`` on a miss."""
        try:
            data = json.loads(self.path(fingerprint).read_text(encoding="utf-8"))
            if data["inputs_sha256"] != _digest(inputs):
                return None
            return {
                (int(item["stage"]), str(item["class"])): ClassChoice(
                    item["max_ctas"], int(item["launch"]), int(item["clock_steps"])
                )
                for item in data["choices"]
            }
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, fingerprint: str, inputs: object, choices: Mapping[ChoiceKey, ClassChoice]) -> Path:
        """Write the choices found for these inputs."""
        body = {
            "inputs_sha256": _digest(inputs),
            "choices": [
                {
                    "stage": stage,
                    "class": key,
                    "max_ctas": choice.max_ctas,
                    "launch": choice.launch,
                    "clock_steps": choice.clock_steps,
                }
                for (stage, key), choice in sorted(choices.items())
            ],
        }
        path = self.path(fingerprint)
        write_atomically(path, json.dumps(body, indent=1) + "\n")
        return path


def _digest(inputs: object) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
