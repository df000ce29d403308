"""The profile CSV, row by row through pydantic: :class:`ProfileCsvRow` declares each column's check.

The layout interoperates with Perseus/lowtime: columns ``stage,instruction,frequency,time,energy`` (seconds,
joules; ``instruction`` is ``forward``, ``backward`` or, for a combined 1F1B step, ``fused+b<backward
chunk>``), plus an optional ``chunk`` column (virtual-pipeline model chunk, 0 when absent) and an optional
``source`` column (the provenance, the same on every row). Other columns are ignored.

A row's own checks are :class:`ProfileCsvRow`'s fields'; what spans rows (the header, the field count, one row
per instruction and clock, one source for the whole file) is :func:`read_profile_csv`'s. Every refusal is one
line naming ``path:line``, the column and what is wrong, e.g. ``profile.csv:3: column 'time': Input should be
greater than 0, got '-0.1'``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final, Literal, get_args

from annotated_types import Ge, Gt
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from megatron_energy.pipeline.instruction import KINDS, is_fused_kind

ProfileSource = Literal["measured", "modelled", "simulated"]
"""Where a profile's figures come from (see :mod:`megatron_energy.pipeline.profile`)."""
PROFILE_SOURCES: tuple[str, ...] = get_args(ProfileSource)
CSV_COLUMNS: Final = ("stage", "instruction", "frequency", "time", "energy")
"""The Perseus/lowtime columns every profile CSV has, in the order they are written."""
CHUNK_COLUMN: Final = "chunk"
"""The optional column of the virtual-pipeline model chunk."""
SOURCE_COLUMN: Final = "source"
"""The CSV column that states the profile's provenance."""


def _known_kind(kind: str) -> str:
    if kind not in KINDS and not is_fused_kind(kind):
        raise ValueError("expected 'forward', 'backward' or a fused step's 'fused+b<chunk>'")
    return kind


class ProfileCsvRow(BaseModel):
    """One row of a profile CSV: one instruction's time and energy at one SM clock."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False, str_strip_whitespace=True)

    stage: Annotated[int, Ge(0)]
    """Pipeline stage (0-based)."""
    instruction: Annotated[str, AfterValidator(_known_kind)]
    """``forward``, ``backward`` or a fused step's ``fused+b<backward chunk>``."""
    frequency: Annotated[int, Gt(0)]
    """The SM clock, MHz."""
    time: Annotated[float, Gt(0)]
    """The instruction's time at that clock, seconds (finite)."""
    energy: Annotated[float, Ge(0)]
    """Its energy at that clock, joules (finite)."""
    chunk: Annotated[int, Ge(0)] = 0
    """Virtual-pipeline model chunk (0 when the file has no ``chunk`` column)."""
    source: ProfileSource | None = None
    """The provenance (None when the file has no ``source`` column)."""


@dataclass(frozen=True)
class ProfileTable:
    """What a profile CSV holds: its rows, checked, and the provenance it states."""

    rows: tuple[ProfileCsvRow, ...]
    """The data rows, in file order."""
    source: ProfileSource | None
    """The ``source`` column's value (the same on every row), None without the column."""


def read_profile_csv(path: Path) -> ProfileTable:
    """Read and check a profile CSV.

    Args:
        path: The CSV file.

    Returns:
        Its rows and stated provenance.

    Raises:
        ValueError: If the file is empty, lacks a column, has no data rows, a row has another number of
            fields than the header, a cell fails its column's check, an instruction repeats a clock, or the
            rows disagree on their source; the message names ``path:line`` and the column.
    """
    rows: list[ProfileCsvRow] = []
    first_seen: dict[tuple[int, int, str, int], int] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames
        if not header:
            raise ValueError(f"{path}: empty file, expected header {','.join(CSV_COLUMNS)}")
        missing = [column for column in CSV_COLUMNS if column not in header]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {missing}; header is {header}")
        for cells in reader:
            where = f"{path}:{reader.line_num}"
            if None in cells or any(cells[column] is None for column in header):
                raise ValueError(f"{where}: expected {len(header)} fields")
            row = _checked_row(cells, where)
            identity = (row.stage, row.chunk, row.instruction, row.frequency)
            if identity in first_seen:
                raise ValueError(
                    f"{where}: duplicate stage {row.stage} chunk {row.chunk} {row.instruction} at "
                    f"{row.frequency} MHz (first at line {first_seen[identity]})"
                )
            first_seen[identity] = reader.line_num
            if rows and row.source != rows[0].source:
                raise ValueError(
                    f"{where}: source {row.source!r} differs from the rows before ({rows[0].source!r})"
                )
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no data rows")
    return ProfileTable(tuple(rows), rows[0].source)


def _checked_row(cells: dict[str, str], where: str) -> ProfileCsvRow:
    """One data row through :class:`ProfileCsvRow`; a failure names the first bad column and its cell."""
    try:
        return ProfileCsvRow.model_validate(cells)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        column = str(first["loc"][0])
        message = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where}: column {column!r}: {message}, got {cells[column]!r}") from None


def profile_csv_text(rows: Iterable[ProfileCsvRow], *, with_chunk: bool, with_source: bool = True) -> str:
    """The rows as profile CSV text: the Perseus/lowtime columns, then ``chunk`` and ``source`` as asked.

    Args:
        rows: The rows, in the order they are written.
        with_chunk: Whether to write the ``chunk`` column (a profile of several model chunks needs it).
        with_source: Whether to write the ``source`` column (every row's provenance).

    Returns:
        The CSV text, its lines ended as :mod:`csv` writes them (CR LF).
    """
    columns = (
        CSV_COLUMNS + ((CHUNK_COLUMN,) if with_chunk else ()) + ((SOURCE_COLUMN,) if with_source else ())
    )
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([getattr(row, column) for column in columns])
    return buffer.getvalue()
