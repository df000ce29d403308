"""The launcher's refusals: one line, printed once, and the one line torchrun's failure report names.

A command line the launcher cannot run (a bad or misspelt ``--energy-*`` flag, a training script that is not
there, a Megatron mode it cannot observe, tensor or context parallelism without a GPU) is the same on every
rank, so every rank refuses it alike, before Megatron starts: rank 0 prints the problem as one line,
``megatron_energy.launch: error: <what is wrong; what to do>``, and every rank exits with status 2.

``torch.distributed.run`` answers any rank's non-zero exit with a ``ChildFailedError`` report (its own
traceback and a summary of the failed ranks) after that line. The launcher does not exit 0 to hide it: a job
that did not run must fail for a scheduler or a script. Instead each rank writes the line to torchelastic's
error file (``TORCHELASTIC_ERROR_FILE``, set by torchrun for each worker), so the report's "Root Cause"
names the same line in place of "To enable traceback see ...": what is wrong is the first and the last
thing on the screen, and nothing in between is a traceback of the plugin's or Megatron's.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from megatron_energy.errors import EnergyError, EnergyValueError

PROG = "megatron_energy.launch"
"""How the launcher names itself in its messages."""

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""Where torchrun asks each worker to leave its error (``torch.distributed.elastic``'s error handler)."""

ESTIMATE_COMMAND = "megatron-energy estimate -- <your Megatron arguments>"
"""The command that models a job's saving without GPUs."""


class LaunchError(EnergyValueError):
    """A command line the launcher refuses before running anything; the message says what to do instead."""


def unknown_energy_flag(words: Iterable[str], known: Sequence[str]) -> LaunchError | None:
    """The first ``--energy-*`` word the launcher's flags do not know, naming the nearest that it does.

    Args:
        words: What the launcher's parser left over (the script and Megatron's arguments).
        known: Every spelling of every ``--energy-*`` flag.

    Returns:
        The refusal, or ``None`` when every ``--energy-*`` word is a flag of ours.
    """
    for word in words:
        flag = word.split("=", 1)[0]
        if not flag.startswith("--energy-") or flag in known:
            continue
        nearest = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        hint = f"did you mean {nearest[0]}?" if nearest else f"`python -m {PROG} --help` lists them"
        return LaunchError(f"unknown flag {flag}: {hint} (Megatron has no --energy-* flags of its own)")
    return None


def missing_script(script: str) -> LaunchError | None:
    """The refusal of a training script that is not a file, or ``None`` when it is one."""
    if Path(script).is_file():
        return None
    return LaunchError(
        f"no training script at {script}: give the path of the Megatron pretrain script (e.g. "
        "pretrain_gpt.py) first, then its arguments"
    )


def parallelism_without_gpu(tensor_parallel: int, context_parallel: int, has_gpu: bool) -> LaunchError | None:
    """The refusal of tensor or context parallelism on a machine without a CUDA GPU, or ``None``.

    Megatron reads the GPU's architecture when either is above 1 (``get_device_arch_version``), which fails
    on every rank of a machine without one.

    Args:
        tensor_parallel: ``--tensor-model-parallel-size``.
        context_parallel: ``--context-parallel-size``.
        has_gpu: Whether torch sees a CUDA GPU.
    """
    if has_gpu or (tensor_parallel == 1 and context_parallel == 1):
        return None
    sizes = [
        f"{flag} {size}"
        for flag, size in (
            ("--tensor-model-parallel-size", tensor_parallel),
            ("--context-parallel-size", context_parallel),
        )
        if size > 1
    ]
    return LaunchError(
        f"{' and '.join(sizes)} needs CUDA GPUs and this machine has none (Megatron reads the GPU's "
        f"architecture for tensor and context parallelism); without a GPU, `{ESTIMATE_COMMAND}` models "
        "what --energy-optimise saves on this job, and `megatron-energy demo` runs the whole loop on CPU"
    )


def refuse(problem: EnergyError, rank: int) -> int:
    """Report a refusal: one line on rank 0's standard error, torchelastic's error file on every rank.

    Args:
        problem: What is wrong (its message says what to do instead).
        rank: This process's global rank.

    Returns:
        The exit status, 2 (as ``argparse`` exits on a bad command line).
    """
    line = f"{PROG}: error: {problem}"
    if rank == 0:
        sys.stderr.write(line + "\n")  # one write: ranks sharing a pipe never split it
        sys.stderr.flush()
    error_file = os.environ.get(ERROR_FILE_ENV)
    if error_file:
        # unwritable: the report then says "To enable traceback see ...", and the line above still stands
        with contextlib.suppress(OSError):
            Path(error_file).write_text(json.dumps(_error_file_data(line)))
    return 2


def _error_file_data(line: str) -> dict[str, object]:
    """Torchelastic's error-file record of ``line``: the report shows ``py_callstack`` as the root cause."""
    info = {"py_callstack": line, "timestamp": str(int(time.time()))}
    return {"message": {"message": line, "extraInfo": info}}
