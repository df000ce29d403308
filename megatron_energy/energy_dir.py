"""The energy directory (``--energy-dir``): every file's name and place, and the job facts it is keyed by.

Layout::

    <energy dir>/
        last_job.json                  the record of the job that ran most recently (:class:`JobRecord`)
        simulated/rank<r>.json         each rank's simulated GPU state (``dvfs.simulated``)
        overhead-check-rank<r>.json    each rank's overhead-check pairs (``energy_log.overhead_check``)
        megatron-output/rank<r>.log    Megatron's argument list and known warnings (``launch_output``)
        demo/                          the demo's rank output, energy log, TensorBoard (``commands.demo_job``)
        <fingerprint>/                 one job (:class:`JobFiles`), cached by ``planning_round.cache``:
            job.json                   its record: the facts its fingerprint was made of (:class:`JobFacts`)
            profile.csv                the profile it was planned from (``pipeline.profile.Profile``)
            baseline.json              the stock baseline measured while profiling
            plan.json                  the plan that runs (``plan.Plan``)
            frontier.csv               the plan's instant-switch frontier
            measured.json              what else profiling measured (``runtime.profiling.measured_inputs``)
            manifest.json              checksum and size of each of the above (``cache_manifest``)
            quarantine-<time>-<pid>/   a set that failed verification, moved aside
            frontier.png, timeline.json   the report's plot and Perfetto trace (``report.job_report``)
            power_trace.rank<r>.jsonl  each rank's power readings (``--energy-power-trace``; or ``.csv``)
            profile.partial.rank<r>.csv   what rank r measured of a profiling cut short by the job's end
                                       (``runtime.profiling.partial_profile``; not cached, not reused)

This module owns the names and the paths; :class:`JobArtefacts` maps the cached files' names to their roles
(the cache writes and verifies them as bytes, each type writes and reads its own text), and
:class:`JobRecord` is the one writer and reader of ``job.json`` and ``last_job.json``. The job facts are a
typed value (:class:`JobFacts`, :class:`PlanningInputs`); :meth:`JobFacts.to_parts` is the mapping their
fingerprint is the SHA-256 of, key for key what earlier versions wrote, so existing caches keep their keys.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_energy.pipeline.chunk_layers import ChunkLayers
from megatron_energy.pipeline.job_collectives import CollectiveSetup
from megatron_energy.pipeline.workload import TransformerShape
from megatron_energy.plan import FINGERPRINT_DIGITS, fingerprint

LAST_JOB = "last_job.json"
"""The record of the job that ran most recently, in the energy directory itself."""
JOB_RECORD = "job.json"
PROFILE = "profile.csv"
BASELINE = "baseline.json"
PLAN = "plan.json"
FRONTIER = "frontier.csv"
MEASURED = "measured.json"
MANIFEST = "manifest.json"
QUARANTINE_PREFIX = "quarantine-"
FRONTIER_PLOT = "frontier.png"
TIMELINE = "timeline.json"
POWER_TRACE = "power_trace"
"""The stem of each rank's power trace file (``--energy-power-trace``)."""
PARTIAL_PROFILE = "profile.partial"
"""The stem of each rank's partial profile (a job that ended while profiling); never part of a cached set."""
SIMULATED = "simulated"
"""The folder of the simulated GPUs' state files."""
MEGATRON_OUTPUT = "megatron-output"
"""The folder of Megatron's argument list and known warnings, per rank, that the launcher keeps off the
console."""

REQUIRED_ARTEFACTS: tuple[str, ...] = (PLAN, BASELINE, PROFILE)
"""What a cached job must hold to skip profiling and planning: the plan that runs, the stock baseline it is
measured against, and the profile it was planned from (for reports)."""
PROFILE_ARTEFACTS: tuple[str, ...] = (BASELINE, PROFILE)
"""What a cached run must hold to be planned again without profiling (with its measured inputs, which the
re-planner checks): a run whose target could not be met holds these and no plan."""
PLANNED_ARTEFACTS: tuple[str, ...] = (PLAN, FRONTIER)
"""What planning made from the profile: one that fails verification is set aside alone and planned again
from the verified profile, which is kept (``runtime.planning_round.cache``)."""


def partial_profile_name(rank: int | str) -> str:
    """The file name of global rank ``rank``'s partial profile (``"<r>"`` names any rank's, for a message)."""
    return f"{PARTIAL_PROFILE}.rank{rank}.csv"


def is_partial_profile(name: str) -> bool:
    """Whether the file name ``name`` is a rank's partial profile (:func:`partial_profile_name`)."""
    return name.startswith(f"{PARTIAL_PROFILE}.rank") and name.endswith(".csv")


def is_run_file(name: str) -> bool:
    """Whether ``name`` is a file a run writes into its job's folder beside the cached set, never part of it.

    A rank's partial profile and its power trace (``JobFiles.power_trace``): the cache neither lists,
    verifies nor quarantines them.
    """
    return is_partial_profile(name) or name.startswith(f"{POWER_TRACE}.rank")


def simulated_state_path(root: Path, rank: int) -> Path:
    """The state file of global rank ``rank``'s simulated GPU under the energy directory ``root``."""
    return Path(root) / SIMULATED / f"rank{rank}.json"


def megatron_output_path(root: Path, rank: int) -> Path:
    """What the launcher keeps off global rank ``rank``'s console (``launch_output``) under ``root``."""
    return Path(root) / MEGATRON_OUTPUT / f"rank{rank}.log"


def overhead_pairs_path(root: Path, rank: int) -> Path:
    """The overhead check's pairs of global rank ``rank`` under the energy directory ``root``."""
    return Path(root) / f"overhead-check-rank{rank}.json"


@dataclass(frozen=True)
class JobFiles:
    """The files of one job folder, ``<energy dir>/<fingerprint>``."""

    folder: Path
    """The folder; its name is the job's (short) fingerprint."""

    @property
    def fingerprint(self) -> str:
        """The job's short fingerprint (the folder's name), which its plan carries."""
        return self.folder.name

    @property
    def record(self) -> Path:
        """``job.json``: the job's facts (:class:`JobRecord`)."""
        return self.folder / JOB_RECORD

    @property
    def profile(self) -> Path:
        """``profile.csv``."""
        return self.folder / PROFILE

    @property
    def baseline(self) -> Path:
        """``baseline.json``."""
        return self.folder / BASELINE

    @property
    def plan(self) -> Path:
        """``plan.json``."""
        return self.folder / PLAN

    @property
    def measured(self) -> Path:
        """``measured.json``."""
        return self.folder / MEASURED

    @property
    def frontier_plot(self) -> Path:
        """``frontier.png``, the report's."""
        return self.folder / FRONTIER_PLOT

    @property
    def timeline(self) -> Path:
        """``timeline.json``, the report's."""
        return self.folder / TIMELINE

    def partial_profile(self, rank: int) -> Path:
        """``profile.partial.rank<rank>.csv``: what rank ``rank`` measured of a profiling cut short.

        The profile CSV's columns (``runtime.profiling.partial_profile``); the cache neither lists nor reuses
        it.
        """
        return self.folder / partial_profile_name(rank)

    def power_trace(self, rank: int, suffix: str) -> Path:
        """``power_trace.rank<rank>.<suffix>``: rank ``rank``'s power readings (``jsonl`` or ``csv``)."""
        return self.folder / f"{POWER_TRACE}.rank{rank}.{suffix}"


@dataclass(frozen=True)
class JobArtefacts:
    """The cached files of one job by role, as text: what the cache stores and what it hands back."""

    profile_csv: str
    """``profile.csv``: the profile the plan is made from."""

    baseline_json: str
    """``baseline.json``: the stock baseline measured while profiling."""

    plan_json: str | None = None
    """``plan.json``: the plan that runs; ``None`` for a run whose target could not be met."""

    frontier_csv: str | None = None
    """``frontier.csv``: the plan's instant-switch frontier; ``None`` when not written."""

    measured_json: str | None = None
    """``measured.json``: what profiling measured besides the profile (a re-plan needs it)."""

    def files(self) -> dict[str, str]:
        """File name -> text of every artefact there is, as the cache stores them."""
        named = {
            PLAN: self.plan_json,
            BASELINE: self.baseline_json,
            PROFILE: self.profile_csv,
            FRONTIER: self.frontier_csv,
            MEASURED: self.measured_json,
        }
        return {name: text for name, text in named.items() if text}

    @classmethod
    def of_files(cls, files: Mapping[str, bytes]) -> JobArtefacts:
        """The artefacts of a verified set of files (file name -> content).

        Raises:
            ValueError: The set holds no profile or no baseline, or a file is not UTF-8 text.
        """
        text = {name: content.decode("utf-8") for name, content in files.items()}
        missing = [name for name in PROFILE_ARTEFACTS if name not in text]
        if missing:
            raise ValueError(f"the cached set holds no {', '.join(missing)}")
        return cls(
            profile_csv=text[PROFILE],
            baseline_json=text[BASELINE],
            plan_json=text.get(PLAN),
            frontier_csv=text.get(FRONTIER),
            measured_json=text.get(MEASURED),
        )


@dataclass(frozen=True)
class PlanningInputs:
    """The planning inputs a cached plan depends on besides the job: a change to any of them re-plans."""

    mode: str
    """``--energy-mode``."""

    target: str
    """``--energy-target``, as text."""

    switch_latency_s: float
    """The GPU spec's SM-clock switch latency."""

    phase_switching: str
    """``--energy-phase-switching``."""

    gpu_spec: Mapping[str, Any]
    """Every figure of the GPU spec the plan is modelled with (its fields but ``sources``)."""

    memory_clock: str = "auto"
    """``--energy-memory-clock``; only a value other than ``auto`` is part of the facts (so plans cached
    before the flag keep their keys)."""

    def to_parts(self) -> dict[str, Any]:
        """The inputs as the job record holds them, one entry per input."""
        parts = {
            "mode": self.mode,
            "target": self.target,
            "switch_latency_s": self.switch_latency_s,
            "phase_switching": self.phase_switching,
            "gpu_spec": dict(self.gpu_spec),
        }
        return parts | ({"memory_clock": self.memory_clock} if self.memory_clock != "auto" else {})

    @classmethod
    def from_parts(cls, parts: Mapping[str, Any]) -> PlanningInputs:
        """Read back :meth:`to_parts`.

        Raises:
            ValueError: Not such a mapping.
        """
        _check_keys("planning", parts, {field.name for field in dataclasses.fields(cls)}, {"memory_clock"})
        return cls(**{**parts, "gpu_spec": dict(parts["gpu_spec"])})


@dataclass(frozen=True)
class JobFacts:
    """What a cached profile and plan depend on: the job, the GPU, and how it was profiled and planned.

    Built by ``runtime.context.JobContext.job_facts`` and the session's assembly; every rank of a job has the
    same facts. Their fingerprint (:attr:`full_fingerprint`) keys the job's cache folder.
    """

    model: TransformerShape | None
    """The model's transformer shape; ``None``: not known."""

    pipeline_size: int
    """Pipeline stages."""

    num_chunks: int
    """Model chunks per stage (virtual pipeline size)."""

    tensor_parallel_size: int
    """Tensor-parallel degree."""

    data_parallel_size: int
    """Data-parallel replicas."""

    num_microbatches: int
    """Microbatches per iteration (per replica)."""

    microbatch_group_size: int | None
    """Megatron's ``microbatch_group_size_per_vp_stage``; ``None``: the pipeline size."""

    gpu: str
    """The GPU spec's name."""

    collectives: CollectiveSetup | None
    """The job's collectives as configured, without any rank's own bucket layout; ``None``: not known."""

    layers: ChunkLayers | None = None
    """Decoder layers of every model chunk when a layout places them; ``None``: Megatron's even split."""

    combined_1f1b: bool = False
    """Megatron runs its combined 1F1B schedule."""

    full_iteration_graph: bool = False
    """Megatron captures the whole step as one CUDA graph."""

    grid_mhz: tuple[int, ...] | None = None
    """The profiling grid of SM clocks; ``None``: not set (facts of the job alone)."""

    planning: PlanningInputs | None = None
    """The planning inputs; ``None``: not set (facts of the job alone)."""

    clock_control: bool | None = None
    """Whether every rank could set its clocks (else only the stock clock was measured); ``None``: not set."""

    def to_parts(self) -> dict[str, Any]:
        """The facts as the job record holds them, and as their fingerprint is made.

        The optional facts appear only where set (a layout, combined 1F1B, a captured step, the grid, the
        planning inputs, the clock control), so the jobs cached before each existed keep their fingerprints.
        """
        setup = self.collectives
        parts: dict[str, Any] = {
            "model": None if self.model is None else self.model.identity(),
            "pipeline_size": self.pipeline_size,
            "num_chunks": self.num_chunks,
            "tensor_parallel_size": self.tensor_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "num_microbatches": self.num_microbatches,
            "microbatch_group_size": self.microbatch_group_size,
            "gpu": self.gpu,
            "collectives": None if setup is None else dataclasses.asdict(setup) | {"buckets": None},
        }
        if self.layers is not None:
            parts["layers"] = [list(row) for row in self.layers.counts]
        if self.combined_1f1b:
            parts["combined_1f1b"] = True
        if self.full_iteration_graph:
            parts["full_iteration_graph"] = True
        if self.grid_mhz is not None:
            parts["grid_mhz"] = list(self.grid_mhz)
        if self.planning is not None:
            parts["planning"] = self.planning.to_parts()
        if self.clock_control is not None:
            parts["clock_control"] = self.clock_control
        return parts

    @classmethod
    def from_parts(cls, parts: Mapping[str, Any]) -> JobFacts:
        """Read back :meth:`to_parts` (a job record's ``parts``).

        Raises:
            ValueError: Not the facts of a job (a key unknown or missing, a value of another type).
        """
        optional = {
            "layers",
            "combined_1f1b",
            "full_iteration_graph",
            "grid_mhz",
            "planning",
            "clock_control",
        }
        _check_keys("job facts", parts, {field.name for field in dataclasses.fields(cls)}, optional)
        try:
            model, setup, layers, planning = (
                parts.get(key) for key in ("model", "collectives", "layers", "planning")
            )
            grid = parts.get("grid_mhz")
            return cls(
                model=None if model is None else TransformerShape.from_dict(model),
                pipeline_size=int(parts["pipeline_size"]),
                num_chunks=int(parts["num_chunks"]),
                tensor_parallel_size=int(parts["tensor_parallel_size"]),
                data_parallel_size=int(parts["data_parallel_size"]),
                num_microbatches=int(parts["num_microbatches"]),
                microbatch_group_size=parts["microbatch_group_size"],
                gpu=str(parts["gpu"]),
                collectives=None if setup is None else CollectiveSetup.from_dict(setup),
                layers=None if layers is None else ChunkLayers(tuple(tuple(row) for row in layers)),
                combined_1f1b=bool(parts.get("combined_1f1b", False)),
                full_iteration_graph=bool(parts.get("full_iteration_graph", False)),
                grid_mhz=None if grid is None else tuple(int(clock) for clock in grid),
                planning=None if planning is None else PlanningInputs.from_parts(planning),
                clock_control=parts.get("clock_control"),
            )
        except (TypeError, AttributeError) as error:
            raise ValueError(f"not the facts of a job ({error})") from None

    @property
    def full_fingerprint(self) -> str:
        """The SHA-256 of the facts (:meth:`to_parts`): the cache manifest's job fingerprint."""
        return fingerprint(**self.to_parts())

    @property
    def fingerprint(self) -> str:
        """The short fingerprint: the job folder's name, which the job's plans carry."""
        return self.full_fingerprint[:FINGERPRINT_DIGITS]

    def profile_facts(self) -> JobFacts:
        """The facts a profile depends on: all but the planning inputs."""
        return dataclasses.replace(self, planning=None)


@dataclass(frozen=True)
class JobRecord:
    """``job.json`` of a job folder and ``last_job.json`` of the energy directory: a job and its facts."""

    fingerprint: str
    """The job's short fingerprint (its folder's name)."""

    facts: JobFacts
    """What the fingerprint was made of."""

    @classmethod
    def of(cls, facts: JobFacts) -> JobRecord:
        """The record of a job with these facts."""
        return cls(facts.fingerprint, facts)

    def to_json(self) -> str:
        """The record's text, as the cache writes it."""
        return json.dumps(
            {"fingerprint": self.fingerprint, "parts": self.facts.to_parts()}, indent=2, default=str
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> JobRecord:
        """Parse :meth:`to_json`'s text.

        Raises:
            ValueError: The text is not a job record.
        """
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("parts"), dict):
            raise ValueError("not a job record (no parts)")
        return cls(str(data.get("fingerprint")), JobFacts.from_parts(data["parts"]))

    @classmethod
    def read(cls, path: Path) -> JobRecord:
        """Read a record file.

        Raises:
            OSError: The file cannot be read.
            ValueError: It is not a job record.
        """
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


def latest_fingerprint(root: Path) -> str:
    """The short fingerprint of the job that ran most recently under the energy directory ``root``.

    Raises:
        OSError: ``last_job.json`` cannot be read.
        ValueError: It is not a job record.
    """
    return JobRecord.read(Path(root) / LAST_JOB).fingerprint


def _check_keys(what: str, parts: Mapping[str, Any], known: set[str], optional: set[str]) -> None:
    """Refuse a mapping with a key unknown or a required one missing (then it is not ``what``)."""
    if not isinstance(parts, Mapping):
        raise ValueError(f"{what} must be a mapping, got {type(parts).__name__}")
    unknown = sorted(set(parts) - known)
    missing = sorted(known - optional - set(parts))
    if unknown or missing:
        raise ValueError(f"not {what}: unknown key(s) {unknown}, missing key(s) {missing}")
