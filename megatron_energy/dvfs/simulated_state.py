"""The state file of simulated GPUs, read and reset from another process without the power model.

:class:`~megatron_energy.dvfs.simulated.SimulatedGPUs` writes it; the clock watchdog resets it after the
owner died. Kept apart from :mod:`~megatron_energy.dvfs.simulated` so the watchdog, started once per
training process, imports no numerical library: its start and its reset stay quick.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from megatron_energy.atomic import write_atomically

STATE_SCHEMA_VERSION = 1


def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a simulated GPUs' state file (see the module docstring for what it holds)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def reset_state_file(path: str | os.PathLike[str], indices: Sequence[int] | None = None) -> None:
    """Reset the locked SM and memory clocks in a state file, as a clock reset would, from another process.

    Used by the clock watchdog when the process owning the simulated GPUs died without resetting them. The
    reset takes effect at once (there is no virtual clock left to wait on).

    Args:
        path: The state file.
        indices: GPUs to reset; None = all.
    """
    state = read_state(path)
    for gpu in state["gpus"]:
        if indices is None or gpu["index"] in indices:
            gpu["reset_calls"] += 1
            gpu["locked_sm_clock_mhz"] = gpu["pending_sm_clock_mhz"] = gpu["pending_at_s"] = None
            gpu["sm_clock_mhz"] = state["default_sm_clock_mhz"]
            gpu["memory_clock_mhz"] = None
    write_atomically(path, json.dumps(state), durable=False)
