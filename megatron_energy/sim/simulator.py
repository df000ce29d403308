"""Simulate one training iteration: time and energy per pipeline stage under chosen SM clocks.

Every compute node of a :class:`~megatron_energy.perseus.dag.PipelineDag` takes the time and energy of the
profile option at its clock; communication and tail nodes take their fixed durations. The ASAP schedule of the
DAG gives the iteration time. Energy is accounted per stage in three parts, and this is THE definition the
frontier solver shares:

* **busy** -- the chosen options' energies of the stage's compute nodes (profile energy);
* **blocked** -- time from the iteration start to the end of the stage's last compute node during which it
  computes nothing (waiting for activations or gradients, before its first instruction), at
  ``blocked_power_w``;
* **idle** -- time from the end of the stage's last compute node to the end of the iteration (the
  data-parallel sync and optimizer tail included), at ``idle_power_w``.

So ``busy_s + blocked_s + idle_s == iteration_time_s`` on every stage. All results are *modelled*.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from megatron_energy.perseus.dag import NodeId, PipelineDag


class _Option(Protocol):
    clock_mhz: int
    time_s: float
    energy_j: float


class ProfileLike(Protocol):
    """The part of :class:`megatron_energy.perseus.profile.Profile` the simulator reads."""

    gpu_name: str
    source: str
    blocked_power_w: float
    idle_power_w: float

    def options(self, key: tuple[int, str, int]) -> list[_Option]:
        """All options of one instruction."""
        ...

    def fastest(self, key: tuple[int, str, int]) -> _Option:
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


@dataclass(frozen=True)
class StageEnergy:
    """Time and energy of one pipeline stage over one iteration (modelled).

    Attributes:
        stage: Pipeline stage.
        busy_s: Time computing.
        blocked_s: Time waiting before the stage's last compute node ends.
        idle_s: Time after the stage's last compute node until the iteration ends.
        busy_energy_j: Profile energy of the stage's compute nodes.
        blocked_energy_j: ``blocked_s`` at blocked power.
        idle_energy_j: ``idle_s`` at idle power.
    """

    stage: int
    busy_s: float
    blocked_s: float
    idle_s: float
    busy_energy_j: float
    blocked_energy_j: float
    idle_energy_j: float

    @property
    def total_energy_j(self) -> float:
        """Busy + blocked + idle energy."""
        return self.busy_energy_j + self.blocked_energy_j + self.idle_energy_j


@dataclass(frozen=True)
class SimResult:
    """The simulated iteration (modelled).

    Attributes:
        iteration_time_s: Makespan of the DAG.
        stages: Time and energy per pipeline stage.
        timeline: One slice per compute, transfer and tail node, in topological order.
        gpu_name: GPU the profile describes.
        profile_source: ``"measured"`` or ``"modelled"``: where the per-instruction times and energies came
            from (the iteration itself is always modelled).
    """

    iteration_time_s: float
    stages: list[StageEnergy]
    timeline: list[Slice]
    gpu_name: str
    profile_source: str

    @property
    def total_energy_j(self) -> float:
        """Energy of all stages (one GPU per stage)."""
        return sum(stage.total_energy_j for stage in self.stages)


class Simulator:
    """Simulates a pipeline DAG under per-instruction clocks with a profile's time and energy per clock."""

    def __init__(self, dag: PipelineDag, profile: ProfileLike, spec_powers: StagePowers | None = None):
        """Prepare the simulation of ``dag``.

        Args:
            dag: The iteration DAG.
            profile: Time and energy per clock of every (stage, kind, chunk) instruction in the DAG.
            spec_powers: Blocked and idle power; the profile's figures when ``None``.

        Raises:
            KeyError: If the profile lacks an instruction of the DAG.
        """
        self.dag = dag
        self.profile = profile
        self.powers = spec_powers or StagePowers(profile.blocked_power_w, profile.idle_power_w)
        self._compute = dag.compute_indices()
        attrs = dag.graph.nodes
        self._keys = [
            (attrs[node]["stage"], attrs[node]["kind"], attrs[node]["chunk"])
            for node in (dag.nodes[i] for i in self._compute)
        ]
        self._options: dict[tuple[int, str, int], dict[int, _Option]] = {}
        self._fastest: dict[tuple[int, str, int], _Option] = {}
        for key in set(self._keys):
            self._options[key] = {option.clock_mhz: option for option in profile.options(key)}
            self._fastest[key] = profile.fastest(key)
        self._stage_of = np.array([key[0] for key in self._keys], dtype=np.int64)
        self._last_compute = [dag.index[dag.stage_order(stage)[-1]] for stage in range(dag.num_stages)]

    def run(self, clocks: Mapping[NodeId, int] | None = None) -> SimResult:
        """Simulate one iteration.

        Args:
            clocks: SM clock per compute node; a node without one runs its fastest option.

        Returns:
            Iteration time, per-stage energy and the timeline.

        Raises:
            ValueError: If a clock is not among the profiled options of its instruction.
        """
        clocks = clocks or {}
        nodes = self.dag.nodes
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
        times_s = np.array([option.time_s for option in chosen])
        energies_j = np.array([option.energy_j for option in chosen])
        durations_s = self.dag.fixed_durations_s()
        durations_s[self._compute] = times_s
        schedule = self.dag.schedule_array(durations_s)
        iteration_s = schedule.makespan_s

        num_stages = self.dag.num_stages
        busy_s = np.bincount(self._stage_of, weights=times_s, minlength=num_stages)
        busy_j = np.bincount(self._stage_of, weights=energies_j, minlength=num_stages)
        stages = []
        for stage in range(num_stages):
            last_end_s = float(schedule.end_s[self._last_compute[stage]])
            blocked_s = last_end_s - float(busy_s[stage])
            idle_s = iteration_s - last_end_s
            stages.append(
                StageEnergy(
                    stage=stage,
                    busy_s=float(busy_s[stage]),
                    blocked_s=blocked_s,
                    idle_s=idle_s,
                    busy_energy_j=float(busy_j[stage]),
                    blocked_energy_j=blocked_s * self.powers.blocked_power_w,
                    idle_energy_j=idle_s * self.powers.idle_power_w,
                )
            )
        timeline = self._timeline(schedule.start_s.tolist(), schedule.end_s.tolist(), chosen)
        return SimResult(iteration_s, stages, timeline, self.profile.gpu_name, self.profile.source)

    def _timeline(self, start_s: list[float], end_s: list[float], chosen: list[_Option]) -> list[Slice]:
        """Slices of every compute, transfer and tail node, in index (topological) order."""
        option_at = dict(zip(self._compute.tolist(), chosen, strict=True))
        attrs = self.dag.graph.nodes
        timeline = []
        for i, node in enumerate(self.dag.nodes):
            node_attrs = attrs[node]
            if node_attrs["type"] in ("source", "sink"):
                continue
            option = option_at.get(i)
            timeline.append(
                Slice(
                    stage=node_attrs["stage"],
                    node=node,
                    start_s=start_s[i],
                    end_s=end_s[i],
                    clock_mhz=option.clock_mhz if option is not None else None,
                    kind="send" if node_attrs["type"] == "comm" else node_attrs["kind"],
                    energy_j=option.energy_j if option is not None else 0.0,
                )
            )
        return timeline
