"""The plan file: a :class:`~megatron_energy.plan.Plan` as versioned, checksummed JSON, through pydantic.

The models below are the file's layout (schema version :data:`~megatron_energy.plan.SCHEMA_VERSION`), field
by field, with the checks declared on the fields; the typed values a plan holds as they are (the phase
labels, launch points and collective names of ``pipeline``, the baseline, measured tail, frontier samples
and saving band of ``plan``) carry their checks on their own fields. What spans several fields (an action
listed under the rank it names, every point covering the same ranks, the band holding the plan's own
saving) is the models' validators'; memory clocks the plan's GPU does not support are refused as the file
is read (the check needs the GPU spec, not only the file). Optional fields are written only when
they hold something.

Reading parses the text twice: ``json.loads`` for the version and the checksum (over what the writer wrote,
so a hand edit is refused before anything else), then pydantic in strict JSON mode (no string for a number,
no boolean for an integer, no unknown key); a failure names the field, e.g.
``points[0].ranks[1].actions[3].clock.at.phase.label.at_s: Input should be greater than or equal to 0``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, MinLen
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from megatron_energy import __version__
from megatron_energy.atomic import write_atomically
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.collective_names import CollectiveName, LaunchPoint
from megatron_energy.pipeline.instruction import Instruction, Kind
from megatron_energy.pipeline.phase_labels import PhaseLabel
from megatron_energy.plan import (
    SCHEMA_VERSION,
    Action,
    Baseline,
    Boundary,
    ClockAction,
    CollectiveAction,
    FrontierSample,
    Joules,
    MeasuredTail,
    Plan,
    PlanError,
    PlanPoint,
    Provenance,
    RankPlan,
    Seconds,
)
from megatron_energy.plan_band import SavingBand, energy_change
from megatron_energy.plan_memory import check_memory_clocks
from megatron_energy.plan_smoothing import PlanSmoothing

Index = Annotated[int, Ge(0)]
"""A stage, chunk, microbatch or list index."""

MAX_ERRORS = 3
"""Field errors a refusal names (the count of the rest follows)."""


def _phase_tag(value: object) -> str | None:
    """Which typed value a boundary's phase holds: a phase label (``scope``) or a launch point (``where``)."""
    if isinstance(value, PhaseLabel) or (isinstance(value, dict) and "scope" in value):
        return "label"
    if isinstance(value, LaunchPoint) or (isinstance(value, dict) and "where" in value):
        return "point"
    return None


PhaseField = Annotated[
    Annotated[PhaseLabel, Tag("label")] | Annotated[LaunchPoint, Tag("point")],
    Discriminator(
        _phase_tag,
        custom_error_type="phase",
        custom_error_message="a phase is a phase label (scope, index, kind, provenance, at_s, lead_s, "
        "optional hook) or a launch point (where, layer for a layer start)",
    ),
]


class _FileModel(BaseModel):
    """Unknown keys refused, numbers finite; read in strict JSON mode (:func:`read_plan`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class BoundaryFile(_FileModel):
    """A :class:`~megatron_energy.plan.Boundary`: its instruction's fields, flat, and the phase inside it."""

    stage: Index
    """The instruction's pipeline stage (the rank it is listed under)."""
    chunk: Index
    """Its model chunk."""
    microbatch: Index
    """Its microbatch."""
    kind: Kind
    """``forward`` or ``backward``."""
    phase: PhaseField | None = None
    """A phase label or a launch point inside the instruction; absent: the instruction's start."""
    backward_chunk: Index | None = None
    """Combined 1F1B: the chunk of the backward fused with the (forward) instruction."""
    backward_microbatch: Index | None = None
    """Combined 1F1B: that backward's microbatch."""

    @model_validator(mode="after")
    def _fused_step_whole(self) -> BoundaryFile:
        if (self.backward_chunk is None) != (self.backward_microbatch is None):
            raise ValueError(
                "backward_chunk and backward_microbatch come together (a fused step) or not at all"
            )
        return self

    @classmethod
    def of(cls, at: Boundary) -> BoundaryFile:
        """The file's entry of ``at``."""
        stage, chunk, microbatch, kind = at.instruction  # kind: checked as it is read (an untyped str here)
        backward = at.backward
        fields = {"stage": stage, "chunk": chunk, "microbatch": microbatch, "kind": kind, "phase": at.phase}
        if backward is not None:
            fields |= {"backward_chunk": backward.chunk, "backward_microbatch": backward.microbatch}
        return cls.model_validate(fields)

    def boundary(self) -> Boundary:
        """The boundary this entry describes."""
        backward = None
        if self.backward_chunk is not None and self.backward_microbatch is not None:
            backward = Instruction(self.stage, self.backward_chunk, self.backward_microbatch, "backward")
        return Boundary(Instruction(self.stage, self.chunk, self.microbatch, self.kind), self.phase, backward)


class ClockActionFile(_FileModel):
    """A :class:`~megatron_energy.plan.ClockAction`."""

    type: Literal["clock"]
    """The action's kind."""
    at: BoundaryFile
    """Where the clock takes effect."""
    clock_mhz: Annotated[int, Gt(0)]
    """SM clock to lock."""


class CollectiveActionFile(_FileModel):
    """A :class:`~megatron_energy.plan.CollectiveAction`."""

    type: Literal["collective"]
    """The action's kind."""
    at: BoundaryFile
    """The launch point."""
    collective: CollectiveName
    """Which collective."""
    max_ctas: Annotated[int, Ge(1)] | None
    """Its CTA budget; ``null``: the library's default."""


ActionFile = Annotated[ClockActionFile | CollectiveActionFile, Field(discriminator="type")]


def _action_file(action: Action) -> ClockActionFile | CollectiveActionFile:
    at = BoundaryFile.of(action.at)
    if isinstance(action, ClockAction):
        return ClockActionFile(type="clock", at=at, clock_mhz=action.clock_mhz)
    return CollectiveActionFile(
        type="collective", at=at, collective=action.collective, max_ctas=action.max_ctas
    )


def _action(entry: ClockActionFile | CollectiveActionFile) -> Action:
    if isinstance(entry, ClockActionFile):
        return ClockAction(entry.at.boundary(), entry.clock_mhz)
    return CollectiveAction(entry.at.boundary(), entry.collective, entry.max_ctas)


class RankFile(_FileModel):
    """A :class:`~megatron_energy.plan.RankPlan`."""

    energy_j: Joules
    """Predicted energy of the rank's GPU per iteration."""
    busy_s: Seconds
    """Predicted time the rank's GPU computes per iteration."""
    actions: tuple[ActionFile, ...]
    """Actions in execution order."""


class PointFile(_FileModel):
    """A :class:`~megatron_energy.plan.PlanPoint`; every action is listed under the rank it names."""

    label: str
    """What the point was chosen for."""
    iteration_time_s: Seconds
    """Predicted iteration time."""
    deadline_s: Seconds
    """The iteration-time budget the point was solved for."""
    lower_bound_j: Joules
    """Relaxed optimum at the deadline."""
    ranks: Annotated[tuple[RankFile, ...], MinLen(1)]
    """Per pipeline rank."""

    @model_validator(mode="after")
    def _actions_on_their_rank(self) -> PointFile:
        for stage, rank in enumerate(self.ranks):
            for index, action in enumerate(rank.actions):
                if action.at.stage != stage:
                    raise ValueError(
                        f"ranks[{stage}].actions[{index}] is listed under rank {stage} but names stage "
                        f"{action.at.stage}"
                    )
        return self

    @classmethod
    def of(cls, point: PlanPoint) -> PointFile:
        """The file's entry of ``point``."""
        return cls(
            label=point.label,
            iteration_time_s=point.iteration_time_s,
            deadline_s=point.deadline_s,
            lower_bound_j=point.lower_bound_j,
            ranks=tuple(
                RankFile(
                    energy_j=rank.energy_j,
                    busy_s=rank.busy_s,
                    actions=tuple(_action_file(action) for action in rank.actions),
                )
                for rank in point.ranks
            ),
        )

    def point(self) -> PlanPoint:
        """The point this entry describes."""
        return PlanPoint(
            label=self.label,
            iteration_time_s=self.iteration_time_s,
            deadline_s=self.deadline_s,
            lower_bound_j=self.lower_bound_j,
            ranks=tuple(
                RankPlan(tuple(_action(action) for action in rank.actions), rank.energy_j, rank.busy_s)
                for rank in self.ranks
            ),
        )


class PlanFile(_FileModel):
    """A :class:`~megatron_energy.plan.Plan`, in the file's key order (its checksum comes last)."""

    schema_version: int
    """Layout version (checked before the fields are read)."""
    fingerprint: str
    """The job and GPU the plan was computed for."""
    gpu_name: str
    """GPU spec or device name the profile came from."""
    provenance: Provenance
    """The profile's source."""
    target: str
    """The planning target."""
    optimisers: tuple[str, ...]
    """The optimisers that made the plan, in order."""
    switch_latency_s: Seconds
    """SM-clock switch latency the points were made executable under."""
    created_by: str
    """Name and version of the software that wrote the plan."""
    baseline: Baseline
    """The all-maximum-clocks iteration."""
    target_index: Index
    """The point chosen for the target."""
    points: Annotated[tuple[PointFile, ...], MinLen(1)]
    """Executable points, ascending iteration time."""
    frontier: tuple[FrontierSample, ...]
    """The instant-switch frontier curve (``[time_s, energy_j, lower_bound_j, deadline_s]`` each)."""
    measured_tail: MeasuredTail | None
    """The measured time and energy outside the pipeline instructions; ``null``: none."""
    notes: tuple[str, ...] = ()
    """What the optimisers want the log to say; written only when there are some."""
    saving_band: SavingBand | None = None
    """The target saving's band; written only when there is one."""
    memory_clocks_mhz: tuple[Annotated[int, Gt(0)], ...] = ()
    """One memory clock per pipeline rank; written only when some rank leaves the stock one."""
    smoothing: PlanSmoothing | None = None
    """A ``smooth:`` target's bound, filler windows per rank and the filler floor's cost (only then)."""
    checksum: str = ""
    """SHA-256 of the canonical JSON of the rest: checked before the fields are read, added by
    :func:`plan_text` after them."""

    @model_validator(mode="after")
    def _consistent(self) -> PlanFile:
        stages = {len(point.ranks) for point in self.points}
        baseline_stages = len(self.baseline.stage_energy_j)
        if len(stages) != 1 or (baseline_stages and baseline_stages not in stages):
            raise ValueError("every point and the baseline must cover the same number of ranks")
        (ranks,) = stages
        if self.target_index >= len(self.points):
            raise ValueError(f"target_index {self.target_index} is not one of the {len(self.points)} points")
        if self.measured_tail is not None and len(self.measured_tail.stage_energy_j) != ranks:
            given = len(self.measured_tail.stage_energy_j)
            raise ValueError(f"measured_tail gives {given} stage energies for {ranks} ranks")
        if self.memory_clocks_mhz and len(self.memory_clocks_mhz) != ranks:
            given = len(self.memory_clocks_mhz)
            raise ValueError(f"memory_clocks_mhz gives {given} memory clocks for {ranks} pipeline ranks")
        iteration_s = self.points[self.target_index].iteration_time_s
        problem = None if self.smoothing is None else self.smoothing.fit_problem(ranks, iteration_s)
        if problem is not None:
            raise ValueError(problem)
        target_j = sum(rank.energy_j for rank in self.points[self.target_index].ranks)
        nominal = energy_change(self.baseline.energy_j, target_j)
        if self.saving_band is not None and not self.saving_band.holds(nominal):
            band = self.saving_band
            raise ValueError(
                f"saving_band [{band.low:g}, {band.high:g}] does not hold the plan's own saving {nominal:g}"
            )
        return self

    @classmethod
    def of(cls, plan: Plan) -> PlanFile:
        """The file's content of ``plan`` (checked as when it is read back)."""
        return cls(
            schema_version=plan.schema_version,
            fingerprint=plan.fingerprint,
            gpu_name=plan.gpu_name,
            provenance=plan.provenance,
            target=plan.target,
            optimisers=plan.optimisers,
            switch_latency_s=plan.switch_latency_s,
            created_by=plan.created_by,
            baseline=plan.baseline,
            target_index=plan.target_index,
            points=tuple(PointFile.of(point) for point in plan.points),
            frontier=plan.frontier,
            measured_tail=plan.measured_tail,
            notes=plan.notes,
            saving_band=plan.saving_band,
            memory_clocks_mhz=plan.memory_clocks_mhz,
            smoothing=plan.smoothing,
        )

    def plan(self) -> Plan:
        """The plan this file describes."""
        return Plan(
            fingerprint=self.fingerprint,
            gpu_name=self.gpu_name,
            provenance=self.provenance,
            target=self.target,
            optimisers=self.optimisers,
            switch_latency_s=self.switch_latency_s,
            baseline=self.baseline,
            points=tuple(point.point() for point in self.points),
            target_index=self.target_index,
            frontier=self.frontier,
            measured_tail=self.measured_tail,
            notes=self.notes,
            memory_clocks_mhz=self.memory_clocks_mhz,
            saving_band=self.saving_band,
            smoothing=self.smoothing,
            created_by=self.created_by,
            schema_version=self.schema_version,
        )


def plan_text(plan: Plan) -> str:
    """The file's exact text of ``plan``: its content, then the checksum of that content.

    Raises:
        PlanError: The plan breaks a check of the file (it could not be read back).
    """
    try:
        body = PlanFile.of(plan).model_dump(exclude_defaults=True)
    except ValidationError as error:
        raise PlanError(f"the plan cannot be written: {_fields(error)}") from None
    body["checksum"] = _checksum(body)
    return json.dumps(body, indent=1) + "\n"


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write ``plan`` to ``path`` atomically (parent folders are created).

    Returns:
        The path written.

    Raises:
        PlanError: The plan breaks a check of the file.
    """
    target = Path(path)
    write_atomically(target, plan_text(plan))
    return target


def load_plan(path: str | Path, expected_fingerprint: str | None = None) -> Plan:
    """Read a plan written by :func:`save_plan` and check it.

    Args:
        path: The plan file.
        expected_fingerprint: When given, the plan must have been computed for this job and GPU.

    Raises:
        PlanError: If the file is missing, not JSON, of another schema version, modified after it was
            written, malformed (the message names the field), or planned for another job or GPU.
    """
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as error:
        raise PlanError(f"cannot read plan file {source}: {error.strerror}; rerun planning") from None
    return read_plan(text, source=str(source), expected_fingerprint=expected_fingerprint)


def read_plan(text: str, source: str = "<plan>", expected_fingerprint: str | None = None) -> Plan:
    """Parse and check a plan file's text (see :func:`load_plan`).

    Raises:
        PlanError: Not JSON, of another schema version, modified after it was written, malformed, or
            planned for another job or GPU; the message says which and what to do.
    """
    _check_envelope(text, source)
    try:
        plan = PlanFile.model_validate_json(text, strict=True).plan()
        check_memory_clocks(plan.memory_clocks_mhz, plan.gpu_name)
    except (ValidationError, EnergyValueError) as error:
        problem = _fields(error) if isinstance(error, ValidationError) else str(error)
        raise PlanError(f"plan file {source} is malformed ({problem}): delete it or rerun planning") from None
    if expected_fingerprint is not None and plan.fingerprint != expected_fingerprint:
        raise PlanError(
            f"plan file {source} was computed for another job or GPU (its fingerprint "
            f"{plan.fingerprint[:16]}, this job's {expected_fingerprint[:16]}): rerun planning for this "
            "job, or use the plan with the job it was made for"
        )
    return plan


def stale_plan_version(text: str) -> int | None:
    """The schema version of a plan file's text when it is not this software's; ``None`` when it is.

    A plan cached by an older version is not migrated: its job profiles again (``planning_round.cache``).
    Text that is not a plan file counts as current here (reading it says what is wrong).
    """
    try:
        version = json.loads(text).get("schema_version")
    except (ValueError, AttributeError):
        return None
    return version if isinstance(version, int) and version != SCHEMA_VERSION else None


def _check_envelope(text: str, source: str) -> None:
    """Refuse text that is not a JSON object of this schema version whose checksum matches its content."""
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as error:
        raise PlanError(
            f"plan file {source} is not valid JSON ({error}); it is damaged or not a plan: delete it or "
            "rerun planning"
        ) from None
    if not isinstance(data, dict):
        raise PlanError(f"plan file {source} does not hold a JSON object: delete it or rerun planning")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise PlanError(
            f"plan file {source} has schema version {version!r}; this megatron_energy ({__version__}) "
            f"reads version {SCHEMA_VERSION}: rerun planning with this version"
        )
    body = {key: value for key, value in data.items() if key != "checksum"}
    if data.get("checksum") != _checksum(body):
        raise PlanError(
            f"plan file {source} was modified after it was written (checksum mismatch); plans must not "
            "be edited by hand: delete it or rerun planning"
        )


def _fields(error: ValidationError) -> str:
    """The first field errors of a refusal, each with its place in the file."""
    problems = error.errors(include_url=False)
    named = [f"{_place(problem['loc'])}: {problem['msg']}" for problem in problems[:MAX_ERRORS]]
    more = len(problems) - MAX_ERRORS
    return "; ".join(named) + (f"; and {more} more" if more > 0 else "")


def _place(loc: tuple[int | str, ...]) -> str:
    """``points[0].ranks[1].actions[3].clock.at.kind`` from pydantic's location tuple."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".") or "the plan"


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number a plan may hold")


def _checksum(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
