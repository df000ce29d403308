"""Plan v2: the one executable contract between the optimisers and the runtime, as checked JSON.

Every optimiser emits a :class:`Plan`; the session runs exactly what the file says (a cache hit loads the
cached file, the report reads the file that ran). A plan holds:

- a few executable **points** of the time–energy frontier (ascending iteration time), one of them the
  target's; the others let data-parallel replicas follow a straggler's pace without re-planning;
- per point and per pipeline rank, **actions** at **boundaries**: a boundary is one instruction (the shared
  identity ``Instruction(stage, chunk, microbatch, kind)``) and optionally a named phase inside it; an
  action is a clock to lock there (:class:`ClockAction`) or a collective to launch there with an SM/CTA
  budget (:class:`CollectiveAction`);
- per point and per rank, the predicted energy and busy time; per point the iteration time, the deadline
  it was solved for and the relaxed lower bound (all *modelled*);
- the all-maximum-clocks baseline and the instant-switch frontier curve (for reports and plots);
- the measured iteration tail (optional, :class:`MeasuredTail`): the time and energy of an iteration outside
  the pipeline instructions, measured while profiling, which the baseline's and every point's predictions
  include;
- the target saving's band (optional, :class:`~megatron_energy.plan_band.SavingBand`): its lowest and highest
  value over the GPU spec's declared ranges, checked to hold the plan's own saving;
- provenance: the job fingerprint, GPU, whether the profile was measured or modelled, the optimisers that
  made it, the switch latency it was made executable under, and the writing software's version;
- optionally, one memory clock per rank, locked for the whole run phase (:mod:`megatron_energy.plan_memory`);
  absent when every rank keeps the stock memory clock.

The file is plain JSON parsed with :func:`json.loads` (never evaluated), versioned and checksummed (SHA-256
of its canonical content), so a stale, foreign, hand-edited or truncated plan is refused with a message
saying what is wrong and what to do. Version-1 files (one clock per instruction, no alternatives) are
migrated on load; version-2 files written before the measured tail existed read as plans without one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from megatron_energy import __version__
from megatron_energy.atomic import write_atomically
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.instruction import KINDS, FusedInstruction, Instruction, Step, StepKey
from megatron_energy.plan_band import SavingBand, energy_change
from megatron_energy.plan_memory import check_memory_clocks, memory_clocks_json, parse_memory_clocks

SCHEMA_VERSION = 2
"""Version of the JSON layout written by :meth:`Plan.save`; bump it when the layout changes."""

Provenance = Literal["measured", "modelled", "simulated"]
PROVENANCES: tuple[str, ...] = ("measured", "modelled", "simulated")


class PlanError(EnergyValueError):
    """A plan file cannot be used; the message says why and what to do."""


class Boundary(NamedTuple):
    """Where an action takes effect: the start of an instruction, or of a named phase inside it."""

    instruction: Instruction
    """The instruction (of a fused step: its forward, with which the step starts)."""
    phase: str | None = None
    """A phase (kernel group) inside the instruction; ``None`` for the instruction's start."""
    backward: Instruction | None = None
    """Combined 1F1B: the backward run with ``instruction`` as one fused step; ``None`` for a single pass."""

    @property
    def step(self) -> Step:
        """The DAG node the boundary belongs to: the instruction, or the fused step it starts."""
        return (
            self.instruction if self.backward is None else FusedInstruction(self.instruction, self.backward)
        )


def step_boundary(step: Step, phase: str | None = None) -> Boundary:
    """The boundary at the start of a step (or of a phase inside it)."""
    if isinstance(step, FusedInstruction):
        return Boundary(step.forward, phase, step.backward)
    return Boundary(step, phase)


@dataclass(frozen=True)
class ClockAction:
    """Lock the SM clock at a boundary (until the next clock action of the rank)."""

    at: Boundary
    """Where the clock takes effect."""
    clock_mhz: int
    """SM clock to lock."""


@dataclass(frozen=True)
class CollectiveAction:
    """Launch a collective at a boundary, with a budget of SMs (CTAs) for its kernels."""

    at: Boundary
    """The launch point."""
    collective: str
    """Which collective, e.g. ``dp.reduce_scatter.bucket0``."""
    max_ctas: int | None = None
    """CTAs (thread blocks, one per SM) the collective's kernels may use; ``None``: the library's default."""


Action = ClockAction | CollectiveAction


@dataclass(frozen=True)
class RankPlan:
    """What one pipeline rank does at one point, and what that is predicted to cost (modelled)."""

    actions: tuple[Action, ...]
    """Actions in execution order."""
    energy_j: float
    """Predicted energy of the rank's GPU per iteration (busy + blocked + idle)."""
    busy_s: float
    """Predicted time the rank's GPU computes per iteration."""


@dataclass(frozen=True)
class PlanPoint:
    """One executable point of the frontier: every rank's actions and the predicted iteration."""

    label: str
    """What the point was chosen for, e.g. ``iso-time``, ``min-energy`` or ``time:1.234000``."""
    iteration_time_s: float
    """Predicted iteration time (modelled, with the plan's switch latency)."""
    deadline_s: float
    """The iteration-time budget the point was solved for."""
    lower_bound_j: float
    """Relaxed (continuous-clock, instant-switch) optimum at ``deadline_s``: no plan can use less."""
    ranks: tuple[RankPlan, ...]
    """Per pipeline rank."""

    @property
    def energy_j(self) -> float:
        """Predicted energy of one iteration over all pipeline ranks."""
        return sum(rank.energy_j for rank in self.ranks)

    @property
    def gap(self) -> float:
        """Relative distance of the predicted energy above the relaxed lower bound."""
        return self.energy_j / self.lower_bound_j - 1.0

    def clock_table(self, stage: int) -> dict[Instruction, int]:
        """The clock locked at each instruction start of one rank (a fused step's under its forward)."""
        return {
            step.forward if isinstance(step, FusedInstruction) else step: clock
            for step, clock in self.step_clocks(stage).items()
        }

    def step_clocks(self, stage: int) -> dict[Step, int]:
        """The clock locked at each step start of one rank, keyed by DAG node (fused steps as such)."""
        return {
            action.at.step: action.clock_mhz
            for action in self.ranks[stage].actions
            if isinstance(action, ClockAction) and action.at.phase is None
        }


class FrontierSample(NamedTuple):
    """One point of the instant-switch frontier curve (modelled)."""

    time_s: float
    """Iteration time of the instant-switch plan."""
    energy_j: float
    """Its energy over all ranks."""
    lower_bound_j: float
    """No plan meeting ``deadline_s`` uses less: the convex relaxation's energy there or, for a DAG of more
    than 8192 instructions where the sweep solves the relaxation at a few deadlines only, a dual bound of it
    (lower: the gap to it is overstated, never understated). Plan points always carry the relaxed optimum."""
    deadline_s: float
    """The deadline the plan was solved for."""


@dataclass(frozen=True)
class Baseline:
    """Every instruction at its fastest clock (the all-maximum-clocks iteration; modelled)."""

    iteration_time_s: float
    """Iteration time."""
    energy_j: float
    """Energy of one iteration over all ranks."""
    stage_energy_j: tuple[float, ...] = ()
    """Energy per rank (empty for plans migrated from version 1, which did not record it)."""


@dataclass(frozen=True)
class MeasuredTail:
    """The part of an iteration outside the pipeline instructions, measured while profiling at stock clocks.

    Gradient sync, optimizer step, data loading, logging: the time from the end of the replica's pipeline
    span to the next iteration's first instruction, and each stage's GPU's energy over it. The baseline's and
    every point's predicted iteration time and rank energies already include it (counted once, as measured:
    ``sim.simulator``); the plan keeps it so a measured pipeline span can be set against a point's prediction.
    """

    time_s: float
    """Its time, the same on every stage."""
    stage_energy_j: tuple[float, ...]
    """Each stage's GPU's energy over it."""


@dataclass(frozen=True)
class Plan:
    """A job's executable plan: frontier points with every rank's actions, and their predictions.

    Attributes:
        fingerprint: :func:`fingerprint` of the job and GPU the plan was computed for.
        gpu_name: GPU spec or device name the profile came from.
        provenance: The profile's source: ``"measured"`` on GPUs, ``"modelled"`` by the time/power model
            (extrapolated from the stock clock included), ``"simulated"`` on simulated GPUs.
        target: The planning target (``iso-time``, ``min-energy``, ``slowdown:X``).
        optimisers: The optimisers that made the plan, in the order they ran.
        switch_latency_s: SM-clock switch latency the points were made executable under.
        baseline: The all-maximum-clocks iteration.
        points: Executable points, ascending iteration time.
        target_index: The point chosen for ``target``.
        frontier: The instant-switch frontier curve the points were picked from.
        notes: What the optimisers want the log to say about how the plan was chosen (e.g. ``all`` left a
            part's refinement out); written to the file only when there are some.
        measured_tail: The measured time and energy outside the pipeline instructions that the predictions
            include; ``None`` when the profile had none (a CSV, a modelled job, an older plan).
        memory_clocks_mhz: The memory clock of each pipeline rank for the whole run phase (every point's
            predictions include it); empty when every rank keeps the stock (top) memory clock.
        saving_band: The target point's saving over the GPU spec's declared ranges
            (``optimisers.saving_band``); ``None`` for a plan made without it (an older plan, or before the
            band is priced); written to the file only when there is one.
        created_by: Name and version of the software that wrote the plan.
        schema_version: Layout version of the file.
    """

    fingerprint: str
    gpu_name: str
    provenance: Provenance
    target: str
    optimisers: tuple[str, ...]
    switch_latency_s: float
    baseline: Baseline
    points: tuple[PlanPoint, ...]
    target_index: int
    frontier: tuple[FrontierSample, ...] = ()
    measured_tail: MeasuredTail | None = None
    notes: tuple[str, ...] = ()
    memory_clocks_mhz: tuple[int, ...] = ()
    saving_band: SavingBand | None = None
    created_by: str = f"megatron_energy {__version__}"
    schema_version: int = SCHEMA_VERSION
    _tables: dict[tuple[int, int], dict[Instruction, int]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def num_stages(self) -> int:
        """Pipeline ranks the plan covers."""
        return len(self.points[self.target_index].ranks)

    @property
    def target_point(self) -> PlanPoint:
        """The point chosen for the target."""
        return self.points[self.target_index]

    def clock_for(self, stage: int, instruction: Instruction, point: int | None = None) -> int:
        """The clock locked at an instruction's start.

        Args:
            stage: Pipeline rank.
            instruction: The instruction.
            point: Index of the point; the target's when ``None``.

        Raises:
            PlanError: If the plan has no such rank or instruction (it was made for another schedule).
        """
        index = self.target_index if point is None else point
        if not 0 <= stage < self.num_stages:
            raise PlanError(f"the plan covers pipeline ranks 0..{self.num_stages - 1}, not rank {stage}")
        table = self._tables.get((index, stage))
        if table is None:
            table = self._tables[(index, stage)] = self.points[index].clock_table(stage)
        try:
            return table[instruction]
        except KeyError:
            raise PlanError(
                f"the plan has no clock for {instruction} on rank {stage}: it was made for another schedule "
                "(stages, microbatches, virtual pipeline size or group size); rerun planning"
            ) from None

    def memory_clock_for(self, stage: int) -> int | None:
        """The memory clock rank ``stage`` locks for the run phase; ``None``: the stock memory clock."""
        return self.memory_clocks_mhz[stage] if self.memory_clocks_mhz else None

    def index_for_time(self, time_s: float) -> int:
        """The least-energy point no slower than ``time_s`` (a straggler's pace).

        A pace faster than the target's keeps the target; past the minimum-energy point, that point.
        """
        if time_s <= self.target_point.iteration_time_s:
            return self.target_index
        feasible = [i for i, point in enumerate(self.points) if point.iteration_time_s <= time_s * (1 + 1e-9)]
        return min(feasible, key=lambda i: (self.points[i].energy_j, self.points[i].iteration_time_s))

    def to_json_dict(self) -> dict[str, Any]:
        """Return the plan as a JSON-ready dict, checksum included."""
        body = _content(self) | memory_clocks_json(self.memory_clocks_mhz)
        body["checksum"] = _checksum(body)
        return body

    def to_json_text(self) -> str:
        """The file's exact text."""
        return json.dumps(self.to_json_dict(), indent=1) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write the plan atomically (parent folders are created).

        Args:
            path: Destination file.

        Returns:
            The path written.
        """
        target = Path(path)
        write_atomically(target, self.to_json_text())
        return target

    @classmethod
    def load(cls, path: str | Path, expected_fingerprint: str | None = None) -> Plan:
        """Read a plan written by :meth:`save` (or a version-1 plan) and check it.

        Args:
            path: The plan file.
            expected_fingerprint: When given, the plan must have been computed for this job and GPU.

        Raises:
            PlanError: If the file is missing, not JSON, of an unknown schema version, modified after it was
                written, malformed, or planned for another job or GPU.
        """
        source = Path(path)
        try:
            text = source.read_text(encoding="utf-8")
        except OSError as error:
            raise PlanError(f"cannot read plan file {source}: {error.strerror}; rerun planning") from None
        return cls.from_json_text(text, source=str(source), expected_fingerprint=expected_fingerprint)

    @classmethod
    def from_json_text(
        cls, text: str, source: str = "<plan>", expected_fingerprint: str | None = None
    ) -> Plan:
        """Parse and check a plan file's text (see :meth:`load`)."""
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except ValueError as error:
            raise PlanError(
                f"plan file {source} is not valid JSON ({error}); it is damaged or not a plan: delete it or "
                "rerun planning"
            ) from None
        plan = cls.from_json_dict(data, source=source)
        if expected_fingerprint is not None and plan.fingerprint != expected_fingerprint:
            raise PlanError(
                f"plan file {source} was computed for another job or GPU (its fingerprint "
                f"{plan.fingerprint[:16]}, this job's {expected_fingerprint[:16]}): rerun planning for this "
                "job, or use the plan with the job it was made for"
            )
        return plan

    @classmethod
    def from_json_dict(cls, data: object, source: str = "<plan>") -> Plan:
        """Build a plan from parsed JSON, checking version, checksum and fields (see :meth:`load`)."""
        if not isinstance(data, dict):
            raise PlanError(f"plan file {source} does not hold a JSON object: delete it or rerun planning")
        version = data.get("schema_version")
        parser = _PARSERS.get(version) if isinstance(version, int) else None
        if parser is None:
            raise PlanError(
                f"plan file {source} has schema version {version!r}; this megatron_energy ({__version__}) "
                f"reads versions {sorted(_PARSERS)}: rerun planning with this version"
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
            return parser(body)
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise PlanError(
                f"plan file {source} is malformed ({error}): delete it or rerun planning"
            ) from None


FINGERPRINT_DIGITS = 16
"""Hex digits of a job fingerprint kept in plans and cache folder names."""


def fingerprint(**parts: object) -> str:
    """Return a stable identifier of a job and GPU: SHA-256 of the canonical JSON of ``parts``.

    Args:
        **parts: What identifies the job, e.g. ``model=...``, ``parallelism=...``, ``gpu=...``; the same
            parts in any keyword order give the same fingerprint.

    Returns:
        A 64-character hexadecimal digest.
    """
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str, allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------------------- writing


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number a plan may hold")


def _checksum(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _boundary_json(at: Boundary) -> dict[str, Any]:
    stage, chunk, microbatch, kind = at.instruction
    body: dict[str, Any] = {"stage": stage, "chunk": chunk, "microbatch": microbatch, "kind": kind}
    if at.phase is not None:
        body["phase"] = at.phase
    if at.backward is not None:
        body |= {"backward_chunk": at.backward.chunk, "backward_microbatch": at.backward.microbatch}
    return body


def _action_json(action: Action) -> dict[str, Any]:
    if isinstance(action, ClockAction):
        return {"type": "clock", "at": _boundary_json(action.at), "clock_mhz": action.clock_mhz}
    return {
        "type": "collective",
        "at": _boundary_json(action.at),
        "collective": action.collective,
        "max_ctas": action.max_ctas,
    }


def _content(plan: Plan) -> dict[str, Any]:
    return (
        {
            "schema_version": plan.schema_version,
            "fingerprint": plan.fingerprint,
            "gpu_name": plan.gpu_name,
            "provenance": plan.provenance,
            "target": plan.target,
            "optimisers": list(plan.optimisers),
            "switch_latency_s": plan.switch_latency_s,
            "created_by": plan.created_by,
            "baseline": {
                "iteration_time_s": plan.baseline.iteration_time_s,
                "energy_j": plan.baseline.energy_j,
                "stage_energy_j": list(plan.baseline.stage_energy_j),
            },
            "target_index": plan.target_index,
            "points": [
                {
                    "label": point.label,
                    "iteration_time_s": point.iteration_time_s,
                    "deadline_s": point.deadline_s,
                    "lower_bound_j": point.lower_bound_j,
                    "ranks": [
                        {
                            "energy_j": rank.energy_j,
                            "busy_s": rank.busy_s,
                            "actions": [_action_json(action) for action in rank.actions],
                        }
                        for rank in point.ranks
                    ],
                }
                for point in plan.points
            ],
            "frontier": [list(sample) for sample in plan.frontier],
            "measured_tail": None
            if plan.measured_tail is None
            else {
                "time_s": plan.measured_tail.time_s,
                "stage_energy_j": list(plan.measured_tail.stage_energy_j),
            },
        }
        | ({"notes": list(plan.notes)} if plan.notes else {})
        | ({"saving_band": plan.saving_band.to_json()} if plan.saving_band is not None else {})
    )


# ----------------------------------------------------------------------------------------- reading


def _require(value: object, kind: type | tuple[type, ...], name: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _number(value: object, name: str) -> float:
    number = float(_require(value, (int, float), name))
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return number


def _index(value: object, name: str) -> int:
    number = _require(value, int, name)
    if number < 0:
        raise ValueError(f"{name} must not be negative, got {number}")
    return number


def _instruction(entry: Mapping[str, Any], stage: int, where: str) -> Instruction:
    kind = _require(entry["kind"], str, f"{where}.kind")
    if kind not in KINDS:
        raise ValueError(f"{where}.kind must be one of {KINDS}, got {kind!r}")
    instruction = Instruction(
        _index(entry.get("stage", stage), f"{where}.stage"),
        _index(entry["chunk"], f"{where}.chunk"),
        _index(entry["microbatch"], f"{where}.microbatch"),
        kind,
    )
    if instruction.stage != stage:
        raise ValueError(f"{where} is listed under rank {stage} but names stage {instruction.stage}")
    return instruction


def _boundary(entry: object, stage: int, where: str) -> Boundary:
    data = _require(entry, dict, where)
    phase = data.get("phase")
    if phase is not None:
        _require(phase, str, f"{where}.phase")
    backward = None
    if "backward_chunk" in data or "backward_microbatch" in data:
        backward = Instruction(
            stage,
            _index(data.get("backward_chunk"), f"{where}.backward_chunk"),
            _index(data.get("backward_microbatch"), f"{where}.backward_microbatch"),
            "backward",
        )
    return Boundary(_instruction(data, stage, where), phase, backward)


def _action(entry: object, stage: int, where: str) -> Action:
    data = _require(entry, dict, where)
    at = _boundary(data["at"], stage, f"{where}.at")
    kind = data.get("type")
    if kind == "clock":
        clock = _require(data["clock_mhz"], int, f"{where}.clock_mhz")
        if clock <= 0:
            raise ValueError(f"{where}.clock_mhz must be positive, got {clock}")
        return ClockAction(at, clock)
    if kind == "collective":
        budget = data.get("max_ctas")
        if budget is not None and _require(budget, int, f"{where}.max_ctas") < 1:
            raise ValueError(f"{where}.max_ctas must be at least 1, got {budget}")
        return CollectiveAction(at, _require(data["collective"], str, f"{where}.collective"), budget)
    raise ValueError(f"{where}.type must be 'clock' or 'collective', got {kind!r}")


def _rank(entry: object, stage: int, where: str) -> RankPlan:
    data = _require(entry, dict, where)
    actions = _require(data["actions"], list, f"{where}.actions")
    return RankPlan(
        actions=tuple(_action(item, stage, f"{where}.actions[{i}]") for i, item in enumerate(actions)),
        energy_j=_number(data["energy_j"], f"{where}.energy_j"),
        busy_s=_number(data["busy_s"], f"{where}.busy_s"),
    )


def _point(entry: object, where: str) -> PlanPoint:
    data = _require(entry, dict, where)
    ranks = _require(data["ranks"], list, f"{where}.ranks")
    if not ranks:
        raise ValueError(f"{where}.ranks is empty")
    return PlanPoint(
        label=_require(data["label"], str, f"{where}.label"),
        iteration_time_s=_number(data["iteration_time_s"], f"{where}.iteration_time_s"),
        deadline_s=_number(data["deadline_s"], f"{where}.deadline_s"),
        lower_bound_j=_number(data["lower_bound_j"], f"{where}.lower_bound_j"),
        ranks=tuple(_rank(rank, stage, f"{where}.ranks[{stage}]") for stage, rank in enumerate(ranks)),
    )


def _provenance(body: Mapping[str, Any]) -> Provenance:
    provenance = _require(body["provenance"], str, "provenance")
    if provenance not in PROVENANCES:
        raise ValueError(f"provenance must be one of {PROVENANCES}, got {provenance!r}")
    return provenance


def _frontier_sample(entry: object) -> FrontierSample:
    values = _require(entry, list, "frontier")
    if len(values) != len(FrontierSample._fields):
        raise ValueError(f"a frontier sample holds {', '.join(FrontierSample._fields)}; got {values}")
    return FrontierSample(*(_number(value, "frontier") for value in values))


def _measured_tail(entry: object, num_stages: int) -> MeasuredTail | None:
    """The optional measured tail (absent in plans written before it existed)."""
    if entry is None:
        return None
    data = _require(entry, dict, "measured_tail")
    energies = _require(data["stage_energy_j"], list, "measured_tail.stage_energy_j")
    if len(energies) != num_stages:
        raise ValueError(f"measured_tail gives {len(energies)} stage energies for {num_stages} ranks")
    return MeasuredTail(
        _number(data["time_s"], "measured_tail.time_s"),
        tuple(_number(value, "measured_tail.stage_energy_j") for value in energies),
    )


def _parse_v2(body: Mapping[str, Any]) -> Plan:
    raw_points = _require(body["points"], list, "points")
    points = tuple(_point(entry, f"points[{i}]") for i, entry in enumerate(raw_points))
    if not points:
        raise ValueError("points is empty")
    stages = {len(point.ranks) for point in points}
    raw_baseline = _require(body["baseline"], dict, "baseline")
    baseline = Baseline(
        _number(raw_baseline["iteration_time_s"], "baseline.iteration_time_s"),
        _number(raw_baseline["energy_j"], "baseline.energy_j"),
        tuple(
            _number(value, "baseline.stage_energy_j")
            for value in _require(raw_baseline["stage_energy_j"], list, "baseline.stage_energy_j")
        ),
    )
    if len(stages) != 1 or (baseline.stage_energy_j and len(baseline.stage_energy_j) not in stages):
        raise ValueError("every point and the baseline must cover the same number of ranks")
    target_index = _index(body["target_index"], "target_index")
    if target_index >= len(points):
        raise ValueError(f"target_index {target_index} is not one of the {len(points)} points")
    frontier = tuple(_frontier_sample(sample) for sample in _require(body["frontier"], list, "frontier"))
    gpu_name = _require(body["gpu_name"], str, "gpu_name")
    memory_clocks = parse_memory_clocks(body.get("memory_clocks_mhz"), len(points[0].ranks))
    check_memory_clocks(memory_clocks, gpu_name)
    return Plan(
        fingerprint=_require(body["fingerprint"], str, "fingerprint"),
        gpu_name=gpu_name,
        provenance=_provenance(body),
        target=_require(body["target"], str, "target"),
        optimisers=tuple(
            _require(name, str, "optimisers") for name in _require(body["optimisers"], list, "optimisers")
        ),
        switch_latency_s=_number(body["switch_latency_s"], "switch_latency_s"),
        baseline=baseline,
        points=points,
        target_index=target_index,
        frontier=frontier,
        measured_tail=_measured_tail(body.get("measured_tail"), len(points[0].ranks)),
        notes=tuple(_require(note, str, "notes") for note in _require(body.get("notes", []), list, "notes")),
        memory_clocks_mhz=memory_clocks,
        saving_band=_saving_band(body.get("saving_band"), baseline, points[target_index]),
        created_by=_require(body["created_by"], str, "created_by"),
        schema_version=SCHEMA_VERSION,
    )


def _saving_band(entry: object, baseline: Baseline, target: PlanPoint) -> SavingBand | None:
    """The optional band of the target's saving (absent in plans written before bands existed)."""
    if entry is None:
        return None
    return SavingBand.from_json(entry, energy_change(baseline.energy_j, target.energy_j))


def _parse_v1(body: Mapping[str, Any]) -> Plan:
    """Migrate a version-1 plan (one clock per instruction, one point, Perseus only) to version 2."""
    prediction = _require(body["prediction"], dict, "prediction")
    stage_energy = [_number(v, "prediction.stage_energy_j") for v in prediction["stage_energy_j"]]
    raw_ranks = _require(body["ranks"], list, "ranks")
    if not raw_ranks or len(raw_ranks) != len(stage_energy):
        raise ValueError(f"{len(raw_ranks)} ranks but {len(stage_energy)} per-stage energies")
    ranks = []
    for stage, instructions in enumerate(raw_ranks):
        actions: list[Action] = []
        for position, item in enumerate(_require(instructions, list, f"ranks[{stage}]")):
            entry = _require(item, dict, f"ranks[{stage}][{position}]")
            instruction = _instruction(entry, stage, f"ranks[{stage}][{position}]")
            actions.append(ClockAction(Boundary(instruction), _require(entry["clock_mhz"], int, "clock_mhz")))
        ranks.append(RankPlan(tuple(actions), stage_energy[stage], busy_s=0.0))
    point = PlanPoint(
        label=_require(body["target"], str, "target"),
        iteration_time_s=_number(prediction["iteration_time_s"], "prediction.iteration_time_s"),
        deadline_s=_number(prediction["deadline_s"], "prediction.deadline_s"),
        lower_bound_j=_number(prediction["lower_bound_j"], "prediction.lower_bound_j"),
        ranks=tuple(ranks),
    )
    return Plan(
        fingerprint=_require(body["fingerprint"], str, "fingerprint"),
        gpu_name=_require(body["gpu_name"], str, "gpu_name"),
        provenance=_provenance(body),
        target=point.label,
        optimisers=("perseus",),
        switch_latency_s=0.0,
        baseline=Baseline(
            _number(prediction["baseline_time_s"], "prediction.baseline_time_s"),
            _number(prediction["baseline_energy_j"], "prediction.baseline_energy_j"),
        ),
        points=(point,),
        target_index=0,
        created_by=_require(body["created_by"], str, "created_by"),
    )


_PARSERS: dict[int, Callable[[Mapping[str, Any]], Plan]] = {1: _parse_v1, 2: _parse_v2}


def clock_actions(clocks: Mapping[StepKey, int], order: Sequence[StepKey]) -> tuple[Action, ...]:
    """One clock action at the start of every step of ``order`` (instructions, or fused steps), in order."""
    return tuple(ClockAction(step_boundary(step), clocks[step]) for step in order)
