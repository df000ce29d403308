"""What a job that ends while profiling keeps: each rank's rows of the clocks it finished (a partial profile).

The energy directory holds a profile only once profiling completes (``runtime.planning_round.cache``). A job
whose end comes first (``--train-iters`` too few, a crash, a signal) would otherwise lose what it measured, so
at the session's close each rank still profiling writes the rows of every clock whose block completed
(``ProfileCollector.completed_rows``: the stock clock's first) to its own
``<energy dir>/<job>/profile.partial.rank<r>.csv`` (``energy_dir.JobFiles.partial_profile``), through the
profile CSV's schema (``pipeline.profile_csv``), atomically. Nothing is written where no clock completed.
Rank 0 says in one line where the files are and what its own holds. The files are for inspection and for
``megatron-energy plan --profile`` (one rank's file covers its stage only); a later run of the job profiles
again from the start (nothing here is reused), and its rank removes its own stale file once its profiling
completes (:func:`drop_partial_profile`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from megatron_energy.atomic import write_atomically
from megatron_energy.energy_dir import JobFiles
from megatron_energy.pipeline.profile_csv import ProfileCsvRow, ProfileSource, profile_csv_text
from megatron_energy.runtime.profiling.collector import ProfileCollector, ProfileRow

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartialProfile:
    """What one rank kept of a profiling the job's end cut short."""

    path: Path
    """The rank's ``profile.partial.rank<r>.csv``."""
    clocks_mhz: tuple[int, ...]
    """The clocks whose rows it holds, the stock clock first."""
    grid_size: int
    """Clocks the grid profiles in all."""
    source: ProfileSource
    """Where its figures come from: ``measured`` (GPUs) or ``simulated`` (simulated GPUs)."""


def csv_rows(rows: Sequence[ProfileRow], source: ProfileSource) -> list[ProfileCsvRow]:
    """The collector's rows as profile CSV rows: by stage, chunk and kind, each one's clocks descending."""
    ordered = sorted(rows, key=lambda row: (row.work, -row.clock_mhz))
    return [
        ProfileCsvRow(
            stage=row.work.stage,
            instruction=row.work.kind,
            frequency=row.clock_mhz,
            time=row.time_s,
            energy=row.energy_j,
            chunk=row.work.chunk,
            source=source,
        )
        for row in ordered
    ]


def keep_partial_profile(
    collector: ProfileCollector, files: JobFiles, rank: int, source: ProfileSource
) -> PartialProfile | None:
    """Write this rank's rows of the clocks it finished to its partial profile; ``None``: none finished.

    Args:
        collector: The rank's profile collector, its grid not done.
        files: The job's folder.
        rank: This rank's global rank.
        source: Where the figures come from (``measured`` or ``simulated``).

    Raises:
        OSError: The file cannot be written.
        ValueError: A row fails the profile CSV's checks (a non-positive time).
    """
    rows = collector.completed_rows()
    if not rows:
        return None
    path = files.partial_profile(rank)
    text = profile_csv_text(csv_rows(rows, source), with_chunk=any(row.work.chunk for row in rows))
    write_atomically(path, text)
    clocks = tuple(clock for clock in collector.clocks_mhz if any(row.clock_mhz == clock for row in rows))
    return PartialProfile(path, clocks, len(collector.clocks_mhz), source)


def drop_partial_profile(files: JobFiles, rank: int) -> None:
    """Profiling completed: remove this rank's partial profile of an earlier run cut short, if any.

    A file that cannot be removed stays (it is never read back); training is not disturbed.
    """
    with contextlib.suppress(OSError):
        files.partial_profile(rank).unlink(missing_ok=True)


def close_while_profiling(
    collector: ProfileCollector, files: JobFiles, rank: int, source: ProfileSource
) -> None:
    """At the close of a session still profiling: keep this rank's partial profile; rank 0 says so.

    Never raises (the process is ending): a rank that cannot write its file says why in its own line.

    Args:
        collector: The rank's profile collector, its grid not done.
        files: The job's folder.
        rank: This rank's global rank.
        source: Where the figures come from (``measured`` or ``simulated``).
    """
    try:
        kept = keep_partial_profile(collector, files, rank, source)
    except Exception as problem:  # a closing write never fails the job
        logger.info(f"[energy] rank {rank}: the partial profile was not kept: {problem}")
        return
    if rank == 0:
        logger.info(kept_line(kept))


def kept_line(kept: PartialProfile | None) -> str:
    """Rank 0's line at close: where the partial profiles are and what its own holds, or that none was kept.

    Args:
        kept: What rank 0 kept (:func:`keep_partial_profile`).
    """
    start = "[energy] the job ended while profiling"
    if kept is None:
        return (
            f"{start}: not even the stock clock's steps completed, so no partial profile was kept; a later "
            "run of this job profiles from the start"
        )
    clocks = ", ".join(str(clock) for clock in kept.clocks_mhz)
    others = len(kept.clocks_mhz) - 1
    stock = f"the stock clock and {others} more" if others else "the stock clock only"
    return (
        f"{start}: each rank kept the {kept.source} rows of the clocks it finished in a partial profile, "
        f"rank 0's in {kept.path} (the others' beside it): {stock}, {len(kept.clocks_mhz)} of "
        f"{kept.grid_size} clocks ({clocks} MHz); a later run of this job does not "
        "reuse it and profiles from the start (megatron-energy plan --profile reads a file that covers "
        "every stage)"
    )
