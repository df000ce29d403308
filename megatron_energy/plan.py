"""The plan file: per-rank, per-instruction SM clocks as typed, versioned, checksummed JSON.

Every optimiser emits a :class:`Plan`; the runtime reads one back with :meth:`Plan.load`. The file is plain
JSON parsed with :func:`json.loads` (never evaluated), carries a schema version, a fingerprint of the job and
GPU it was planned for, and a SHA-256 checksum of its own content, so a stale, foreign, hand-edited or
truncated plan is refused with a message that says what is wrong and what to do about it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from megatron_energy import __version__

SCHEMA_VERSION = 1
"""Version of the JSON layout written by :meth:`Plan.save`; bump it when the layout changes."""

Provenance = Literal["measured", "modelled"]
PROVENANCES: tuple[str, ...] = ("measured", "modelled")
KINDS: tuple[str, ...] = ("forward", "backward")


class PlanError(ValueError):
    """A plan file cannot be used; the message says why and what to do."""


class PlannedInstruction(NamedTuple):
    """One pipeline instruction of a rank and the SM clock to run it at."""

    kind: str
    """``"forward"`` or ``"backward"``."""
    microbatch: int
    """Microbatch index within the iteration."""
    chunk: int
    """Virtual-pipeline model chunk (0 without interleaving)."""
    clock_mhz: int
    """SM clock to lock while this instruction runs."""


@dataclass(frozen=True)
class PlanPrediction:
    """What the planner predicts for one iteration under the plan (and under all-maximum clocks)."""

    iteration_time_s: float
    """Predicted iteration time with the plan's clocks."""
    energy_j: float
    """Predicted energy of one iteration over all pipeline stages (busy + blocked + idle)."""
    stage_energy_j: tuple[float, ...]
    """Predicted energy per pipeline stage; sums to ``energy_j``."""
    baseline_time_s: float
    """Predicted iteration time with every instruction at its fastest clock."""
    baseline_energy_j: float
    """Predicted energy with every instruction at its fastest clock."""
    deadline_s: float
    """The iteration-time budget the plan was solved for."""
    lower_bound_j: float
    """Energy of the relaxed (continuous-clock) optimum at ``deadline_s``: no plan can use less."""


@dataclass(frozen=True)
class Plan:
    """A clock for every pipeline instruction of one training iteration, plus what it is predicted to do.

    Attributes:
        fingerprint: :func:`fingerprint` of the job and GPU the plan was computed for.
        gpu_name: GPU spec or device name the profile came from.
        provenance: ``"measured"`` when the profile was measured on GPUs, ``"modelled"`` when it came from
            the time/power model.
        target: The planning target, e.g. ``"iso-time"``, ``"min-energy"``, ``"slowdown:0.05"`` or
            ``"time:1.234"`` (straggler pace).
        ranks: Per pipeline rank, the instructions in execution order with their clocks.
        prediction: Predicted time and energy.
        created_by: Name and version of the software that wrote the plan.
        schema_version: Layout version of the file.
    """

    fingerprint: str
    gpu_name: str
    provenance: Provenance
    target: str
    ranks: tuple[tuple[PlannedInstruction, ...], ...]
    prediction: PlanPrediction
    created_by: str = f"megatron_energy {__version__}"
    schema_version: int = SCHEMA_VERSION
    _index: dict[tuple[int, str, int, int], int] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def num_stages(self) -> int:
        """Number of pipeline ranks the plan covers."""
        return len(self.ranks)

    def rank_clocks(self, stage: int) -> tuple[PlannedInstruction, ...]:
        """Return one rank's instructions, in execution order, with their clocks.

        Args:
            stage: Pipeline rank.

        Raises:
            PlanError: If the plan has no such rank.
        """
        if not 0 <= stage < len(self.ranks):
            raise PlanError(f"the plan covers pipeline ranks 0..{len(self.ranks) - 1}, not rank {stage}")
        return self.ranks[stage]

    def clock_for(self, stage: int, kind: str, microbatch: int, chunk: int = 0) -> int:
        """Return the clock planned for one instruction.

        Args:
            stage: Pipeline rank.
            kind: ``"forward"`` or ``"backward"``.
            microbatch: Microbatch index.
            chunk: Virtual-pipeline model chunk.

        Raises:
            PlanError: If the plan has no such instruction (the schedule differs from the planned one).
        """
        if not self._index:
            for rank, instructions in enumerate(self.ranks):
                for item in instructions:
                    self._index[(rank, item.kind, item.microbatch, item.chunk)] = item.clock_mhz
        try:
            return self._index[(stage, kind, microbatch, chunk)]
        except KeyError:
            raise PlanError(
                f"the plan has no {kind} of microbatch {microbatch}, chunk {chunk} on rank {stage}: it was "
                "made for another schedule (stages, microbatches or virtual pipeline size); rerun planning"
            ) from None

    def to_json_dict(self) -> dict[str, Any]:
        """Return the plan as a JSON-ready dict, checksum included."""
        body = _content(self)
        body["checksum"] = _checksum(body)
        return body

    def save(self, path: str | Path) -> Path:
        """Write the plan as JSON (parent folders are created).

        Args:
            path: Destination file.

        Returns:
            The path written.
        """
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(target.name + ".tmp")
        temporary.write_text(json.dumps(self.to_json_dict(), indent=1) + "\n", encoding="utf-8")
        temporary.replace(target)
        return target

    @classmethod
    def load(cls, path: str | Path, expected_fingerprint: str | None = None) -> Plan:
        """Read a plan written by :meth:`save` and check it.

        Args:
            path: The plan file.
            expected_fingerprint: When given, the plan must have been computed for this job and GPU.

        Returns:
            The plan.

        Raises:
            PlanError: If the file is missing, not JSON, of another schema version, modified after it was
                written, malformed, or planned for another job or GPU.
        """
        source = Path(path)
        try:
            text = source.read_text(encoding="utf-8")
        except OSError as error:
            raise PlanError(f"cannot read plan file {source}: {error.strerror}; rerun planning") from None
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except ValueError as error:
            raise PlanError(
                f"plan file {source} is not valid JSON ({error}); it is damaged or not a plan: delete it or "
                "rerun planning"
            ) from None
        plan = cls.from_json_dict(data, source=str(source))
        if expected_fingerprint is not None and plan.fingerprint != expected_fingerprint:
            raise PlanError(
                f"plan file {source} was computed for another job or GPU (fingerprint "
                f"{plan.fingerprint[:12]}…, this job is {expected_fingerprint[:12]}…): delete it or rerun "
                "planning for this job"
            )
        return plan

    @classmethod
    def from_json_dict(cls, data: object, source: str = "<plan>") -> Plan:
        """Build a plan from the dict :meth:`to_json_dict` returns, checking version, checksum and fields.

        Args:
            data: Parsed JSON.
            source: Where the data came from, for error messages.

        Raises:
            PlanError: See :meth:`load`.
        """
        if not isinstance(data, dict):
            raise PlanError(f"plan file {source} does not hold a JSON object: delete it or rerun planning")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise PlanError(
                f"plan file {source} has schema version {version!r}, this megatron_energy ({__version__}) "
                f"reads version {SCHEMA_VERSION}: delete it or rerun planning"
            )
        body = {key: value for key, value in data.items() if key != "checksum"}
        try:
            expected = _checksum(body)
        except (TypeError, ValueError) as error:
            raise PlanError(
                f"plan file {source} is malformed ({error}): delete it or rerun planning"
            ) from None
        if data.get("checksum") != expected:
            raise PlanError(
                f"plan file {source} was modified after it was written (checksum mismatch); plans must not "
                "be edited by hand: delete it or rerun planning"
            )
        try:
            return _parse(body)
        except (KeyError, TypeError, ValueError) as error:
            raise PlanError(
                f"plan file {source} is malformed ({error}): delete it or rerun planning"
            ) from None


def fingerprint(**parts: object) -> str:
    """Return a stable identifier of a job and GPU: SHA-256 of the canonical JSON of ``parts``.

    Pass the model config, parallelism, batch shape and GPU name as keyword arguments (any JSON-serialisable
    values); the same parts in any keyword order give the same fingerprint.

    Args:
        **parts: What identifies the job, e.g. ``model=...``, ``parallelism=...``, ``batch=...``, ``gpu=...``.

    Returns:
        A 64-character hexadecimal digest.
    """
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str, allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number a plan may hold")


def _checksum(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _content(plan: Plan) -> dict[str, Any]:
    prediction = plan.prediction
    return {
        "schema_version": plan.schema_version,
        "fingerprint": plan.fingerprint,
        "gpu_name": plan.gpu_name,
        "provenance": plan.provenance,
        "target": plan.target,
        "created_by": plan.created_by,
        "prediction": {
            "iteration_time_s": prediction.iteration_time_s,
            "energy_j": prediction.energy_j,
            "stage_energy_j": list(prediction.stage_energy_j),
            "baseline_time_s": prediction.baseline_time_s,
            "baseline_energy_j": prediction.baseline_energy_j,
            "deadline_s": prediction.deadline_s,
            "lower_bound_j": prediction.lower_bound_j,
        },
        "ranks": [[item._asdict() for item in instructions] for instructions in plan.ranks],
    }


def _require(value: object, kind: type | tuple[type, ...], name: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _number(value: object, name: str) -> float:
    number = float(_require(value, (int, float), name))
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return number


def _parse_instruction(item: object, rank: int, position: int) -> PlannedInstruction:
    where = f"ranks[{rank}][{position}]"
    entry = _require(item, dict, where)
    kind = _require(entry["kind"], str, f"{where}.kind")
    if kind not in KINDS:
        raise ValueError(f"{where}.kind must be one of {KINDS}, got {kind!r}")
    microbatch = _require(entry["microbatch"], int, f"{where}.microbatch")
    chunk = _require(entry["chunk"], int, f"{where}.chunk")
    clock = _require(entry["clock_mhz"], int, f"{where}.clock_mhz")
    if microbatch < 0 or chunk < 0 or clock <= 0:
        raise ValueError(f"{where} has a negative index or a non-positive clock: {entry!r}")
    return PlannedInstruction(kind, microbatch, chunk, clock)


def _parse(body: Mapping[str, Any]) -> Plan:
    provenance = _require(body["provenance"], str, "provenance")
    if provenance not in PROVENANCES:
        raise ValueError(f"provenance must be one of {PROVENANCES}, got {provenance!r}")
    raw_prediction = _require(body["prediction"], dict, "prediction")
    stage_energy: Sequence[object] = _require(
        raw_prediction["stage_energy_j"], list, "prediction.stage_energy_j"
    )
    prediction = PlanPrediction(
        iteration_time_s=_number(raw_prediction["iteration_time_s"], "prediction.iteration_time_s"),
        energy_j=_number(raw_prediction["energy_j"], "prediction.energy_j"),
        stage_energy_j=tuple(_number(value, "prediction.stage_energy_j") for value in stage_energy),
        baseline_time_s=_number(raw_prediction["baseline_time_s"], "prediction.baseline_time_s"),
        baseline_energy_j=_number(raw_prediction["baseline_energy_j"], "prediction.baseline_energy_j"),
        deadline_s=_number(raw_prediction["deadline_s"], "prediction.deadline_s"),
        lower_bound_j=_number(raw_prediction["lower_bound_j"], "prediction.lower_bound_j"),
    )
    raw_ranks = _require(body["ranks"], list, "ranks")
    ranks = tuple(
        tuple(
            _parse_instruction(item, rank, position)
            for position, item in enumerate(_require(instructions, list, f"ranks[{rank}]"))
        )
        for rank, instructions in enumerate(raw_ranks)
    )
    if not ranks or len(stage_energy) != len(ranks):
        raise ValueError(
            f"{len(ranks)} ranks but {len(stage_energy)} per-stage energies: they must match (at least 1)"
        )
    return Plan(
        fingerprint=_require(body["fingerprint"], str, "fingerprint"),
        gpu_name=_require(body["gpu_name"], str, "gpu_name"),
        provenance=provenance,  # type: ignore[arg-type]
        target=_require(body["target"], str, "target"),
        ranks=ranks,
        prediction=prediction,
        created_by=_require(body["created_by"], str, "created_by"),
        schema_version=_require(body["schema_version"], int, "schema_version"),
    )
