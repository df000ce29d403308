"""Simulate one iteration with collectives as first-class work beside computation (*modelled*).

The pipeline DAG (:class:`~megatron_energy.pipeline.dag.PipelineDag`) gives the instructions, transfers and
tail; an :class:`~megatron_energy.sim.overlap_schedule.OverlapSchedule` adds the collectives of each stage,
each a :class:`~megatron_energy.sim.overlap_schedule.CommLaunch` on the stage's collective stream
(:class:`~megatron_energy.sim.collective_stream.CollectiveStream`, one per stage: launches run one after
another, in the order they are reached). A launch is anchored:

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

**Tensor-parallel collectives** run inside every instruction
(:class:`~megatron_energy.sim.overlap_schedule.InlineComm`): the profile's time of an instruction includes
``profiled_s`` of them, exposed, at idle power (as the workload model prices fixed time); the schedule
replaces that with ``comm_s`` at its budget, exposed or (``overlapped``, TE userbuffers) beside the
instruction's compute, which then runs at the contention rate until either finishes. A stage's collective
stream (data-parallel buckets) is modelled as if the tensor-parallel collectives were not there (they use
another communicator; their SMs are not subtracted twice).

So ``static_j + dynamic_j`` is the stage's total energy, and a stage's phase times add up to ``T``. PP
transfers take the schedule's per-stage durations (CTA budget) but their SM share and power are neglected
(one microbatch's activations, well under 1 % of an instruction).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import TailStep, Transfer
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.sim.collective_stream import CollectiveStream
from megatron_energy.sim.contention import CommLoad, ContentionModel, OverlapState
from megatron_energy.sim.overlap_result import (
    PHASES,
    CommSlice,
    OverlapResult,
    PhaseEnergy,
    StageOverlapEnergy,
)
from megatron_energy.sim.overlap_schedule import CommLaunch, InlineComm, OverlapSchedule
from megatron_energy.sim.simulator import ProfileLike, Slice


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
        self._works = [node.work if isinstance(node, Instruction) else None for node in dag.nodes]
        """Each node's work (``None`` for the nodes that are not instructions), computed once."""
        self._fastest = {work: profile.fastest(work).clock_mhz for work in self._options}
        """Each work's fastest clock (an instruction's clock where the plan gives none)."""
        self._tail_steps = [
            [i for i, node in enumerate(dag.nodes) if isinstance(node, TailStep) and node.stage == stage]
            for stage in range(dag.num_stages)
        ]
        """Each stage's tail steps by node index."""
        attrs = dag.graph.nodes
        self._shown: list[tuple[int, str] | None] = [
            (attrs[node]["stage"], "send" if isinstance(node, Transfer) else attrs[node].get("kind", ""))
            if attrs[node]["type"] in ("comm", "tail")
            else None
            for node in dag.nodes
        ]
        """The stage and kind of each transfer's and tail step's timeline slice (``None``: no slice)."""

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
        streams = [CollectiveStream() for _ in range(dag.num_stages)]
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
        last_compute_end = [0.0] * dag.num_stages
        tail_fixed_s = [0.0] * dag.num_stages
        tail_energy = [0.0] * dag.num_stages
        alone: dict[tuple[Work, int], _Pieces] = {}  # this schedule's pieces of a work at a clock
        beside: dict[tuple[Work, int, int], OverlapState] = {}  # overlap states by the load's identity
        no_launches: list[CommLaunch] = []
        for v, node in enumerate(dag.nodes):
            preds = self._preds[v]
            begin = max(map(end.__getitem__, preds)) if preds else 0.0
            if isinstance(node, Instruction):
                work = self._works[v]
                assert work is not None
                stream = streams[node.stage]
                if node in waits:
                    begin = max([begin, *(stream.finish(i) for i in waits[node])])
                clock = clocks.get(node) or self._fastest[work]
                pieces = alone.get((work, clock))
                if pieces is None:
                    pieces = alone[(work, clock)] = self._pieces(work, clock, schedule.inline.get(work))
                finish, energy = self._compute(
                    node,
                    work,
                    clock,
                    begin,
                    in_node.get(node, no_launches),
                    streams,
                    segments,
                    pieces,
                    beside,
                )
                start[v], end[v] = begin, finish
                last_compute_end[node.stage] = max(last_compute_end[node.stage], finish)
                timeline.append(Slice(node.stage, node, begin, finish, clock, node.kind, energy))
                continue
            duration = fixed[v]
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
            shown = self._shown[v]
            if shown is not None:
                timeline.append(Slice(shown[0], node, begin, begin + duration, None, shown[1], 0.0))
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
        work: Work,
        clock: int,
        begin: float,
        launches: Sequence[CommLaunch],
        streams: list[CollectiveStream],
        segments: list[list[tuple[float, float, str, float]]],
        pieces: _Pieces,
        beside: dict[tuple[Work, int, int], OverlapState],
    ) -> tuple[float, float]:
        """Run one instruction from ``begin``, launching ``launches`` as its work passes their fractions.

        Its time alone and phases come from ``pieces``; beside a data-parallel collective it progresses at the
        contention rate of its profile option, and the collective at its rate beside compute. The
        stream is settled alone up to ``begin`` first (nothing of this stage ran since its last instruction).
        ``beside`` keeps this run's overlap states by work, clock and the load's identity (the schedule holds
        the loads while it runs), so a state is looked up without hashing the load's fields again.

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
            state = None
            if active is not None:
                load = stream.launches[active].load
                state = beside.get((work, clock, id(load)))
                if state is None:
                    state = beside[(work, clock, id(load))] = self.overlap_state(work, clock, load)
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
        stream: CollectiveStream,
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
        return max((end[i] for i in self._tail_steps[stage]), default=0.0)
