"""Choices per (stage, collective class) and what they mean: the overlap simulation and the plan's actions.

A :class:`ClassChoice` is what the search picks for one collective class on one pipeline rank: a CTA budget, a
launch point and a clock offset for the instructions the class overlaps. :class:`KareusModel` turns a set of
choices (plus the base plan's clocks) into an :class:`~megatron_energy.sim.overlap_schedule.OverlapSchedule`,
simulates it (*modelled*), and writes the rank's :class:`~megatron_energy.plan.CollectiveAction` list.

Launch choice per class (``ClassChoice.launch``):

* ``dp.reduce_scatter`` / ``dp.all_reduce``: ``-1`` = the last launch point of every bucket (``"end"`` of the
  rank's last instruction: megatron-core's default, no overlap); ``d >= 0`` = ``d`` layers after the bucket's
  gradients are ready (``0``: ``--overlap-grad-reduce``), clamped to the bucket's last point;
* ``dp.all_gather``: ``0`` = ``"after_optimizer"`` (default), ``1`` = prefetch at ``"layer0"`` of the chunk's
  first forward (``--overlap-param-gather``);
* ``tp.*``: ``0`` = NCCL where megatron-core launches it, ``1`` = ``"gemm_overlap"`` (TE userbuffers);
* ``pp.send_recv`` and ``ep.all_to_all``: no choice (``0``): megatron-core issues them; a plan gives a budget.

Clock offset (``ClassChoice.clock_steps``): the instructions a class overlaps run ``clock_steps`` x
:data:`CLOCK_STEP_MHZ` away from the base plan's clock (snapped to a profiled clock): the chunk's last
backward instructions for the gradient reduce, the chunks' first forwards for a prefetched all-gather, every
instruction of the rank for the tensor-parallel classes.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.collective_levers import RuntimeLevers
from megatron_energy.pipeline.collective_names import AFTER_OPTIMIZER, GEMM_OVERLAP, LaunchPoint
from megatron_energy.pipeline.collectives import NCCL_DEFAULT_CTAS, Collective
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.plan import Boundary, CollectiveAction
from megatron_energy.sim.contention import CommLoad
from megatron_energy.sim.overlap import OverlapSimulator
from megatron_energy.sim.overlap_result import OverlapResult
from megatron_energy.sim.overlap_schedule import CommLaunch, InlineComm, InlinePart, OverlapSchedule
from megatron_energy.sim.simulator import ProfileLike

CLOCK_STEP_MHZ = 60
"""One step of a class's clock offset."""


ChoiceKey = tuple[int, str]
"""``(stage, class key)``, e.g. ``(0, "dp.reduce_scatter")``."""


@dataclass(frozen=True)
class ClassChoice:
    """What a plan does with one collective class on one rank (module docstring).

    Attributes:
        max_ctas: CTA budget; ``None`` for NCCL's default.
        launch: Launch choice (module docstring); the default reproduces megatron-core's defaults.
        clock_steps: Clock offset of the instructions the class overlaps, in :data:`CLOCK_STEP_MHZ` steps.
    """

    max_ctas: int | None = None
    launch: int = 0
    clock_steps: int = 0


def default_choice(class_key: str, levers: RuntimeLevers | None = None) -> ClassChoice:
    """What the job does without a plan: the base clock and megatron-core's schedule.

    Without ``levers`` (planning offline) that is megatron-core's defaults: NCCL's budget, no overlap. With
    them, the running job's flags and communicator budgets (``pipeline.collective_levers``).
    """
    reduce = class_key in ("dp.reduce_scatter", "dp.all_reduce")
    if levers is None:
        return ClassChoice(launch=-1 if reduce else 0)
    group = class_key.split(".", 1)[0]
    if reduce:
        return ClassChoice(launch=0 if levers.overlap_grad_reduce else -1)
    if class_key == "dp.all_gather":
        return ClassChoice(launch=1 if levers.overlap_param_gather else 0)
    if group == "tp" and levers.tp_comm_overlap:
        return ClassChoice(launch=1)
    return ClassChoice(levers.fixed_budget(group))


class KareusModel:
    """Choices → overlap simulation and plan actions for one job (module docstring)."""

    def __init__(
        self,
        dag: PipelineDag,
        profile: ProfileLike,
        spec: GpuSpec,
        collectives: list[Collective],
        layers: int,
        levers: RuntimeLevers | None = None,
    ):
        """Model ``dag`` priced by ``profile`` on ``spec`` with the job's ``collectives``.

        Args:
            dag: The iteration DAG.
            profile: Time and energy per clock of every instruction.
            spec: The GPU spec (powers, SMs, per-CTA bandwidth).
            collectives: Every collective of every rank (``pipeline.collectives.build_collectives``).
            layers: Transformer layers per model chunk (to place layer-boundary launches).
            levers: The running job's collective settings (:func:`default_choice`); ``None`` offline.
        """
        self.dag = dag
        self.levers = levers
        self.profile = profile
        self.spec = spec
        self.collectives = collectives
        self.layers = layers
        self.simulator = OverlapSimulator(dag, profile, spec)
        self._loads: dict[tuple[int, int | None], CommLoad] = {}
        """Loads by the collective's identity (``collectives`` holds them) and CTA budget."""
        self._stage_collectives: dict[int, list[Collective]] = {}
        for collective in collectives:
            self._stage_collectives.setdefault(collective.stage, []).append(collective)
        self._stage_schedules: dict[tuple[int, tuple[ClassChoice, ...]], _StageSchedule] = {}
        """Each stage's part of a schedule by its classes' choices (a search moves one stage at a time)."""
        self._stage_clocks: dict[tuple[int, tuple[ClassChoice, ...]], list[int]] = {}
        """Each stage's clocks in its order by its classes' choices, on the base :attr:`_clocks_base`."""
        self._clocks_base: dict[Instruction, int] = {}
        """A copy of the base clocks :attr:`_stage_clocks` was computed on (compared by value)."""
        self.class_keys: dict[int, list[str]] = {}
        for collective in collectives:
            keys = self.class_keys.setdefault(collective.stage, [])
            if collective.cls.key not in keys:
                keys.append(collective.cls.key)
        self._clocks = {
            work: sorted(option.clock_mhz for option in profile.options(work))
            for work in {node.work for node in dag.compute_nodes()}
        }

    def choices_default(self) -> dict[ChoiceKey, ClassChoice]:
        """What the job does without a plan (:func:`default_choice`), for every class of every rank."""
        return {
            (stage, key): default_choice(key, self.levers)
            for stage, keys in self.class_keys.items()
            for key in keys
        }

    def choice(self, choices: Mapping[ChoiceKey, ClassChoice], stage: int, key: str) -> ClassChoice:
        """The choice of ``key`` on ``stage``: the given one, else what the job does without a plan."""
        return choices.get((stage, key)) or default_choice(key, self.levers)

    def load(self, collective: Collective, max_ctas: int | None) -> CommLoad:
        """The collective's CTA budget and link as a contention load (made once per collective and budget)."""
        key = (id(collective), max_ctas)
        load = self._loads.get(key)
        if load is None:
            load = self._loads[key] = comm_load(collective, max_ctas, self.spec)
        return load

    def boundary(self, collective: Collective, choice: ClassChoice) -> Boundary:
        """The launch point ``choice`` gives ``collective``."""
        points = collective.launch_points
        if collective.cls.op == "all_gather" and collective.cls.group == "dp":
            return points[min(max(choice.launch, 0), len(points) - 1)]
        if not collective.cls.per_bucket:
            return points[min(max(choice.launch, 0), len(points) - 1)]
        return points[-1] if choice.launch < 0 else points[min(choice.launch, len(points) - 1)]

    def schedule(self, choices: Mapping[ChoiceKey, ClassChoice]) -> OverlapSchedule:
        """The overlap schedule of ``choices`` (a class without a choice keeps megatron-core's defaults)."""
        launches: list[CommLaunch] = []
        transfer_s: dict[int, float] = {}
        inline: dict[Work, InlineComm] = {}
        for stage in self._stage_collectives:
            key = (stage, self._stage_choices(choices, stage))
            part = self._stage_schedules.get(key)
            if part is None:
                part = self._stage_schedules[key] = self._stage_schedule(choices, stage)
            launches += part.launches
            transfer_s.update(part.transfer_s)
            inline.update(part.inline)
        return OverlapSchedule(tuple(launches), transfer_s, inline)

    def _stage_choices(self, choices: Mapping[ChoiceKey, ClassChoice], stage: int) -> tuple[ClassChoice, ...]:
        """The choice of every class of ``stage``, in :attr:`class_keys` order."""
        return tuple(self.choice(choices, stage, key) for key in self.class_keys.get(stage, ()))

    def _stage_schedule(self, choices: Mapping[ChoiceKey, ClassChoice], stage: int) -> _StageSchedule:
        """The launches, transfer time and inline collectives of ``stage``'s collectives under ``choices``."""
        part = _StageSchedule([], {}, {})
        for collective in self._stage_collectives[stage]:
            choice = self.choice(choices, collective.stage, collective.cls.key)
            load = self.load(collective, choice.max_ctas)
            if collective.cls.per_bucket:
                part.launches.append(self._launch(collective, self.boundary(collective, choice), load))
            elif collective.cls.group == "pp":
                part.transfer_s[collective.stage] = load.duration_s(collective.traffic_bytes)
            elif choice.max_ctas is not None or choice.launch != 0:
                self._add_inline(part.inline, collective, choice, load)
        return part

    def _launch(self, collective: Collective, at: Boundary, load: CommLoad) -> CommLaunch:
        if at.phase == AFTER_OPTIMIZER:
            return CommLaunch(
                str(collective.name), collective.stage, collective.traffic_bytes, load, "after_optimizer"
            )
        if collective.cls.op == "all_gather":
            return CommLaunch(
                str(collective.name),
                collective.stage,
                collective.traffic_bytes,
                load,
                "prefetch",
                at.instruction,
            )
        done = at.phase.layers_done(self.layers) if isinstance(at.phase, LaunchPoint) else None
        fraction = 1.0 if done is None else done / self.layers
        return CommLaunch(
            str(collective.name),
            collective.stage,
            collective.traffic_bytes,
            load,
            "compute",
            at.instruction,
            fraction,
        )

    def _add_inline(
        self, inline: dict[Work, InlineComm], collective: Collective, choice: ClassChoice, load: CommLoad
    ) -> None:
        """Add an inline class's per-instruction collectives (TP, expert all-to-all) to its rank's work."""
        passes = 2 * self.dag.orders.num_microbatches * self.dag.num_chunks
        per_pass = collective.launches_per_iteration / passes
        part = InlinePart(
            per_pass * load.duration_s(collective.traffic_bytes),
            load,
            collective.overlapped or self.boundary(collective, choice).phase == GEMM_OVERLAP,
        )
        profiled_s = per_pass * self.load(collective, None).duration_s(collective.traffic_bytes)
        for work in {node.work for node in self.dag.stage_order(collective.stage)}:
            previous = inline.get(work, InlineComm((), 0.0))
            inline[work] = InlineComm((*previous.parts, part), previous.profiled_s + profiled_s)

    def clocks(
        self, base: Mapping[Instruction, int] | None, choices: Mapping[ChoiceKey, ClassChoice]
    ) -> dict[Instruction, int]:
        """Every instruction's clock: the base plan's (fastest when absent), shifted by the class offsets."""
        base = base or {}
        if base != self._clocks_base:
            self._stage_clocks.clear()
            self._clocks_base = dict(base)
        clocks: dict[Instruction, int] = {}
        for stage in range(self.dag.num_stages):
            order = self.dag.stage_order(stage)
            key = (stage, self._stage_choices(choices, stage))  # a class without a choice shifts nothing
            stage_clocks = self._stage_clocks.get(key)
            if stage_clocks is None:
                stage_clocks = self._stage_clocks[key] = self._shifted(base, choices, stage)
            clocks.update(zip(order, stage_clocks, strict=True))
        return clocks

    def _shifted(
        self, base: Mapping[Instruction, int], choices: Mapping[ChoiceKey, ClassChoice], stage: int
    ) -> list[int]:
        """The clocks of ``stage``'s instructions in its order: the base's, shifted by the class offsets."""
        order = self.dag.stage_order(stage)
        shifts = dict.fromkeys(order, 0)
        for key in self.class_keys.get(stage, []):
            choice = choices.get((stage, key))
            if choice is None or choice.clock_steps == 0:
                continue
            for instruction in self._overlapped_instructions(stage, key, choice):
                shifts[instruction] += choice.clock_steps
        clocks = []
        for instruction in order:
            grid = self._clocks[instruction.work]
            clock = base.get(instruction, grid[-1])
            if shifts[instruction]:
                clock = _snap(grid, clock + shifts[instruction] * CLOCK_STEP_MHZ)
            clocks.append(clock)
        return clocks

    def _overlapped_instructions(self, stage: int, key: str, choice: ClassChoice) -> set[Instruction]:
        if key.startswith("tp."):
            return set(self.dag.stage_order(stage))
        chosen = {
            self.boundary(c, choice).instruction
            for c in self.collectives
            if c.stage == stage and c.cls.key == key
        }
        if key == "dp.all_gather" and choice.launch == 0:
            return set()
        return chosen

    def evaluate(
        self, base: Mapping[Instruction, int] | None, choices: Mapping[ChoiceKey, ClassChoice]
    ) -> OverlapResult:
        """Simulate the iteration under the base clocks and ``choices`` (modelled)."""
        return self.simulator.run(self.clocks(base, choices), self.schedule(choices))

    def actions(self, stage: int, choices: Mapping[ChoiceKey, ClassChoice]) -> list[CollectiveAction]:
        """The rank's collective actions: one per bucket, one per inline class (module docstring)."""
        actions = []
        for collective in self.collectives:
            if collective.stage != stage:
                continue
            choice = self.choice(choices, stage, collective.cls.key)
            actions.append(
                CollectiveAction(self.boundary(collective, choice), collective.name, choice.max_ctas)
            )
        return actions


class _StageSchedule(NamedTuple):
    """One stage's part of an :class:`OverlapSchedule`."""

    launches: list[CommLaunch]
    transfer_s: dict[int, float]
    inline: dict[Work, InlineComm]


def comm_load(collective: Collective, max_ctas: int | None, spec: GpuSpec) -> CommLoad:
    """``collective`` at ``max_ctas`` CTAs (``None``: NCCL's default) on its link, as a contention load."""
    return CommLoad(
        ctas=max_ctas or NCCL_DEFAULT_CTAS,
        link_bandwidth_gbps=collective.bandwidth_gbps,
        cta_bandwidth_gbps=spec.cta_bandwidth_gbps,
        latency_s=spec.p2p_latency_s,
    )


def _snap(grid: list[int], clock_mhz: float) -> int:
    """The profiled clock nearest to ``clock_mhz`` (ascending ``grid``)."""
    i = bisect.bisect_left(grid, clock_mhz)
    candidates = grid[max(0, i - 1) : i + 1]
    if not candidates:
        raise EnergyValueError("an instruction has no profiled clock")
    return min(candidates, key=lambda c: (abs(c - clock_mhz), -c))
