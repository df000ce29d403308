"""Megatron's own per-iteration log lines, read back from a training run's output.

With ``--log-interval 1`` Megatron's training loop prints one line per iteration, for example::

    [2026-12-02 02:44:38.493685] iteration        3/      30 | consumed samples: 96 |
    elapsed time per iteration (ms): 1599.9 | energy per GPU (J/iter/GPU): 1090.1 | ...

``elapsed time per iteration (ms)`` is Megatron's iteration timer (wall clock, measured); ``energy per GPU
(J/iter/GPU)`` appears with ``--log-energy`` (Megatron's reading of the NVML energy counter, measured). The
scripts that compare runs (``lab/bench_overhead.py``, ``lab/gpu_validate.py``) read these lines with
:func:`parse_iteration_lines` rather than trusting our own meter, so the comparison uses Megatron's figures.

Pure text parsing: no megatron import (it lives here because the format is Megatron's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ITERATION_LINE = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|(.*)$", re.MULTILINE)
ELAPSED_MS = re.compile(r"elapsed time per iteration \(ms\):\s*([\d.]+)")
ENERGY_J = re.compile(r"energy per GPU \(J/iter/GPU\):\s*([\d.]+)")


@dataclass(frozen=True)
class IterationLine:
    """One iteration as Megatron logged it (all figures measured).

    Attributes:
        iteration: The 1-based iteration number.
        train_iters: The run's total iterations as the line states it.
        elapsed_ms: Megatron's iteration time, milliseconds.
        energy_j: Megatron's energy per GPU for the iteration, joules (None without ``--log-energy``).
    """

    iteration: int
    train_iters: int
    elapsed_ms: float
    energy_j: float | None


def parse_iteration_lines(text: str) -> list[IterationLine]:
    """Every per-iteration line of Megatron's training log in ``text``, in iteration order.

    A repeated iteration number (a line printed twice, e.g. by two ranks) keeps its first line. Lines that
    carry no ``elapsed time per iteration`` field (e.g. validation lines) are skipped.

    Args:
        text: A training run's combined stdout and stderr.

    Returns:
        One :class:`IterationLine` per logged iteration, sorted by iteration.
    """
    lines: dict[int, IterationLine] = {}
    for match in ITERATION_LINE.finditer(text):
        fields = match.group(3)
        elapsed = ELAPSED_MS.search(fields)
        if elapsed is None:
            continue
        energy = ENERGY_J.search(fields)
        iteration = int(match.group(1))
        lines.setdefault(
            iteration,
            IterationLine(
                iteration=iteration,
                train_iters=int(match.group(2)),
                elapsed_ms=float(elapsed.group(1)),
                energy_j=float(energy.group(1)) if energy else None,
            ),
        )
    return [lines[i] for i in sorted(lines)]
