"""Per-instruction timing on the GPU's own timeline, without host synchronisation inside the step.

Two timers share one interface: ``CudaEventTimer`` (``runtime.cuda_timer``) records CUDA events at
instruction boundaries (measured) and reads them at the end of the step, or one step later without waiting
for the GPU (the run phase); ``SimulatedTimer`` runs each instruction's modelled work on a
simulated GPU's virtual clock (modelled) and composes the replica's pipeline through the DAG so that
waiting time is charged as the simulator charges it.

Both also time the whole iteration (``StepTiming.cycle_s``): from the end of the previous step to the end
of this one, which takes in what happens between two schedules (gradient sync after the last backward,
optimizer step, data loading, logging). The part outside the replica's pipeline span is
``cycle_s - intrinsic_s``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from megatron_energy.pipeline.instruction import Step, Work, passes
from megatron_energy.runtime.control_plane.comms import RankComms


@dataclass(frozen=True)
class InstructionSample:
    """One instruction's timing within a step."""

    instruction: Step
    """Which instruction ran."""

    start_s: float
    """Start on the device timeline, seconds after the step began."""

    end_s: float
    """End on the device timeline, seconds after the step began."""

    energy_j: float | None = None
    """This instruction's own energy when the backend can attribute it (simulated GPUs), else ``None``."""

    @property
    def duration_s(self) -> float:
        """Busy time of the instruction."""
        return self.end_s - self.start_s


@dataclass(frozen=True)
class StepTiming:
    """All instruction samples of one step on this rank."""

    samples: tuple[InstructionSample, ...]
    """The step's instructions in execution order."""

    intrinsic_s: float
    """Step begin to the end of this replica's pipeline, on the device timeline (no data-parallel wait). A
    real GPU's timer knows its own stage's end only: the session takes the pipeline's maximum of it where it
    needs the replica's (``runtime.cuda_timer``)."""

    source: Literal["measured", "modelled"]
    """``measured`` (CUDA events) or ``modelled`` (simulated GPU)."""

    energy_j: float | None = None
    """The exact energy of this GPU over the step's pipeline span when the timer knows it (simulated GPUs:
    busy + blocked + idle); ``None`` when only the energy meter knows (real GPUs)."""

    cycle_s: float | None = None
    """The whole iteration on this rank: from the previous step's end to this step's end (what ran between
    the two schedules included); ``None`` when unknown (the first step on real GPUs). On real GPUs the ends
    are the host's, as ``runtime.cuda_timer`` explains (in the run phase, the host's schedule ends)."""

    outside_energy_j: float | None = None
    """The exact energy of this GPU from the previous step's end to this step's start, when the timer knows
    it (simulated GPUs); ``None`` when only the energy meter knows."""

    @property
    def outside_s(self) -> float:
        """The part of the iteration outside the replica's pipeline span (0 when the cycle is unknown)."""
        return 0.0 if self.cycle_s is None else max(0.0, self.cycle_s - self.intrinsic_s)


@runtime_checkable
class GraphReplayTimer(Protocol):
    """A timer that can also time a step replayed from a captured CUDA graph (``runtime.cuda_timer``)."""

    def replayed(
        self, marks: Sequence[tuple[Step, Any, Any]], outside: Sequence[tuple[str, Any, Any]]
    ) -> None:
        """The step that began replays a graph: time it by the markers the graph records."""
        ...

    def skip_step(self) -> None:
        """A step ran untimed (it captured the graph): forget the last step's end."""
        ...


class InstructionTimer(Protocol):
    """Times instructions on the device timeline; the hot-path calls must not synchronise."""

    source: Literal["measured", "modelled"]

    def wait_for_device(self) -> None:
        """Return once the device has finished what it was given.

        Called while profiling, before the energy counter is read at a step's start, so the work between the
        two schedules lies wholly before the read.
        """
        ...

    def step_begin(self) -> Any:
        """Mark the start of a step; returns the boundary marker (a CUDA event) or ``None``."""
        ...

    def begin(self, instruction: Step) -> Any:
        """Mark an instruction's start; returns the boundary marker (a CUDA event) or ``None``."""
        ...

    def end(self, instruction: Step) -> Any:
        """Mark an instruction's end; returns the end marker (a CUDA event) or ``None``."""
        ...

    def phase_begin(self, name: str) -> Any:
        """Mark an outside phase's start (``events.OUTSIDE_PHASES``); returns its boundary marker or None."""
        ...

    def phase_end(self, name: str) -> None:
        """Mark an outside phase's end."""
        ...

    def outside_durations(self) -> dict[str, float]:
        """Each outside phase's duration on the device timeline since the last step began, then forgets them.

        Called only while the device is idle (a synchronous profiling step's start), so reading waits for
        nothing.
        """
        ...

    def finish_step(self, *, lagged: bool = False) -> tuple[StepTiming, ...]:
        """Seal the step (called once per step, after the schedule); return the steps now complete.

        Every sealed step is returned exactly once, oldest first, so the caller pairs each timing with what
        it noted when it sealed that step.

        Args:
            lagged: ``False`` (profiling): this step is among those returned, even if that means waiting for
                the GPU. ``True`` (run phase): never wait for this step on the GPU; a timer that would have
                to returns it from a later call (or :meth:`flush`) instead.
        """
        ...

    def flush(self) -> tuple[StepTiming, ...]:
        """The sealed steps not returned yet (at close); runs no collective."""
        ...


class SimulatedTimer:
    """Runs each instruction's modelled work on a simulated GPU's virtual clock (modelled).

    Each instruction is executed at the GPU's current clock when it ends on the host. At the end of the step
    the stages of the replica exchange their durations, schedule the pipeline's DAG, and every simulated GPU
    then waits out its own blocked and idle time, so its energy counter holds the whole step.

    A real GPU waits for an instruction's input *before* running it, and a pending clock switch completes
    during that wait. To keep that effect, each instruction first waits the blocked time it waited in the
    previous step's schedule (the pipeline repeats itself from step to step); the end of the step charges
    only the blocked time still missing.

    The GPUs' :class:`~megatron_energy.dvfs.emulation.Emulation` says what runs between two schedules and
    whether energies are reported: without exact energies the samples and the step carry none, and the
    session reads the energy counter as on real GPUs. Its gradient sync runs when the ``grad-sync`` hook
    ends, after the step's pipeline span is charged (the sync waits for the replica's pipeline); its optimizer
    step when the ``optimizer`` hook ends, or before the next schedule in a job whose optimizer fires no hook.
    Both run at the clock in effect, and their energy counts as outside the next step's pipeline span.

    Clocks inside an instruction (:meth:`schedule_inside`, from ``runtime.running.simulated_phases``) are
    requested at their offsets from the instruction's start in virtual time, while the instruction runs as its
    ``phases`` one after another (``SimulatedGPUs.execute_sequence``), so each phase runs at the clock in
    force during it and the instruction's time and energy take in every change. An instruction without
    such clocks runs as one piece of work, which takes the same time and energy at one clock (the model is
    linear in the work's parts, and the phases run under the whole instruction's power cap).

    Args:
        gpus: The simulated GPUs (``SimulatedGPUs``).
        gpu_index: This rank's GPU.
        work: Modelled work per instruction class (``Work``); this stage's classes at least.
        comms: Collectives of the job: the stages' durations go round the pipeline group at each step's end
            (the simulated GPUs' own exchange, standing in for the pipeline itself; a real GPU's timer runs
            none).
        dag: The replica's pipeline DAG (``PipelineDag``).
        phases: Each instruction class's work as its phases in order (their sum is ``work``'s); needed for
            :meth:`schedule_inside` only.
    """

    source: Literal["measured", "modelled"] = "modelled"

    def __init__(
        self,
        gpus: Any,
        gpu_index: int,
        work: Mapping[Work, Any],
        comms: RankComms,
        dag: Any,
        phases: Mapping[Work, Sequence[Any]] | None = None,
    ) -> None:
        self._gpus = gpus
        self._phases = phases or {}
        self._inside: dict[Step, Sequence[tuple[float, Callable[[], object]]]] = {}
        self._index = gpu_index
        self._work = work
        self._comms = comms
        self._dag = dag
        self._runs: list[tuple[Step, float, float]] = []
        self._gaps_s: dict[Step, float] = {}
        self._waited_s = 0.0
        self._waited_j = 0.0
        self._last_end_s: float | None = None
        self._outside_j = 0.0
        self._between_done = False  # whether what runs between two schedules has run this step
        self._optimizer_ran = False  # whether the optimizer hook ran the emulated optimizer step
        self._pending_sync = False  # a gradient sync hooked inside the schedule, run after its span
        self._durations: dict[str, float] = {}

    def wait_for_device(self) -> None:
        """Run what the emulation puts between two schedules, if it has not run yet this step."""
        if self._between_done:
            return
        self._between_done = True
        if self._last_end_s is None:
            self._last_end_s = self._gpus.virtual_time_s(self._index)
        emulation = self._gpus.emulation
        self._outside_j += self._gpus.wait(self._index, emulation.idle_between_steps_s, blocked=False)
        if emulation.between_steps is not None and not self._optimizer_ran:
            self._outside_j += self._gpus.execute(self._index, emulation.between_steps)[1]

    def step_begin(self) -> Any:
        """Start the step after what runs between two schedules; there is no boundary marker."""
        self.wait_for_device()
        self._durations.clear()  # the previous tail's, read by now if anyone wanted them
        self._runs.clear()
        self._waited_s = self._waited_j = 0.0
        return None

    def begin(self, instruction: Step) -> Any:
        """Wait the blocked time this instruction waited for its input in the previous step."""
        gap_s = self._gaps_s.get(instruction, 0.0)
        if gap_s > 0.0:
            self._waited_j += self._gpus.wait(self._index, gap_s, blocked=True)
            self._waited_s += gap_s
        return None

    def schedule_inside(self, instruction: Step, timed: Sequence[tuple[float, Callable[[], object]]]) -> None:
        """Call each ``(offset_s, call)`` at its offset from the instruction's start while it runs.

        Raises:
            KeyError: No phases are known for the instruction's class.
        """
        if instruction.work not in self._phases:
            raise KeyError(f"no phases of {instruction.work} to run clocks inside it")
        self._inside[instruction] = timed

    def end(self, instruction: Step) -> Any:
        """Execute the instruction's modelled work (as its phases, with clocks inside it); no end marker."""
        timed = self._inside.pop(instruction, ())
        if timed:
            works = self._phases[instruction.work]
            time_s, energy_j = self._gpus.execute_sequence(self._index, works, timed)
        else:
            # a combined 1F1B step runs both passes' work, one after the other (what the modelled profile
            # assumes too: the all-to-all it hides is not emulated)
            time_s = energy_j = 0.0
            for part in passes(instruction):
                part_s, part_j = self._gpus.execute(self._index, self._work[part.work])
                time_s, energy_j = time_s + part_s, energy_j + part_j
        self._runs.append((instruction, time_s, energy_j))
        return None

    def phase_begin(self, name: str) -> Any:
        """An outside phase starts; there is no boundary marker."""
        return None

    def phase_end(self, name: str) -> None:
        """Run the outside phase's emulated work: the optimizer step now, the gradient sync after the span."""
        emulation = self._gpus.emulation
        if name == "grad-sync" and emulation.grad_sync is not None:
            self._pending_sync = True
        elif name == "optimizer" and emulation.between_steps is not None:
            self._optimizer_ran = True
            self._run_outside(name, emulation.between_steps)

    def outside_durations(self) -> dict[str, float]:
        """The outside phases' emulated durations since the last step began (virtual time)."""
        durations, self._durations = self._durations, {}
        return durations

    def _run_outside(self, name: str, work: Any) -> None:
        """Execute an outside phase's work at the clock in effect; its energy is outside the next span."""
        time_s, energy_j = self._gpus.execute(self._index, work)
        self._outside_j += energy_j
        self._durations[name] = self._durations.get(name, 0.0) + time_s

    def finish_step(self, *, lagged: bool = False) -> tuple[StepTiming, ...]:
        """Compose the replica's pipeline and charge this GPU its blocked and idle time.

        The virtual clock is known at once, so the step is always returned by its own call (``lagged`` has
        no effect).
        """
        return (self._finish(),)

    def flush(self) -> tuple[StepTiming, ...]:
        """Nothing: every step was returned by its own ``finish_step``."""
        return ()

    def _finish(self) -> StepTiming:
        mine = [(instruction, time_s) for instruction, time_s, _ in self._runs]
        durations: dict[Any, float] = {}
        for stage_runs in self._comms.all_gather(mine, "pipeline"):
            durations.update(stage_runs)
        schedule = self._dag.schedule(durations)
        exact = self._gpus.emulation.exact_energy
        samples = tuple(
            InstructionSample(
                instruction=instruction,
                start_s=schedule.start(instruction),
                end_s=schedule.end(instruction),
                energy_j=energy_j if exact else None,
            )
            for instruction, _, energy_j in self._runs
        )
        energy_j = sum(energy for _, _, energy in self._runs) + self._waited_j
        if samples:
            last_end = max(sample.end_s for sample in samples)
            busy = sum(sample.duration_s for sample in samples)
            missing_s = max(0.0, last_end - busy - self._waited_s)
            energy_j += self._gpus.wait(self._index, missing_s, blocked=True)
            energy_j += self._gpus.wait(self._index, max(0.0, schedule.makespan_s - last_end), blocked=False)
        self._gaps_s = _gaps_before(samples)
        end_s = self._gpus.virtual_time_s(self._index)
        cycle_s, self._last_end_s = end_s - (self._last_end_s or 0.0), end_s
        outside_j, self._outside_j = self._outside_j, 0.0
        self._between_done = self._optimizer_ran = False
        if self._pending_sync:
            self._pending_sync = False
            self._run_outside("grad-sync", self._gpus.emulation.grad_sync)
        if not exact:
            return StepTiming(samples, schedule.makespan_s, "modelled", cycle_s=cycle_s)
        return StepTiming(samples, schedule.makespan_s, "modelled", energy_j, cycle_s, outside_j)


def _gaps_before(samples: Sequence[InstructionSample]) -> dict[Step, float]:
    """Blocked time before each instruction of one stage: its start less the previous one's end."""
    gaps: dict[Step, float] = {}
    previous_end = 0.0
    for sample in sorted(samples, key=lambda s: s.start_s):
        gaps[sample.instruction] = max(0.0, sample.start_s - previous_end)
        previous_end = sample.end_s
    return gaps
