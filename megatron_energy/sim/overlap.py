"""Simulate one iteration with collectives as first-class work beside computation (*modelled*).

The pipeline DAG (:class:`~megatron_energy.pipeline.dag.PipelineDag`) gives the instructions, transfers and
tail; an :class:`OverlapSchedule` adds the collectives of each stage, each a :class:`CommLaunch` on the
stage's collective stream (one stream per stage: launches run one after another, in the order they are
reached). A launch is anchored:

* ``"compute"``: at a fraction of an instruction's work (a layer boundary; 1.0 = the instruction's end);
* ``"prefetch"``: at the iteration start, before instruction ``waits_before`` may start (parameter
  all-gather with ``--overlap-param-gather``);
* ``"after_optimizer"``: after the stage's optimizer step, exposed (parameter all-gather by default).

Compute beside a running collective progresses at the :class:`~megatron_energy.sim.contention.ContentionModel`
rate and draws its overlap power; a collective beside no compute draws blocked power plus its own dynamic
power. The stage's gradient sync (``dp_sync`` tail step) waits until its collective stream is empty.

**Event-driven collectives.** A collective's end is not fixed at launch: after its latency, its bytes left
drain at its rate :meth:`~megatron_energy.sim.contention.CommLoad.rate_gbps`, which changes over its life
when it is packed: its per-SM ceiling beside compute differs from the one alone; a spread one keeps
``min(B, c x beta)`` throughout. Every change of what runs beside it (an instruction starting or ending,
another launch) is an event at which its rate is re-evaluated.

**Energy, per stage GPU, counted once per second of the iteration** (``T`` the iteration time)::

    static_j  = P_idle x T                           baseline power over the whole wall time, busy or not
    dynamic_j = sum over phases of (P_phase - P_idle) x t_phase

with the phases of a stage partitioning ``[0, T]``:

* ``compute``: instructions alone (power: the profile option's busy power at its clock);
* ``overlap``: instructions beside a collective (power: :meth:`ContentionModel.overlap`; the collective's
  dynamic power is inside it, not in ``comm``);
* ``comm``: a collective beside no compute (blocked power plus its dynamic power), tensor-parallel ones inside
  an instruction included;
* ``blocked``: waiting for another stage before the tail (blocked power);
* ``tail``: the optimizer step (modelled: idle power, so no dynamic energy) or a measured tail (its measured
  energy; its dynamic part is that minus ``P_idle`` x its time);
* ``idle``: after the stage's tail until the iteration ends (idle power: no dynamic energy).

**Tensor-parallel collectives** run inside every instruction (:class:`InlineComm`): the profile's time of
an instruction includes ``profiled_s`` of them, exposed, at idle power (as the workload model prices fixed
time); the schedule replaces that with ``comm_s`` at its budget, exposed or (``overlapped``, TE userbuffers)
beside the instruction's compute, which then runs at the contention rate until either finishes. A stage's
collective stream (data-parallel buckets) is modelled as if the tensor-parallel collectives were not there
(they use another communicator; their SMs are not subtracted twice).

So ``static_j + dynamic_j`` is the stage's total energy, and a stage's phase times add up to ``T``. PP
transfers take the schedule's per-stage durations (CTA budget) but their SM share and power are neglected
(one microbatch's activations, well under 1 % of an instruction).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.dag import PipelineDag, TailStep, Transfer
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.sim.contention import CommLoad, ContentionModel, OverlapState
from megatron_energy.sim.simulator import ProfileLike, SimResult, SimulatedStage, Slice

PHASES: tuple[str, ...] = ("compute", "overlap", "comm", "blocked", "tail", "idle")
"""The phases of a stage's iteration, in the order reports list them."""

Anchor = Literal["compute", "prefetch", "after_optimizer"]


@dataclass(frozen=True)
class CommLaunch:
    """One launch of a collective on a stage's collective stream.

    Attributes:
        name: What the launch is called in messages and traces (a collective's dotted name,
            ``str(CollectiveName)``; a benchmark's copy); never read back.
        stage: Pipeline stage.
        traffic_bytes: Bytes the GPU sends.
        load: Its CTA budget and link.
        anchor: Where it launches (module docstring).
        instruction: ``"compute"``: the instruction it launches in; ``"prefetch"``: the instruction that
            waits for it; ``None`` for ``"after_optimizer"``.
        fraction: ``"compute"``: the share of the instruction's work done at launch (0..1).
    """

    name: str
    stage: int
    traffic_bytes: float
    load: CommLoad
    anchor: Anchor
    instruction: Instruction | None = None
    fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.anchor != "after_optimizer" and self.instruction is None:
            raise EnergyValueError(f"launch {self.name}: anchor {self.anchor!r} needs an instruction")
        if not 0.0 <= self.fraction <= 1.0:
            raise EnergyValueError(f"launch {self.name}: fraction must lie in [0, 1], got {self.fraction}")

    @property
    def duration_s(self) -> float:
        """Its time alone (at the maximum SM clock)."""
        return self.load.duration_s(self.traffic_bytes)


@dataclass(frozen=True)
class InlinePart:
    """One tensor-parallel class's collectives inside an instruction.

    Attributes:
        comm_s: Their time per instruction at the schedule's budget, alone.
        load: Their CTA budget and link.
        overlapped: Beside the instruction's compute (TE userbuffers) rather than exposed.
    """

    comm_s: float
    load: CommLoad
    overlapped: bool = False


@dataclass(frozen=True)
class InlineComm:
    """Tensor-parallel collectives inside every instruction of one ``Work`` (module docstring).

    Attributes:
        parts: One per tensor-parallel class, in the order they run.
        profiled_s: Their time already inside the profile's instruction time (exposed, at idle power).
    """

    parts: tuple[InlinePart, ...]
    profiled_s: float


@dataclass(frozen=True)
class OverlapSchedule:
    """What the collectives of an iteration do (module docstring).

    Attributes:
        launches: Every launch, in each stage's launch order for launches reached at the same moment.
        transfer_s: Duration of a pipeline transfer sent by each stage; the DAG's own when absent.
        inline: Tensor-parallel collectives inside the instructions of each ``Work``; as profiled when absent.
    """

    launches: tuple[CommLaunch, ...] = ()
    transfer_s: Mapping[int, float] = field(default_factory=dict)
    inline: Mapping[Work, InlineComm] = field(default_factory=dict)


class PhaseEnergy(NamedTuple):
    """Time and energy of one phase of one stage (modelled)."""

    phase: str
    """One of :data:`PHASES`."""
    time_s: float
    """Seconds of the iteration in this phase."""
    static_j: float
    """``P_idle`` x ``time_s``."""
    dynamic_j: float
    """Energy above ``P_idle`` over those seconds."""


class CommSlice(NamedTuple):
    """One collective's interval on a stage's collective stream (modelled)."""

    stage: int
    """Pipeline stage."""
    name: str
    """Collective name."""
    start_s: float
    """Start."""
    end_s: float
    """End."""
    ctas: int
    """CTA budget."""
    overlapped_s: float
    """Seconds of it beside compute."""


@dataclass(frozen=True)
class StageOverlapEnergy:
    """One stage GPU over one iteration: its phases (modelled)."""

    stage: int
    phases: tuple[PhaseEnergy, ...]
    """One per :data:`PHASES` entry, in that order."""

    def phase(self, name: str) -> PhaseEnergy:
        """The phase called ``name``."""
        return self.phases[PHASES.index(name)]

    @property
    def static_j(self) -> float:
        """Static energy of the stage GPU (``P_idle`` x iteration time)."""
        return sum(p.static_j for p in self.phases)

    @property
    def dynamic_j(self) -> float:
        """Dynamic energy of the stage GPU."""
        return sum(p.dynamic_j for p in self.phases)

    @property
    def total_j(self) -> float:
        """Static plus dynamic."""
        return self.static_j + self.dynamic_j


@dataclass(frozen=True)
class OverlapResult:
    """A simulated iteration with collectives (modelled).

    Attributes:
        iteration_time_s: The iteration time.
        stages: Per stage GPU, its phases.
        timeline: Compute, transfer and tail slices (compute slices carry their energy).
        comm: Collective slices per stage stream.
        gpu_name: GPU spec name.
        profile_source: Where the instruction figures came from.
    """

    iteration_time_s: float
    stages: tuple[StageOverlapEnergy, ...]
    timeline: tuple[Slice, ...]
    comm: tuple[CommSlice, ...]
    gpu_name: str
    profile_source: str

    @property
    def total_energy_j(self) -> float:
        """Energy of one pipeline (one GPU per stage)."""
        return sum(stage.total_j for stage in self.stages)

    @property
    def static_j(self) -> float:
        """Static energy of one pipeline."""
        return sum(stage.static_j for stage in self.stages)

    @property
    def dynamic_j(self) -> float:
        """Dynamic energy of one pipeline."""
        return sum(stage.dynamic_j for stage in self.stages)

    def as_sim_result(self) -> SimResult:
        """The same iteration in the plain simulator's terms (busy = compute + overlap, blocked + comm)."""
        stages = []
        for stage in self.stages:
            part = {p.phase: p for p in stage.phases}

            def energy(*names: str, part: dict[str, PhaseEnergy] = part) -> float:
                return sum(part[n].static_j + part[n].dynamic_j for n in names)

            stages.append(
                SimulatedStage(
                    stage=stage.stage,
                    busy_s=part["compute"].time_s + part["overlap"].time_s,
                    blocked_s=part["blocked"].time_s + part["comm"].time_s,
                    idle_s=part["idle"].time_s,
                    busy_energy_j=energy("compute", "overlap"),
                    blocked_energy_j=energy("blocked", "comm"),
                    idle_energy_j=energy("idle"),
                    tail_s=part["tail"].time_s,
                    tail_energy_j=energy("tail"),
                )
            )
        return SimResult(
            self.iteration_time_s, stages, list(self.timeline), self.gpu_name, self.profile_source
        )


class _Pieces(NamedTuple):
    """An instruction alone: its time and its phases in order."""

    time_s: float
    parts: tuple[tuple[str, float, float], ...]


def _emit(
    out: list[tuple[float, float, str, float]], pieces: _Pieces, at_s: float, low: float, high: float
) -> float:
    """Segments of the instruction's work share ``[low, high)`` from ``at_s``; returns their energy."""
    energy, offset, cursor = 0.0, 0.0, at_s
    for phase, seconds, power in pieces.parts:
        a = max(low * pieces.time_s, offset)
        b = min(high * pieces.time_s, offset + seconds)
        if b > a:
            out.append((cursor, cursor + b - a, phase, power))
            energy += power * (b - a)
            cursor += b - a
        offset += seconds
    return energy


class _Stream:
    """One stage's collective stream: launches run one after another, each ending once its bytes are done.

    ``now_s`` is the time up to which progress is settled; the caller advances it (:meth:`advance`) over
    intervals in which whether compute runs beside is constant.
    """

    def __init__(self) -> None:
        self.now_s = 0.0
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.launches: list[CommLaunch] = []
        self.overlapped: list[float] = []
        self._latency_left_s = 0.0
        self._bytes_left = 0.0

    @property
    def head(self) -> int | None:
        """Index of the launch running at ``now_s`` (None when the stream is empty)."""
        return len(self.ends) if len(self.ends) < len(self.launches) else None

    @property
    def free_s(self) -> float:
        """End of its last launch (0 without launches); settled once :meth:`drain` ran."""
        return self.ends[-1] if self.ends else 0.0

    def push(self, launch: CommLaunch, at_s: float) -> None:
        """Launch at ``at_s`` (progress is settled alone up to it); it starts once the launches before end."""
        self.advance(at_s, beside=False)
        self.launches.append(launch)
        self.overlapped.append(0.0)
        if self.head == len(self.launches) - 1:
            self._start(self.now_s)

    def left_s(self, beside: bool) -> float:
        """Time the running launch needs to end, beside compute or not (inf when none)."""
        head = self.head
        if head is None:
            return math.inf
        rate = self.launches[head].load.rate_gbps(beside) * 1e9
        return self._latency_left_s + self._bytes_left / rate

    def advance(self, until_s: float, beside: bool) -> None:
        """Settle progress up to ``until_s``, beside compute or not.

        A launch that ends on the way lets the next one start then, in the same state.
        """
        while True:
            head = self.head
            if head is None:
                self.now_s = max(self.now_s, until_s)
                return
            left = self.left_s(beside)
            end_s = self.now_s + left
            if end_s <= until_s or math.isclose(end_s, until_s, rel_tol=1e-12):  # it ends; the next starts
                self.overlapped[head] += left if beside else 0.0
                self.now_s = end_s
                self.ends.append(end_s)
                if self.head is not None:
                    self._start(self.now_s)
                continue
            step = until_s - self.now_s
            if step <= 0:
                return
            self.overlapped[head] += step if beside else 0.0
            latency = min(step, self._latency_left_s)
            self._latency_left_s -= latency
            rate = self.launches[head].load.rate_gbps(beside) * 1e9
            self._bytes_left = max(0.0, self._bytes_left - (step - latency) * rate)
            self.now_s = until_s
            return

    def finish(self, index: int) -> float:
        """End of launch ``index``, settling progress alone (no compute beside) until it is done."""
        while len(self.ends) <= index:
            self.advance(self.now_s + self.left_s(beside=False), beside=False)
        return self.ends[index]

    def drain(self) -> float:
        """Settle every launch alone; the end of the last (or ``now_s`` when there are none)."""
        return self.finish(len(self.launches) - 1) if self.launches else self.now_s

    def _start(self, at_s: float) -> None:
        launch = self.launches[len(self.starts)]
        self.starts.append(at_s)
        self._latency_left_s = launch.load.latency_s
        self._bytes_left = launch.traffic_bytes


class OverlapSimulator:
    """Simulates a pipeline DAG with its collectives (module docstring)."""

    def __init__(self, dag: PipelineDag, profile: ProfileLike, spec: GpuSpec):
        """Prepare ``dag`` priced by ``profile`` on ``spec`` (powers, SMs, contention)."""
        self.dag = dag
        self.profile = profile
        self.spec = spec
        self.contention = ContentionModel(spec)
        self._options = {
            key: {o.clock_mhz: o for o in profile.options(key)}
            for key in {n.work for n in dag.compute_nodes()}
        }
        self._preds: list[list[int]] = [[] for _ in dag.nodes]
        for u, v in dag.edges_array().tolist():
            self._preds[v].append(u)
        self._overlaps: dict[tuple[Work, int, CommLoad, float], OverlapState] = {}

    def run(self, clocks: Mapping[Instruction, int] | None, schedule: OverlapSchedule) -> OverlapResult:
        """Simulate one iteration.

        Args:
            clocks: SM clock per instruction; its fastest option where absent.
            schedule: The collectives.

        Returns:
            Iteration time, per-stage phases and the timelines.

        Raises:
            EnergyValueError: If a launch names an instruction of no stage or of another stage.
        """
        dag, spec = self.dag, self.spec
        clocks = clocks or {}
        streams = [_Stream() for _ in range(dag.num_stages)]
        in_node: dict[Instruction, list[CommLaunch]] = {}
        waits: dict[Instruction, list[int]] = {}
        after_optimizer: list[list[CommLaunch]] = [[] for _ in range(dag.num_stages)]
        for launch in schedule.launches:
            if launch.instruction is not None and (
                launch.instruction not in dag.index or launch.instruction.stage != launch.stage
            ):
                raise EnergyValueError(
                    f"launch {launch.name} names {launch.instruction}, not one of its stage"
                )
            if launch.anchor == "compute":
                in_node.setdefault(launch.instruction, []).append(launch)  # type: ignore[arg-type]
            elif launch.anchor == "prefetch":
                assert launch.instruction is not None
                streams[launch.stage].push(launch, 0.0)
                waits.setdefault(launch.instruction, []).append(len(streams[launch.stage].launches) - 1)
            else:
                after_optimizer[launch.stage].append(launch)
        for items in in_node.values():
            items.sort(key=lambda item: item.fraction)

        n = len(dag.nodes)
        start, end = [0.0] * n, [0.0] * n
        segments: list[list[tuple[float, float, str, float]]] = [[] for _ in range(dag.num_stages)]
        timeline: list[Slice] = []
        fixed = dag.fixed_durations_s().tolist()
        attrs = dag.graph.nodes
        last_compute_end = [0.0] * dag.num_stages
        tail_fixed_s = [0.0] * dag.num_stages
        tail_energy = [0.0] * dag.num_stages
        for v, node in enumerate(dag.nodes):
            begin = max((end[u] for u in self._preds[v]), default=0.0)
            if isinstance(node, Instruction):
                stream = streams[node.stage]
                begin = max([begin, *(stream.finish(i) for i in waits.get(node, ()))])
                clock = clocks.get(node) or self.profile.fastest(node.work).clock_mhz
                pieces = self._pieces(node.work, clock, schedule.inline.get(node.work))
                finish, energy = self._compute(
                    node, clock, begin, in_node.get(node, []), streams, segments, pieces
                )
                start[v], end[v] = begin, finish
                last_compute_end[node.stage] = max(last_compute_end[node.stage], finish)
                timeline.append(Slice(node.stage, node, begin, finish, clock, node.kind, energy))
                continue
            duration = fixed[v]
            kind = attrs[node].get("kind", "")
            if isinstance(node, Transfer):
                duration = schedule.transfer_s.get(node.sender.stage, duration)
            elif isinstance(node, TailStep):
                stream = streams[node.stage]
                if node.name == "dp_sync":
                    duration = max(0.0, stream.drain() - begin)
                elif node.name == "optimizer":
                    for launch in after_optimizer[node.stage]:
                        stream.push(launch, begin + duration)
                    tail_fixed_s[node.stage] += duration
                    duration = max(duration, stream.drain() - begin)
                else:
                    tail_fixed_s[node.stage] += duration
                    tail_energy[node.stage] += dag.tail.energy_j(node.stage, spec.idle_power_w)
            start[v], end[v] = begin, begin + duration
            if attrs[node]["type"] in ("comm", "tail"):
                stage = attrs[node]["stage"]
                timeline.append(
                    Slice(
                        stage,
                        node,
                        begin,
                        begin + duration,
                        None,
                        "send" if isinstance(node, Transfer) else kind,
                        0.0,
                    )
                )
        iteration_s = end[-1]
        for stream in streams:
            stream.drain()
        stages = tuple(
            self._phases(
                s,
                iteration_s,
                segments[s],
                streams[s],
                tail_fixed_s[s],
                tail_energy[s],
                end,
                last_compute_end[s],
            )
            for s in range(dag.num_stages)
        )
        comm = tuple(
            CommSlice(
                s, launch.name, stream.starts[i], stream.ends[i], launch.load.ctas, stream.overlapped[i]
            )
            for s, stream in enumerate(streams)
            for i, launch in enumerate(stream.launches)
        )
        return OverlapResult(
            iteration_s, stages, tuple(timeline), comm, self.profile.gpu_name, self.profile.source
        )

    def overlap_state(self, work: Work, clock: int, load: CommLoad, profiled_s: float = 0.0) -> OverlapState:
        """Compute of ``work`` beside ``load``.

        ``profiled_s`` of its profiled time (exposed tensor-parallel collectives, at idle power) are left out
        of its time and power, so only its computation slows and its computation's power is the one
        overlapped.
        """
        key = (work, clock, load, profiled_s)
        state = self._overlaps.get(key)
        if state is None:
            options = self._options[work]
            idle_w = self.spec.idle_power_w

            def time_s(c: int) -> float:
                return max(options[c].time_s - profiled_s, 1e-12)

            def power_w(c: int) -> float:
                return (options[c].energy_j - idle_w * min(profiled_s, options[c].time_s)) / time_s(c)

            state = self._overlaps[key] = self.contention.overlap(load, clock, list(options), time_s, power_w)
        return state

    def _pieces(self, work: Work, clock: int, inline: InlineComm | None) -> _Pieces:
        """The instruction alone: its time, and its phases as (phase, seconds, power) in order."""
        options = self._options[work]
        if clock not in options:
            raise EnergyValueError(f"{work} has no profiled option at {clock} MHz")
        option = options[clock]
        if inline is None:
            return _Pieces(option.time_s, (("compute", option.time_s, option.energy_j / option.time_s),))
        idle_w = self.spec.idle_power_w
        compute_s = max(option.time_s - inline.profiled_s, 1e-12)
        compute_w = (option.energy_j - idle_w * min(inline.profiled_s, option.time_s)) / compute_s
        left_s = compute_s
        parts: list[tuple[str, float, float]] = []
        for part in inline.parts:
            comm_w = self.contention.alone_power_w(part.load, clock)
            if not part.overlapped:
                parts.append(("comm", part.comm_s, comm_w))
                continue
            state = self.overlap_state(work, clock, part.load, inline.profiled_s)
            together_s = min(part.comm_s, left_s / state.rate) if state.rate > 0 else part.comm_s
            left_s -= state.rate * together_s
            parts += [("overlap", together_s, state.power_w), ("comm", part.comm_s - together_s, comm_w)]
        parts.append(("compute", left_s, compute_w))
        kept = tuple(part for part in parts if part[1] > 1e-15)
        return _Pieces(sum(part[1] for part in kept), kept)

    def _compute(
        self,
        node: Instruction,
        clock: int,
        begin: float,
        launches: Sequence[CommLaunch],
        streams: list[_Stream],
        segments: list[list[tuple[float, float, str, float]]],
        pieces: _Pieces,
    ) -> tuple[float, float]:
        """Run one instruction from ``begin``, launching ``launches`` as its work passes their fractions.

        Its time alone and phases come from ``pieces``; beside a data-parallel collective it progresses at the
        contention rate of its profile option, and the collective at its rate beside compute. The
        stream is settled alone up to ``begin`` first (nothing of this stage ran since its last instruction).

        Returns:
            Its end and its energy (all power, static included, over its time).
        """
        alone_s = pieces.time_s
        stream = streams[node.stage]
        stream.advance(begin, beside=False)
        pending = list(launches)
        time_s, done, energy = begin, 0.0, 0.0
        while True:
            while pending and pending[0].fraction <= done + 1e-12:
                stream.push(pending.pop(0), time_s)
            if done >= 1.0 - 1e-12:
                break
            active = stream.head
            load = None if active is None else stream.launches[active].load
            state = None if load is None else self.overlap_state(node.work, clock, load)
            rate = 1.0 if state is None else state.rate
            horizon = time_s + stream.left_s(beside=state is not None)
            target = pending[0].fraction if pending else 1.0
            step = (target - done) * alone_s / rate if rate > 0 else math.inf  # all SMs taken: it waits
            before = done
            if time_s + step > horizon:
                step = horizon - time_s
                done += step * rate / alone_s
            else:
                done = target
            if step > 0:
                if state is None:
                    energy += _emit(segments[node.stage], pieces, time_s, before, done)
                else:
                    segments[node.stage].append((time_s, time_s + step, "overlap", state.power_w))
                    energy += state.power_w * step
            time_s += step
            stream.advance(time_s, beside=True)
        return time_s, energy

    def _phases(
        self,
        stage: int,
        iteration_s: float,
        segments: list[tuple[float, float, str, float]],
        stream: _Stream,
        tail_fixed_s: float,
        tail_energy_j: float,
        end: list[float],
        last_compute_end: float,
    ) -> StageOverlapEnergy:
        spec = self.spec
        idle_w, blocked_w = spec.idle_power_w, spec.blocked_power_w
        time = dict.fromkeys(PHASES, 0.0)
        dynamic = dict.fromkeys(PHASES, 0.0)
        for seg_start, seg_end, phase, power in segments:
            time[phase] += seg_end - seg_start
            dynamic[phase] += (power - idle_w) * (seg_end - seg_start)
        for i, launch in enumerate(stream.launches):
            exposed = stream.ends[i] - stream.starts[i] - stream.overlapped[i]
            if exposed > 0:
                time["comm"] += exposed
                dynamic["comm"] += (
                    self.contention.alone_power_w(launch.load, spec.max_sm_clock_mhz) - idle_w
                ) * exposed
        stage_end = max(last_compute_end, stream.free_s) + tail_fixed_s
        # the optimizer may run while a parameter all-gather after it is still pending: end at the later
        tail_end = max(stage_end, self._tail_end(stage, end))
        time["tail"] = tail_fixed_s
        dynamic["tail"] = tail_energy_j - idle_w * tail_fixed_s if self.dag.tail.is_measured else 0.0
        time["idle"] = max(0.0, iteration_s - tail_end)
        time["blocked"] = max(0.0, iteration_s - sum(time[p] for p in PHASES if p != "blocked"))
        dynamic["blocked"] = (blocked_w - idle_w) * time["blocked"]
        phases = tuple(PhaseEnergy(p, time[p], idle_w * time[p], dynamic[p]) for p in PHASES)
        return StageOverlapEnergy(stage, phases)

    def _tail_end(self, stage: int, end: list[float]) -> float:
        """End of the stage's last tail step."""
        steps = [
            i for i, node in enumerate(self.dag.nodes) if isinstance(node, TailStep) and node.stage == stage
        ]
        return max((end[i] for i in steps), default=0.0)
