"""Simulate one training iteration: time and energy per pipeline stage under chosen SM clocks.

Every compute node of a :class:`~megatron_energy.pipeline.dag.PipelineDag` takes the time and energy of the
profile option at its clock; communication and tail nodes take their fixed durations. The ASAP schedule of the
DAG gives the iteration time. Energy is accounted per stage in three parts, and this is THE definition the
frontier solver shares:

* **busy** -- the chosen options' energies of the stage's compute nodes (profile energy);
* **blocked** -- time from the iteration start to the end of the stage's last compute node during which it
  computes nothing (waiting for activations or gradients, before its first instruction), at
  ``blocked_power_w``;
* **tail** -- the DAG's iteration tail (:class:`~megatron_energy.pipeline.dag_nodes.IterationTail`), which
  starts when the stage's last compute node ends: a *measured* tail (the session's profiling: gradient sync,
  optimizer step, data loading, logging, measured as one span) counts exactly the energy measured on the
  stage's GPU over it, nothing else; a *modelled* tail (gradient sync and optimizer step of a job
  description) counts its time at ``idle_power_w``;
* **idle** -- time from the end of the stage's tail to the end of the iteration (waiting for a slower
  stage), at ``idle_power_w``.

So ``busy_s + blocked_s + tail_s + idle_s == iteration_time_s`` on every stage, and each second of the
iteration is counted once: the instructions' own energy in busy, the waits between them in blocked, what
the GPU does outside the pipeline span in tail, and the wait for the iteration's end in idle. A measured tail
is a constant of the plan (it does not depend on the instructions' clocks; it was measured at the stock
clock). All results are *modelled*, from measured parts where the profile and the tail are measured.

**Switch latency.** With ``switch_latency_s`` L > 0 a clock change is not instant, by the rule of
:mod:`megatron_energy.dvfs.clock_switch`, the one :class:`~megatron_energy.dvfs.simulated.SimulatedGPUs` runs:

* a stage asks for a compute node's clock when the node starts, and only when it differs from the stage's
  previous request (the frequency controller drops repeats);
* the clock takes effect L later; virtual time passes during blocked waits too, so a wait absorbs latency;
* a newer request replaces a pending one (the pending clock then never takes effect);
* work done before the switch falls due runs at the clock in effect, time and energy pro rata from the profile
  option at that clock (fraction of work = elapsed / that option's time); the rest runs at the new clock;
* steady state: the same plan repeats every iteration, so a stage starts the iteration at the clock of its
  last instruction of the previous iteration, with no switch pending (the iteration tail and the last
  instruction are assumed to outlast L);
* a clock in effect at which an instruction has no profile option is priced by linear interpolation between
  its neighbouring profiled clocks (clamped at the ends).

Busy time and energy are then the effective ones; blocked and idle power do not depend on the clock. With
L = 0 the simulation is the instant-switch one, bit for bit.
"""

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import NodeId
from megatron_energy.pipeline.instruction import StepKey, Work
from megatron_energy.sim.switching_pass import (
    Option,
    Pass,
    PassCheckpoint,
    SwitchingGraph,
    switching_pass,
)


class ProfileLike(Protocol):
    """The part of :class:`megatron_energy.pipeline.profile.Profile` the simulator reads."""

    @property
    def gpu_name(self) -> str:
        """The GPU the profile belongs to."""
        ...

    @property
    def source(self) -> str:
        """Where the figures come from (measured, modelled, simulated)."""
        ...

    @property
    def blocked_power_w(self) -> float:
        """Power while blocked on pipeline communication."""
        ...

    @property
    def idle_power_w(self) -> float:
        """Power while idle after the last instruction."""
        ...

    def options(self, key: Work) -> Sequence[Option]:
        """All options of one instruction."""
        ...

    def fastest(self, key: Work) -> Option:
        """The fastest option of one instruction."""
        ...


@dataclass(frozen=True)
class StagePowers:
    """Power of a GPU that does not compute, used instead of the profile's figures when given.

    Attributes:
        blocked_power_w: While blocked in a P2P/NCCL wait.
        idle_power_w: While idle after its last instruction.
    """

    blocked_power_w: float
    idle_power_w: float


class Slice(NamedTuple):
    """One node's interval in the simulated timeline (modelled)."""

    stage: int
    """Pipeline stage the slice runs on (the sending stage for a transfer)."""
    node: NodeId
    """The DAG node."""
    start_s: float
    """Start, seconds from the iteration start."""
    end_s: float
    """End, seconds from the iteration start."""
    clock_mhz: int | None
    """SM clock of a compute node; ``None`` for transfers and tail work."""
    kind: str
    """``"forward"``, ``"backward"``, ``"send"``, ``"dp_sync"`` or ``"optimizer"``."""
    energy_j: float
    """Busy energy of a compute node; 0 for the others (their energy is blocked or idle energy)."""
    stale_clock_mhz: int | None = None
    """Clock in effect when a compute node started, if its requested ``clock_mhz`` was not yet in effect
    (switch latency); ``None`` when it ran at ``clock_mhz`` throughout."""
    stale_s: float = 0.0
    """Seconds the compute node ran at ``stale_clock_mhz`` before the switch took effect (its whole duration
    when the switch came after it ended)."""
    stale_energy_j: float = 0.0
    """The part of ``energy_j`` spent during ``stale_s`` (at ``stale_clock_mhz``)."""


@dataclass(frozen=True)
class SimulatedStage:
    """Time and energy of one pipeline stage over one iteration (modelled).

    Attributes:
        stage: Pipeline stage.
        busy_s: Time computing.
        blocked_s: Time waiting before the stage's last compute node ends.
        idle_s: Time after the stage's tail until the iteration ends.
        busy_energy_j: Profile energy of the stage's compute nodes.
        blocked_energy_j: ``blocked_s`` at blocked power.
        idle_energy_j: ``idle_s`` at idle power.
        tail_s: The iteration tail after the stage's last compute node.
        tail_energy_j: The tail's energy: as measured, or (a modelled tail) ``tail_s`` at idle power.
    """

    stage: int
    busy_s: float
    blocked_s: float
    idle_s: float
    busy_energy_j: float
    blocked_energy_j: float
    idle_energy_j: float
    tail_s: float = 0.0
    tail_energy_j: float = 0.0

    @property
    def total_energy_j(self) -> float:
        """Busy + blocked + tail + idle energy."""
        return self.busy_energy_j + self.blocked_energy_j + self.tail_energy_j + self.idle_energy_j


@dataclass(frozen=True)
class SimResult:
    """The simulated iteration (modelled).

    Attributes:
        iteration_time_s: Makespan of the DAG.
        stages: Time and energy per pipeline stage.
        timeline: One slice per compute, transfer and tail node, in topological order.
        gpu_name: GPU the profile describes.
        profile_source: ``"measured"``, ``"modelled"`` or ``"simulated"``: where the per-instruction times and
            energies came from (the iteration itself is always modelled).
        switch_latency_s: SM-clock switch latency the iteration was simulated with (0: instant switches).
    """

    iteration_time_s: float
    stages: list[SimulatedStage]
    timeline: list[Slice]
    gpu_name: str
    profile_source: str
    switch_latency_s: float = 0.0

    @property
    def total_energy_j(self) -> float:
        """Energy of all stages (one GPU per stage)."""
        return sum(stage.total_energy_j for stage in self.stages)


class Simulator:
    """Simulates a pipeline DAG under per-instruction clocks with a profile's time and energy per clock."""

    def __init__(
        self,
        dag: PipelineDag,
        profile: ProfileLike,
        spec_powers: StagePowers | None = None,
        switch_latency_s: float = 0.0,
    ):
        """Prepare the simulation of ``dag``.

        Args:
            dag: The iteration DAG.
            profile: Time and energy per clock of every (stage, kind, chunk) instruction in the DAG.
            spec_powers: Blocked and idle power; the profile's figures when ``None``.
            switch_latency_s: SM-clock switch latency of every run that does not give its own (see the module
                docstring); 0 for instant switches.

        Raises:
            KeyError: If the profile lacks an instruction of the DAG.
            ValueError: If the switch latency is negative or not finite.
        """
        self.dag = dag
        self.profile = profile
        self.powers = spec_powers or StagePowers(profile.blocked_power_w, profile.idle_power_w)
        self.switch_latency_s = _checked_latency(switch_latency_s)
        self._compute = dag.compute_indices()
        self._keys: list[Work] = [dag.nodes[i].work for i in self._compute]
        self._compute_nodes = frozenset(dag.nodes[i] for i in self._compute)
        self._options: dict[Work, dict[int, Option]] = {}
        self._fastest: dict[Work, Option] = {}
        for key in set(self._keys):
            self._options[key] = {option.clock_mhz: option for option in profile.options(key)}
            self._fastest[key] = profile.fastest(key)
        self._stage_of = np.array([key.stage for key in self._keys], dtype=np.int64)
        self._last_compute = [dag.index[dag.stage_steps(stage)[-1]] for stage in range(dag.num_stages)]
        self._graph: SwitchingGraph | None = None  # built by the first run with a switch latency
        self._clock_grid: dict[Work, list[int]] = {}

    def run(
        self, clocks: Mapping[StepKey, int] | None = None, switch_latency_s: float | None = None
    ) -> SimResult:
        """Simulate one iteration.

        Args:
            clocks: SM clock per compute node (the clock its stage asks for when it starts); a node without
                one runs its fastest option.
            switch_latency_s: Switch latency of this run; the simulator's own when ``None``.

        Returns:
            Iteration time, per-stage energy and the timeline.

        Raises:
            ValueError: If a clock is not among the profiled options of its instruction, or the latency is
                negative.
        """
        chosen = self._chosen(clocks)
        latency = self._latency(switch_latency_s)
        passed = self._pass(chosen, latency)
        stages = self._stage_energies(passed)
        timeline = self._timeline(passed, chosen)
        return SimResult(
            passed.iteration_s, stages, timeline, self.profile.gpu_name, self.profile.source, latency
        )

    def evaluate(
        self, clocks: Mapping[StepKey, int] | None = None, switch_latency_s: float | None = None
    ) -> tuple[float, float]:
        """Iteration time and energy of :meth:`run` (the same floats) without building the timeline.

        The fast path for solvers that simulate many candidate plans.

        Args:
            clocks: As for :meth:`run`.
            switch_latency_s: As for :meth:`run`.

        Returns:
            ``(iteration_time_s, total_energy_j)``, both modelled.
        """
        passed = self._pass(self._chosen(clocks), self._latency(switch_latency_s))
        stages = self._stage_energies(passed)
        return passed.iteration_s, sum(stage.total_energy_j for stage in stages)

    def compute_positions(self) -> dict[StepKey, int]:
        """The position of every compute node in the order :meth:`evaluate_options` takes options in."""
        nodes = self.dag.nodes
        return {nodes[i]: position for position, i in enumerate(self._compute.tolist())}

    def evaluate_options(
        self, chosen: list[Option], base: PassCheckpoint | None = None
    ) -> tuple[float, float, PassCheckpoint | None]:
        """:meth:`evaluate` at this simulator's switch latency, of options already chosen, unchecked.

        The solvers' fast path: ``chosen`` holds the option of every compute node by its position
        (:meth:`compute_positions`), each one of the profile's own options for that node, so no clock is
        looked up or validated here. With a switch latency the pass reruns, from ``base`` (an earlier
        call's checkpoint), only the nodes the changed options reach
        (:mod:`~megatron_energy.sim.switching_pass`): the figures are the same floats as a whole pass.

        Returns:
            ``(iteration_time_s, total_energy_j, checkpoint)``, both figures modelled; the checkpoint to
            resume a later call from (``None`` with instant switches, whose pass is not resumed).
        """
        checkpoint = None
        if self.switch_latency_s > 0.0:
            checkpoint = self._switching_pass(chosen, self.switch_latency_s, base)
            passed = checkpoint.passed
        else:
            passed = self._pass(chosen, 0.0)
        stages = self._stage_energies(passed)
        return passed.iteration_s, sum(stage.total_energy_j for stage in stages), checkpoint

    def _latency(self, switch_latency_s: float | None) -> float:
        return self.switch_latency_s if switch_latency_s is None else _checked_latency(switch_latency_s)

    def _chosen(self, clocks: Mapping[StepKey, int] | None) -> list[Option]:
        """The option of every compute node, by compute position."""
        clocks = clocks or {}
        nodes = self.dag.nodes
        if len(clocks) > len(self._keys) or not all(node in self._compute_nodes for node in clocks):
            stray = next((node for node in clocks if node not in self._compute_nodes), None)
            raise ValueError(
                f"{stray!r} is not an instruction of this pipeline's DAG; was the plan made for it?"
            )
        chosen = []
        for i, key in zip(self._compute.tolist(), self._keys, strict=True):
            clock = clocks.get(nodes[i])
            if clock is None:
                chosen.append(self._fastest[key])
                continue
            option = self._options[key].get(clock)
            if option is None:
                raise ValueError(
                    f"{nodes[i]} has no profiled option at {clock} MHz; profiled clocks: "
                    f"{sorted(self._options[key], reverse=True)}"
                )
            chosen.append(option)
        return chosen

    def _pass(self, chosen: list[Option], latency_s: float) -> Pass:
        """Schedule the iteration: the DAG's ASAP pass, or the switch-latency pass when ``latency_s > 0``."""
        if latency_s > 0.0:
            return self._switching_pass(chosen, latency_s).passed
        times_s = [option.time_s for option in chosen]
        durations_s = self.dag.fixed_durations_s()
        durations_s[self._compute] = np.array(times_s)
        schedule = self.dag.schedule_array(durations_s)
        return Pass(
            start_s=schedule.start_s.tolist(),
            end_s=schedule.end_s.tolist(),
            iteration_s=schedule.makespan_s,
            times_s=times_s,
            energies_j=[option.energy_j for option in chosen],
            stale_clock_mhz=[None] * len(chosen),
            stale_s=[0.0] * len(chosen),
            stale_energy_j=[0.0] * len(chosen),
        )

    def _switching_pass(
        self, chosen: list[Option], latency_s: float, base: PassCheckpoint | None = None
    ) -> PassCheckpoint:
        """The switch-latency pass (:func:`~megatron_energy.sim.switching_pass.switching_pass`)."""
        if self._graph is None:
            self._graph = SwitchingGraph.build(
                len(self.dag.nodes),
                self.dag.edges_array().tolist(),
                self.dag.fixed_durations_s().tolist(),
                self._compute.tolist(),
                self._stage_of.tolist(),
                self.dag.num_stages,
            )
        return switching_pass(self._graph, self._price, self._keys, chosen, latency_s, base)

    def _price(self, key: Work, clock_mhz: int) -> tuple[float, float]:
        """Time and energy of instruction ``key`` at ``clock_mhz``, interpolated between profiled clocks."""
        option = self._options[key].get(clock_mhz)
        if option is not None:
            return option.time_s, option.energy_j
        grid = self._clock_grid.get(key)
        if grid is None:
            grid = self._clock_grid[key] = sorted(self._options[key])
        above = bisect.bisect_left(grid, clock_mhz)
        if above == 0 or above == len(grid):
            nearest = self._options[key][grid[min(above, len(grid) - 1)]]
            return nearest.time_s, nearest.energy_j
        low, high = self._options[key][grid[above - 1]], self._options[key][grid[above]]
        weight = (clock_mhz - low.clock_mhz) / (high.clock_mhz - low.clock_mhz)
        return (
            low.time_s + weight * (high.time_s - low.time_s),
            low.energy_j + weight * (high.energy_j - low.energy_j),
        )

    def _stage_energies(self, passed: Pass) -> list[SimulatedStage]:
        """Busy, blocked and idle time and energy of every stage."""
        num_stages = self.dag.num_stages
        busy_s = np.bincount(self._stage_of, weights=passed.times_s, minlength=num_stages)
        busy_j = np.bincount(self._stage_of, weights=passed.energies_j, minlength=num_stages)
        iteration_s = passed.iteration_s
        tail, idle_w = self.dag.tail, self.powers.idle_power_w
        return [
            account_stage(
                stage,
                float(busy_s[stage]),
                float(busy_j[stage]),
                float(passed.end_s[self._last_compute[stage]]),
                iteration_s,
                (tail.time_s, tail.energy_j(stage, idle_w)),
                self.powers,
            )
            for stage in range(num_stages)
        ]

    def tail_offsets_j(self) -> list[float]:
        """What each stage's tail energy adds beyond idle power over the tail: 0 for a modelled tail.

        The frontier solver's closed form charges idle power from each stage's last compute node to the
        iteration's end; adding these constants gives the energy this simulator reports.
        """
        tail, idle_w = self.dag.tail, self.powers.idle_power_w
        return [tail.energy_j(stage, idle_w) - idle_w * tail.time_s for stage in range(self.dag.num_stages)]

    @property
    def tail_offset_j(self) -> float:
        """:meth:`tail_offsets_j` over all stages."""
        return sum(self.tail_offsets_j())

    def _timeline(self, passed: Pass, chosen: list[Option]) -> list[Slice]:
        """Slices of every compute, transfer and tail node, in index (topological) order."""
        position = {i: pos for pos, i in enumerate(self._compute.tolist())}
        attrs = self.dag.graph.nodes
        timeline = []
        for i, node in enumerate(self.dag.nodes):
            node_attrs = attrs[node]
            if node_attrs["type"] in ("source", "sink"):
                continue
            pos = position.get(i)
            timeline.append(
                Slice(
                    stage=node_attrs["stage"],
                    node=node,
                    start_s=passed.start_s[i],
                    end_s=passed.end_s[i],
                    clock_mhz=chosen[pos].clock_mhz if pos is not None else None,
                    kind="send" if node_attrs["type"] == "comm" else node_attrs["kind"],
                    energy_j=passed.energies_j[pos] if pos is not None else 0.0,
                    stale_clock_mhz=passed.stale_clock_mhz[pos] if pos is not None else None,
                    stale_s=passed.stale_s[pos] if pos is not None else 0.0,
                    stale_energy_j=passed.stale_energy_j[pos] if pos is not None else 0.0,
                )
            )
        return timeline


def account_stage(
    stage: int,
    busy_s: float,
    busy_energy_j: float,
    last_end_s: float,
    iteration_s: float,
    tail: tuple[float, float],
    powers: StagePowers,
) -> SimulatedStage:
    """One stage's busy, blocked, tail and idle parts of an iteration (the module docstring's definition).

    Args:
        stage: The pipeline stage.
        busy_s: Time its compute nodes take.
        busy_energy_j: Their energy.
        last_end_s: End of its last compute node, from the iteration start.
        iteration_s: The iteration time.
        tail: ``(time_s, energy_j)`` of its iteration tail.
        powers: Its GPU's blocked and idle power.
    """
    tail_s, tail_energy_j = tail
    blocked_s = last_end_s - busy_s
    idle_s = max(0.0, iteration_s - last_end_s - tail_s)
    return SimulatedStage(
        stage=stage,
        busy_s=busy_s,
        blocked_s=blocked_s,
        idle_s=idle_s,
        busy_energy_j=busy_energy_j,
        blocked_energy_j=blocked_s * powers.blocked_power_w,
        idle_energy_j=idle_s * powers.idle_power_w,
        tail_s=tail_s,
        tail_energy_j=tail_energy_j,
    )


def _checked_latency(switch_latency_s: float) -> float:
    """Validate a switch latency (seconds)."""
    latency = float(switch_latency_s)
    if not (math.isfinite(latency) and latency >= 0.0):
        raise ValueError(f"switch_latency_s must be finite and >= 0, got {switch_latency_s!r}")
    return latency
