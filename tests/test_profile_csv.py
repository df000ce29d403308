"""The profile CSV reads and writes through :class:`ProfileCsvRow`: each column's check, the file's own
checks, and the bytes the writer has always written."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.pipeline.profile_csv import ProfileCsvRow, profile_csv_text, read_profile_csv

HEADER = "stage,instruction,frequency,time,energy\n"
GOOD = {"stage": "0", "instruction": "forward", "frequency": "1980", "time": "0.1", "energy": "50"}
PP8 = Path(__file__).resolve().parent / "data" / "profile_pp8_h100.csv"


def _refusal(tmp_path: Path, body: str) -> str:
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(ValueError) as error:
        Profile.from_csv(path, gpu_name="h200", source="measured")
    message = str(error.value)
    assert message.count(str(path)) == 1 and "\n" not in message
    return message.removeprefix(str(path))


@pytest.mark.parametrize(
    ("column", "cell", "message"),
    [
        ("stage", "-1", "greater than or equal to 0"),
        ("stage", "first", "valid integer"),
        ("chunk", "-1", "greater than or equal to 0"),
        ("instruction", "fwd", "expected 'forward', 'backward' or a fused step's 'fused+b<chunk>'"),
        ("instruction", "fused+bx", "expected 'forward', 'backward'"),
        ("frequency", "0", "greater than 0"),
        ("frequency", "1980.5", "valid integer"),
        ("time", "0", "greater than 0"),
        ("time", "-0.1", "greater than 0"),
        ("time", "fast", "valid number"),
        ("time", "nan", "finite number"),
        ("energy", "-1", "greater than or equal to 0"),
        ("energy", "inf", "finite number"),
        ("source", "guessed", "'measured', 'modelled' or 'simulated'"),
    ],
)
def test_each_column_check_names_line_column_and_cell(tmp_path, column, cell, message):
    cells = GOOD | {"chunk": "0", "source": "measured"} | {column: cell}
    good_row = ",".join(GOOD.values()) + ",0,measured"
    body = ",".join(cells) + "\n" + good_row + "\n" + ",".join(cells.values()) + "\n"
    refusal = _refusal(tmp_path, body)
    assert refusal.startswith(f":3: column {column!r}: ")
    assert message in refusal
    assert refusal.endswith(f", got {cell!r}")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("", ": empty file, expected header stage,instruction,frequency,time,energy"),
        (HEADER, ": no data rows"),
        ("stage,instruction,frequency,time\n0,forward,1980,0.1\n", r":1: missing column(s) ['energy']"),
        (HEADER + "0,forward,1980,0.1\n", ":2: expected 5 fields"),
        (HEADER + "0,forward,1980,0.1,50,9\n", ":2: expected 5 fields"),
        (
            HEADER + "0,forward,1980,0.1,50\n0,forward,1980,0.2,60\n",
            ":3: duplicate stage 0 chunk 0 forward at 1980 MHz (first at line 2)",
        ),
        (
            "stage,instruction,frequency,time,energy,source\n"
            "0,forward,1980,0.1,50,measured\n0,backward,1980,0.2,90,modelled\n",
            ":3: source 'modelled' differs from the rows before ('measured')",
        ),
    ],
)
def test_the_files_own_checks_name_the_line(tmp_path, body, message):
    assert _refusal(tmp_path, body).startswith(message)


def test_cells_are_stripped_and_extra_columns_ignored(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("stage,instruction,frequency,time,energy,rank\n 1 , backward ,1410, 0.25 ,70,3\n")
    table = read_profile_csv(path)
    assert table.source is None
    assert table.rows == (
        ProfileCsvRow(stage=1, instruction="backward", frequency=1410, time=0.25, energy=70.0, chunk=0),
    )


def test_a_row_is_checked_as_it_is_written_too():
    with pytest.raises(ValidationError, match="time"):
        ProfileCsvRow(stage=0, instruction="forward", frequency=1980, time=-1.0, energy=1.0)
    with pytest.raises(ValidationError, match="source"):
        ProfileCsvRow(stage=0, instruction="forward", frequency=1980, time=1.0, energy=1.0, source="guessed")


def test_the_writer_keeps_the_files_bytes():
    """The S=8 profile, written by the writer before the schema, is read and written to the same bytes."""
    profile = Profile.from_csv(PP8, gpu_name="h100-sxm")
    assert profile.to_csv_text().encode() == PP8.read_bytes()


def test_the_chunk_and_source_columns_are_written_as_asked():
    options = {
        Work(0, chunk, kind): [ClockOption(1980, 0.5, 2.25), ClockOption(990, 1.0, 1.5)]
        for chunk in (0, 1)
        for kind in ("forward", "backward")
    }
    profile = Profile(options, "h200", "simulated", 100.0, 90.0)
    assert profile.to_csv_text().splitlines()[:3] == [
        "stage,instruction,frequency,time,energy,chunk,source",
        "0,backward,1980,0.5,2.25,0,simulated",
        "0,backward,990,1.0,1.5,0,simulated",
    ]
    bare = profile_csv_text(profile.csv_rows(), with_chunk=False, with_source=False)
    assert bare.splitlines()[:2] == ["stage,instruction,frequency,time,energy", "0,backward,1980,0.5,2.25"]
    assert bare.endswith("\r\n")
