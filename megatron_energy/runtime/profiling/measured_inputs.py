"""What profiling measured that a plan is made from besides the profile and the baseline, as JSON.

A plan of the job is made from its profile (``profile.csv``), its stock baseline (``baseline.json``) and
these: what the optimiser's profile request had measured, the iteration tail outside the pipeline
instructions, the outside phases' durations, the instruction classes' phase timelines and every pipeline
rank's DDP bucket layout. The cache keeps them as ``measured.json`` beside the others, so a changed planning
input re-plans from the cached, verified measurements without profiling again
(``runtime.planning_round.replanning``). A phase's work is written with its compute time's kernel classes as a
typed object, ``"compute_mix": {"gemm_bf16": 0.75, "attention": 0.25}``, read back through ``ClassMix.of``
(a phase without one has no such key, as files written before kernel classes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from megatron_energy.dvfs.kernel_classes import ClassMix
from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.energy_dir import MEASURED
from megatron_energy.optimisers.interface import PlanningJob, ProfileRequest
from megatron_energy.pipeline.collectives import MeasuredBucket
from megatron_energy.pipeline.dag_nodes import IterationTail
from megatron_energy.pipeline.instruction import Work


@dataclass(frozen=True)
class MeasuredInputs:
    """The measurements a plan is made from besides the profile rows and the stock baseline."""

    request: ProfileRequest
    """What profiling was asked to measure (a re-plan needs no more than this)."""

    tail: IterationTail | None = None
    """The measured iteration tail (``planning.tail_from_profiling``); ``None``: none measured."""

    tail_phases: tuple[tuple[str, float], ...] = ()
    """Each outside phase's measured duration at the stock clock (``PlanningJob.tail_phases``)."""

    phase_timelines: Mapping[Work, Sequence[tuple[str, WorkProfile]]] | None = None
    """Measured phases per instruction class (``PlanningJob.phase_timelines``)."""

    buckets: tuple[MeasuredBucket, ...] | None = None
    """Every pipeline rank's measured DDP bucket layout; ``None``: modelled."""

    @classmethod
    def of_job(cls, job: PlanningJob, request: ProfileRequest) -> MeasuredInputs:
        """The measured parts of a job the session planned."""
        return cls(
            request=request,
            tail=job.tail,
            tail_phases=tuple(job.tail_phases),
            phase_timelines=job.phase_timelines,
            buckets=None if job.collectives is None else job.collectives.measured_buckets,
        )

    def to_json(self) -> str:
        """The inputs as the cache stores them."""
        timelines = self.phase_timelines
        data: dict[str, Any] = {
            "request": asdict(self.request),
            "tail": None
            if self.tail is None
            else {"outside_s": self.tail.outside_s, "stage_energy_j": list(self.tail.stage_energy_j)},
            "tail_phases": [list(phase) for phase in self.tail_phases],
            "phase_timelines": None
            if timelines is None
            else [
                {"work": list(work), "phases": [[name, _work_json(profile)] for name, profile in phases]}
                for work, phases in timelines.items()
            ],
            "buckets": None if self.buckets is None else [asdict(bucket) for bucket in self.buckets],
        }
        return json.dumps(data, indent=2, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> MeasuredInputs:
        """Parse :meth:`to_json`'s text.

        Raises:
            ValueError: The text is not such a record.
        """
        try:
            data = json.loads(text)
            tail, timelines, buckets = data["tail"], data["phase_timelines"], data["buckets"]
            return cls(
                request=ProfileRequest(**data["request"]),
                tail=None
                if tail is None
                else IterationTail.measured(tail["outside_s"], tail["stage_energy_j"]),
                tail_phases=tuple((str(name), float(seconds)) for name, seconds in data["tail_phases"]),
                phase_timelines=None if timelines is None else _timelines(timelines),
                buckets=None
                if buckets is None
                else tuple(
                    MeasuredBucket(**(bucket | {"layers": tuple(bucket["layers"])})) for bucket in buckets
                ),
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{MEASURED} does not hold measured planning inputs ({error})") from None


def _timelines(entries: Sequence[Mapping[str, Any]]) -> dict[Work, list[tuple[str, WorkProfile]]]:
    """Phase timelines from their JSON entries."""
    return {
        Work(*entry["work"]): [(str(name), _work(profile)) for name, profile in entry["phases"]]
        for entry in entries
    }


def _work_json(work: WorkProfile) -> dict[str, Any]:
    """A phase's work as JSON: its three times, and its class mix where it has one."""
    data: dict[str, Any] = {"compute_s": work.compute_s, "memory_s": work.memory_s, "fixed_s": work.fixed_s}
    if work.compute_mix is not None:
        data["compute_mix"] = work.compute_mix.as_dict()
    return data


def _work(entry: Mapping[str, Any]) -> WorkProfile:
    """A phase's work from :func:`_work_json`'s object (its mix checked by ``ClassMix.of``)."""
    mix = entry.get("compute_mix")
    return WorkProfile(
        float(entry["compute_s"]),
        float(entry["memory_s"]),
        float(entry["fixed_s"]),
        None if mix is None else ClassMix.of(mix),
    )


def _tail(entry: Mapping[str, Any]) -> IterationTail:
    return IterationTail.measured(float(entry["outside_s"]), [float(j) for j in entry["stage_energy_j"]])


def _bucket(entry: Mapping[str, Any]) -> MeasuredBucket:
    return MeasuredBucket(**(dict(entry) | {"layers": tuple(entry["layers"])}))
