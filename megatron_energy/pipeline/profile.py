"""Per-instruction time and energy at each SM clock: the input of the pipeline frequency planner.

A :class:`Profile` maps the work of every pipeline instruction
(:class:`~megatron_energy.pipeline.instruction.Work`: stage, chunk, kind) to its :class:`ClockOption` list.
Its ``source`` says where the figures come from: ``"measured"`` (timed and metered on GPUs at every clock),
``"modelled"`` (the time/power model: :meth:`Profile.synthetic`, or a dry run that measured the stock clock
only and extrapolated the rest) or ``"simulated"`` (profiled on simulated GPUs, whose figures are the model's
with emulated noise).

CSV format (interoperable with Perseus/lowtime): columns ``stage,instruction,frequency,time,energy`` (seconds,
joules; ``instruction`` is ``forward``, ``backward`` or, for a combined 1F1B step, ``fused+b<backward
chunk>``), plus an optional ``chunk`` column (virtual-pipeline model chunk, 0 when absent) and an optional
``source`` column (the provenance, the same on every row; written by :meth:`Profile.to_csv_text`, so the
provenance travels with the file). Other columns are ignored.
"""

from __future__ import annotations

import csv
import io
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from megatron_energy.atomic import write_atomically
from megatron_energy.dvfs.model import GpuPowerModel
from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.pipeline.instruction import KINDS, Work, is_fused_kind
from megatron_energy.pipeline.workload import TransformerShape, instruction_work

__all__ = ["ClockOption", "Profile", "ProfileSource", "RowWarning", "TransformerShape", "Work"]

ProfileSource = Literal["measured", "modelled", "simulated"]
PROFILE_SOURCES: tuple[str, ...] = get_args(ProfileSource)
CSV_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
SOURCE_COLUMN = "source"
"""The CSV column that states the profile's provenance."""
ROW_WARNING_RELATIVE_TOLERANCE = 1e-9
"""How much longer (relative) a higher clock's time must be for a lower clock's row to be worth a warning:
times equal up to floating-point rounding (a model's clock-insensitive time, a CSV round trip) are not."""


@dataclass(frozen=True)
class ClockOption:
    """One way to run an instruction: at ``clock_mhz`` it takes ``time_s`` and uses ``energy_j``."""

    clock_mhz: int
    time_s: float
    energy_j: float

    def __post_init__(self) -> None:
        if isinstance(self.clock_mhz, bool) or not isinstance(self.clock_mhz, numbers.Integral):
            raise ValueError(f"clock_mhz must be an integer, got {self.clock_mhz!r}")
        object.__setattr__(self, "clock_mhz", int(self.clock_mhz))
        if self.clock_mhz <= 0:
            raise ValueError(f"clock_mhz must be positive, got {self.clock_mhz}")
        if not math.isfinite(self.time_s) or self.time_s <= 0:
            raise ValueError(f"time_s must be positive and finite, got {self.time_s!r}")
        if not math.isfinite(self.energy_j) or self.energy_j < 0:
            raise ValueError(f"energy_j must be non-negative and finite, got {self.energy_j!r}")


@dataclass(frozen=True)
class RowWarning:
    """A profile row that is faster at a lower clock than at a higher one (measurement noise, or a mix-up).

    The planner copes (it only looks at time and energy), but the row makes "all maximum clocks" slower than
    some other plan, so it is worth a look.

    Attributes:
        work: The instruction.
        clock_mhz: The lower clock.
        time_s: Its time.
        energy_j: Its energy.
        higher_clock_mhz: The highest clock that takes longer.
        higher_time_s: That clock's time.
        higher_energy_j: That clock's energy.
    """

    work: Work
    clock_mhz: int
    time_s: float
    energy_j: float
    higher_clock_mhz: int
    higher_time_s: float
    higher_energy_j: float

    @property
    def cheaper(self) -> bool:
        """Whether the lower clock also uses less energy (then it dominates the higher one)."""
        return self.energy_j < self.higher_energy_j

    def __str__(self) -> str:
        stage, chunk, kind = self.work
        energy = "and uses less energy" if self.cheaper else "but uses more energy"
        return (
            f"stage {stage} chunk {chunk} {kind}: {self.clock_mhz} MHz takes {1e3 * self.time_s:.3f} ms, "
            f"less than {1e3 * self.higher_time_s:.3f} ms at {self.higher_clock_mhz} MHz, {energy} "
            f"({self.energy_j:.4g} J vs {self.higher_energy_j:.4g} J)"
        )


def _sort_key(option: ClockOption) -> tuple[float, float, int]:
    """Order options by time, then energy, then clock (ascending)."""
    return option.time_s, option.energy_j, option.clock_mhz


class Profile:
    """Clock options of every pipeline instruction, plus the powers of a blocked and an idle GPU.

    Attributes:
        gpu_name: The GPU the profile belongs to (a spec name such as ``"h200"``).
        source: ``"measured"``, ``"modelled"`` or ``"simulated"`` (see the module docstring).
        blocked_power_w: Power while blocked on pipeline communication.
        idle_power_w: Power while idle (after the last instruction of an iteration).
        num_stages: Pipeline stages covered.
        num_chunks: Virtual-pipeline chunks per stage (1 without VPP).
    """

    def __init__(
        self,
        options: Mapping[Work, Sequence[ClockOption]],
        gpu_name: str,
        source: str,
        blocked_power_w: float,
        idle_power_w: float,
    ):
        """Validate and store the options.

        Raises:
            ValueError: On an unknown source, non-positive powers, malformed keys, empty option lists,
                repeated clocks for one key, or a key set that is not every (stage, chunk, kind) combination.
        """
        if source not in PROFILE_SOURCES:
            raise ValueError(f"profile source must be one of {PROFILE_SOURCES}, got {source!r}")
        if not (blocked_power_w > 0 and idle_power_w > 0):
            raise ValueError(f"powers must be positive, got blocked {blocked_power_w}, idle {idle_power_w}")
        if not options:
            raise ValueError("a profile needs at least one instruction")
        self.gpu_name = gpu_name
        self.source: ProfileSource = source  # type: ignore[assignment]
        self.blocked_power_w = float(blocked_power_w)
        self.idle_power_w = float(idle_power_w)
        self._options = {_checked_key(key): _checked_options(key, opts) for key, opts in options.items()}
        self.num_stages = 1 + max(key.stage for key in self._options)
        self.num_chunks = 1 + max(key.chunk for key in self._options)
        expected = {
            Work(s, c, k) for s in range(self.num_stages) for k in KINDS for c in range(self.num_chunks)
        }
        missing = sorted(expected - set(self._options))
        if missing:
            raise ValueError(
                f"profile lacks instruction(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}"
            )

    def __repr__(self) -> str:
        return (
            f"Profile(gpu={self.gpu_name!r}, source={self.source!r}, stages={self.num_stages}, "
            f"chunks={self.num_chunks}, blocked={self.blocked_power_w:g} W, idle={self.idle_power_w:g} W)"
        )

    def keys(self) -> list[Work]:
        """All instruction keys, sorted by (stage, chunk, kind)."""
        return sorted(self._options)

    def __iter__(self) -> Iterator[Work]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._options)

    def options(self, key: Work) -> list[ClockOption]:
        """All options of ``key``, sorted by time ascending (then energy, then clock)."""
        return list(self._lookup(key))

    def pareto(self, key: Work) -> list[ClockOption]:
        """The Pareto-optimal (time, energy) options of ``key``, time ascending, energy strictly descending.

        Of options with equal time and energy (e.g. clocks above the power-cap clock) the lowest clock is
        kept.
        """
        frontier: list[ClockOption] = []
        for option in self._lookup(key):
            if not frontier or option.energy_j < frontier[-1].energy_j:
                frontier.append(option)
        return frontier

    def fastest(self, key: Work) -> ClockOption:
        """The quickest option of ``key`` (least energy among equally quick ones)."""
        return self._lookup(key)[0]

    def option_at(self, key: Work, clock_mhz: int) -> ClockOption:
        """The option of ``key`` at exactly ``clock_mhz``.

        Raises:
            KeyError: If ``key`` has no option at that clock.
        """
        for option in self._lookup(key):
            if option.clock_mhz == clock_mhz:
                return option
        raise KeyError(f"instruction {key} has no option at {clock_mhz} MHz")

    def row_warnings(self) -> list[RowWarning]:
        """Rows faster at a lower clock than at some higher clock, by instruction and clock.

        Each lower-clock row is reported once, against the highest clock that takes longer than it by more
        than ``ROW_WARNING_RELATIVE_TOLERANCE`` (relative), so rounding noise is not reported.
        """
        warnings = []
        for key in self.keys():
            by_clock = sorted(self._options[key], key=lambda option: -option.clock_mhz)
            for position, option in enumerate(by_clock):
                slower = next(
                    (
                        high
                        for high in by_clock[:position]
                        if high.time_s > option.time_s * (1 + ROW_WARNING_RELATIVE_TOLERANCE)
                    ),
                    None,
                )
                if slower is not None:
                    warnings.append(
                        RowWarning(
                            key,
                            option.clock_mhz,
                            option.time_s,
                            option.energy_j,
                            slower.clock_mhz,
                            slower.time_s,
                            slower.energy_j,
                        )
                    )
        return warnings

    def _lookup(self, key: Work) -> tuple[ClockOption, ...]:
        try:
            return self._options[key]
        except KeyError:
            raise KeyError(f"profile has no instruction {key}") from None

    def to_csv_text(self) -> str:
        """The profile as a Perseus/lowtime CSV, with ``source`` (and ``chunk`` when there are several)."""
        with_chunk = self.num_chunks > 1
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer)
        writer.writerow(CSV_COLUMNS + (("chunk",) if with_chunk else ()) + (SOURCE_COLUMN,))
        for key in self.keys():
            stage, chunk, kind = key
            for option in sorted(self._options[key], key=lambda o: -o.clock_mhz):
                row = [stage, kind, option.clock_mhz, repr(option.time_s), repr(option.energy_j)]
                writer.writerow(row + ([chunk] if with_chunk else []) + [self.source])
        return buffer.getvalue()

    def to_csv(self, path: str | Path) -> None:
        """Write :meth:`to_csv_text` to ``path`` atomically."""
        write_atomically(Path(path), self.to_csv_text())

    @classmethod
    def from_csv(
        cls,
        path: str | Path,
        *,
        gpu_name: str,
        source: str | None = None,
        blocked_power_w: float | None = None,
        idle_power_w: float | None = None,
    ) -> Profile:
        """Read a Perseus/lowtime CSV; its provenance from its ``source`` column, else from ``source``.

        Args:
            path: The CSV file.
            gpu_name: The GPU it was measured on.
            source: The provenance the caller knows (``"measured"``, ``"modelled"``, ``"simulated"``);
                needed when the file has no ``source`` column, and must agree with it when it has one.
            blocked_power_w: Blocked power; taken from the GPU spec ``gpu_name`` when omitted.
            idle_power_w: Idle power; taken from the GPU spec ``gpu_name`` when omitted.

        Raises:
            ValueError: If the file is malformed (the message names the line and the problem), its rows
                disagree on their source, neither the file nor ``source`` says where the figures come from,
                the two disagree, or a power is omitted and ``gpu_name`` is not a known GPU spec.
        """
        if blocked_power_w is None or idle_power_w is None:
            spec = load_gpu_spec(gpu_name)
            blocked_power_w = spec.blocked_power_w if blocked_power_w is None else blocked_power_w
            idle_power_w = spec.idle_power_w if idle_power_w is None else idle_power_w
        options, stated = _read_csv_options(Path(path))
        if stated is not None and source is not None and stated != source:
            raise ValueError(f"{path} says its figures are {stated}, not {source}; drop the contrary source")
        provenance = stated or source
        if provenance is None:
            raise ValueError(
                f"{path} does not say where its figures come from (no {SOURCE_COLUMN!r} column): give the "
                f"source, one of {PROFILE_SOURCES} (e.g. `megatron-energy plan --profile-source measured`)"
            )
        return cls(options, gpu_name, provenance, blocked_power_w, idle_power_w)

    @classmethod
    def synthetic(
        cls,
        shape: TransformerShape,
        spec: GpuSpec,
        num_stages: int,
        num_chunks: int = 1,
        clocks_mhz: Iterable[int] | None = None,
    ) -> Profile:
        """A *modelled* profile: FLOP/byte counts of ``shape`` priced by :class:`GpuPowerModel` at each clock.

        See :mod:`megatron_energy.pipeline.workload` for the work model (embedding on stage 0 chunk 0, LM head
        and loss on the last stage's last chunk, layers split evenly).

        Args:
            shape: Model shape and microbatch.
            spec: The GPU.
            num_stages: Pipeline stages.
            num_chunks: Virtual-pipeline chunks per stage.
            clocks_mhz: Clocks to price (default: all the spec's SM clocks); each must be supported.

        Raises:
            ValueError: If a clock is not supported by the spec or the layers do not split evenly.
        """
        clocks = spec.sm_clocks_mhz if clocks_mhz is None else tuple(clocks_mhz)
        unsupported = sorted(set(clocks) - set(spec.sm_clocks_mhz))
        if unsupported or not clocks:
            raise ValueError(f"clocks {unsupported or '[]'} are not supported SM clocks of {spec.name}")
        model = GpuPowerModel(spec)
        options = {
            key: [
                ClockOption(clock, model.time_s(work, clock), model.energy_j(work, clock)) for clock in clocks
            ]
            for key, work in instruction_work(shape, spec, num_stages, num_chunks).items()
        }
        return cls(options, spec.name, "modelled", spec.blocked_power_w, spec.idle_power_w)


def _checked_key(key: Work) -> Work:
    """Validate an instruction key ``Work(stage, chunk, kind)``."""
    if not isinstance(key, Work):
        raise ValueError(f"instruction key must be a Work(stage, chunk, kind), got {key!r}")
    stage, chunk, kind = key
    if not (isinstance(stage, int) and stage >= 0 and isinstance(chunk, int) and chunk >= 0):
        raise ValueError(f"stage and chunk must be non-negative integers in key {key!r}")
    if kind not in KINDS and not is_fused_kind(kind):
        raise ValueError(f"kind must be one of {KINDS} or a fused kind (fused+b<chunk>) in key {key!r}")
    return key


def _checked_options(key: Work, options: Sequence[ClockOption]) -> tuple[ClockOption, ...]:
    """Validate one instruction's options and sort them by time."""
    if not options:
        raise ValueError(f"instruction {key} has no clock options")
    clocks = [option.clock_mhz for option in options]
    if len(set(clocks)) != len(clocks):
        raise ValueError(f"instruction {key} lists a clock more than once: {sorted(clocks)}")
    return tuple(sorted(options, key=_sort_key))


def _read_csv_options(path: Path) -> tuple[dict[Work, list[ClockOption]], str | None]:
    """Parse a profile CSV: its options and its stated source (None without a ``source`` column).

    Every problem raises ValueError naming ``path:line``.
    """
    options: dict[Work, list[ClockOption]] = {}
    first_seen: dict[tuple[Work, int], int] = {}
    stated: str | None = None
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames
        if not header:
            raise ValueError(f"{path}: empty file, expected header {','.join(CSV_COLUMNS)}")
        missing = [column for column in CSV_COLUMNS if column not in header]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {missing}; header is {header}")
        for row in reader:
            line = reader.line_num
            where = f"{path}:{line}"
            if None in row or any(row[column] is None for column in header):
                raise ValueError(f"{where}: expected {len(header)} fields")
            key = Work(
                _parse_int(row["stage"], "stage", where),
                _parse_int(row["chunk"], "chunk", where) if "chunk" in header else 0,
                _parse_kind(row["instruction"], where),
            )
            clock = _parse_int(row["frequency"], "frequency", where)
            if (key, clock) in first_seen:
                raise ValueError(
                    f"{where}: duplicate {key} at {clock} MHz (first at line {first_seen[key, clock]})"
                )
            first_seen[key, clock] = line
            time_s = _parse_float(row["time"], "time", where)
            energy_j = _parse_float(row["energy"], "energy", where)
            try:
                option = ClockOption(clock, time_s, energy_j)
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from error
            options.setdefault(key, []).append(option)
            if SOURCE_COLUMN in header:
                stated = _parse_source(row[SOURCE_COLUMN], stated, where)
    if not options:
        raise ValueError(f"{path}: no data rows")
    return options, stated


def _parse_source(text: str, stated: str | None, where: str) -> str:
    """One row's source: a known provenance, the same as the rows before it."""
    source = text.strip()
    if source not in PROFILE_SOURCES:
        raise ValueError(f"{where}: source {text!r} is not one of {PROFILE_SOURCES}")
    if stated is not None and source != stated:
        raise ValueError(f"{where}: source {source!r} differs from the rows before ({stated!r})")
    return source


def _parse_int(text: str, column: str, where: str) -> int:
    """Parse a non-negative integer cell."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{where}: column {column!r}: expected an integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{where}: column {column!r}: must not be negative, got {value}")
    return value


def _parse_float(text: str, column: str, where: str) -> float:
    """Parse a finite number cell."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{where}: column {column!r}: expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: column {column!r}: must be finite, got {text!r}")
    return value


def _parse_kind(text: str, where: str) -> str:
    """Parse the instruction column."""
    kind = text.strip()
    if kind not in KINDS and not is_fused_kind(kind):
        raise ValueError(
            f"{where}: column 'instruction': expected 'forward', 'backward' or a fused step's "
            f"'fused+b<chunk>', got {text!r}"
        )
    return kind
