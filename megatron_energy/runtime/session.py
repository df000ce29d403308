"""``EnergySession``: one rank's lifecycle, profile → plan → run, driven by Megatron's schedule events.

The session does not know how plans are made: it asks the optimiser ``--energy-mode`` selected
(``megatron_energy.optimisers.registry``) what to profile and for a plan, and runs whatever plan comes back.

Phase 1, profile: the controller holds each clock of a grid for a settling step and a few measured steps,
the stock clock first; the timer times every instruction on the device timeline and the whole iteration; the
meter gives each step's energy. The stock clock's measured steps are of two kinds (``runtime.profiling``):
the **baseline steps**, as many as the stock baseline needs (``runtime.baseline_length``), are timed exactly
as the run phase times its steps (lagged, no device sync, one counter lap per iteration), and they alone are
the stock baseline every measured change is compared with, so the comparison carries no bias from how the
two sides were measured; the **synchronous profile steps** (like every measured step at the other clocks)
wait for the device at their begin and end, so the counter laps separate the pipeline span's energy from
what ran between two schedules (``runtime.step_figures``): they give the profile rows and the measured
iteration tail, exact, and never enter a comparison.
Phase 2, plan: the profile rows of one replica (global rank 0's replica and tensor-parallel rank: its
peers run the same instructions) are gathered on rank 0 over that replica's pipeline alone; every other
rank takes part in fixed-size reductions only: a check that the stages' ranks agree, whether any rank
failed, and the job's stock steps over every GPU (``runtime.replica_profile``). The optimiser plans on rank
0 in a process of its own (``runtime.planner_process``). On real GPUs (``--energy-planning``) training goes
on meanwhile at stock clocks, in the planning phase (``stock (planning)``, where no run-phase policy acts):
where the optimiser plans phases inside instructions, each rank of the planning replica first reads its
recorded kernel timelines in a process of its own (``runtime.kernel_timeline``), and once every rank has,
the timelines join the planner's input; every K steps the ranks ask, one group a step, whether that has
happened and then whether rank 0's planner has ended (``runtime.staged_exchange.any_rank_stages``); once it
has, the decision goes to every rank at the same step, so every rank adopts the plan (or falls back)
together. On simulated GPUs, whose virtual clock stands still while the host plans,
rank 0 waits for the planner at the step profiling ends, so their runs stay deterministic. Rank 0 writes the
plan file and sends its text down a tree of the job's groups (``runtime.group_chain.broadcast_from_root``;
no server); every rank parses it.
Phase 3, run: a :class:`PlanRunner` applies this rank's actions at hook events (the clock of each
instruction at its boundary on the GPU timeline, a tail phase's at its outside-phase hook); the clocks of
phases inside an instruction go, with the instruction's start marker, to a phase switcher that requests
each at its planned offset from the instruction's start on the GPU (``runtime.phase_switcher``: a host
thread anchored on the start's CUDA event, its timing as precise as a host thread's sleep and the GIL allow;
``runtime.simulated_phases``: the simulated GPU's virtual clock). An error there turns phase switching off
with a log line and the run goes on at the instruction clocks; ``--energy-phase-switching off`` never
starts it. Energy keeps being measured and logged next to the
prediction, with its change against the stock baseline over a window of the phase's iterations
(``runtime.log_window``; fixed-size reductions, ``runtime.log_aggregate``); data-parallel replicas follow a
straggler's pace to another point of the same plan, exchanged every K steps over the pipeline, tensor and
data-parallel groups one group a step, asynchronously (``runtime.staged_exchange.pace_stages``, K from
``runtime.exchange_period``); a safety net reverts to stock clocks if the plan is slow (with several
replicas once an exchange says the others are slow too). No collective of the run phase spans more than a
data-parallel or pipeline group. Nothing the session does at a run-phase step's end waits for the GPU: a
real GPU's timing is read one step later (``runtime.cuda_timer``), paired with the energy lapped at that
step's own end, and the session's messages go over gloo (CPU) groups of the job's own groups
(``runtime.control_plane``); so the policies and the log see each step one step late.

A cached plan for the same job (``--energy-dir``) skips phases 1 and 2: the cached file is what runs.

One decision, every rank: whatever fails before or during planning on any rank (an unreadable or tampered
cache, a rank that cannot summarise its profile, a solver error, a cache write error, a plan a rank cannot
run) is caught, and every rank reaches the same outcome through the collectives every rank joins anyway
(the replica's reductions, the broadcast, one small reduction): all re-profile, all fall back to stock
clocks, or (a cache write error) all run the uncached plan. Each rank logs why; no exception reaches
Megatron's step. (Whatever stops a rank from starting its session is agreed on before the first of these
collectives, by ``runtime.assembly.build_session``.)
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.controller import RESET
from megatron_energy.dvfs.meter import EnergyWindow
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.optimisers import registry
from megatron_energy.optimisers.interface import Optimiser
from megatron_energy.pipeline.collectives import MeasuredBucket
from megatron_energy.pipeline.instruction import FUSED, FusedInstruction, Instruction, Step
from megatron_energy.plan import Plan
from megatron_energy.runtime.baseline_length import pilot_steps, stock_steps_needed
from megatron_energy.runtime.cache import JobCache
from megatron_energy.runtime.child_process import ChildProcess
from megatron_energy.runtime.comms import GROUPS, RankComms
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.energy_logger import EnergyLogger
from megatron_energy.runtime.exchange_period import HOP_S, exchange_cost_s, exchange_period
from megatron_energy.runtime.extrapolation import extrapolate_rows
from megatron_energy.runtime.group_chain import (
    broadcast_from_root,
    gather_replica,
    in_planning_replica,
    reduce_everywhere,
)
from megatron_energy.runtime.host_cost import HostCost, host_timed
from megatron_energy.runtime.job_stock import JobStock
from megatron_energy.runtime.kernel_timeline import (
    KernelTimeline,
    PendingTimelines,
    ReadTimelines,
    Timelines,
    TimelinesUnread,
    merge_timelines,
    timelines_line,
)
from megatron_energy.runtime.measured_inputs import MeasuredInputs
from megatron_energy.runtime.meter_thread import MeterThread
from megatron_energy.runtime.overhead_check import WINDOW as OVERHEAD_WINDOW
from megatron_energy.runtime.parts import Controller, Guard, Meter, PhaseSwitching
from megatron_energy.runtime.plan_runner import PlanRunner
from megatron_energy.runtime.planner_process import PlannerInput
from megatron_energy.runtime.planning import (
    Fallback,
    PlanRelease,
    baseline_from_profiling,
    load_release,
    plan_summary,
    profile_from_rows,
    store_release,
    tail_from_profiling,
    tail_phases_from_profiling,
)
from megatron_energy.runtime.policies import SafetyNet, StragglerPolicy
from megatron_energy.runtime.power_watch import allowed_power_w
from megatron_energy.runtime.profiling import (
    ProfileCollector,
    ProfileRow,
    StepRecord,
    merge_rows,
)
from megatron_energy.runtime.replanning import planning_job
from megatron_energy.runtime.replica_profile import ReplicaProfile, StageProfile, replica_profile
from megatron_energy.runtime.session_phase import SessionPhase
from megatron_energy.runtime.staged_exchange import PaceVerdict, StagedExchange, any_rank_stages, pace_stages
from megatron_energy.runtime.step_figures import SealedStep, StepFigures
from megatron_energy.runtime.stock_baseline import StockBaseline
from megatron_energy.runtime.stock_check import TITLE, compare_stock, comparison_line
from megatron_energy.runtime.timing import InstructionTimer, StepTiming
from megatron_energy.sim.power_floor import modelled_floor_problem


class EnergySession:
    """The per-rank energy optimiser; implements the ``ScheduleListener`` events.

    Args:
        config: The ``--energy-*`` configuration.
        context: This rank's place in the job.
        optimiser: The optimiser(s) ``--energy-mode`` selected.
        controller: The ``FrequencyController`` for this rank's GPU.
        meter: The ``EnergyMeter`` for this rank's GPU.
        timer: The instruction timer (CUDA events, or the simulated GPU's virtual clock).
        comms: Collectives over the job's process groups.
        clocks_mhz: The planning grid, highest (stock) first.
        can_set_clocks: Whether the controller really changes clocks. Without that (dry run, monitor-only)
            only the stock clock is measured and the other clocks are extrapolated with the model.
        cache: The job's ``JobCache``.
        spec: The GPU's spec (name, blocked and idle power for energy attribution).
        guard: The ``ClockGuard`` that resets locked clocks however the process ends (control mode only).
        printer: Where log lines go.
        kernel_timeline: Records the instructions' kernel timelines (``runtime.kernel_timeline``: CUDA
            only) in a recorded step that ends each profiled clock's block (their clock response is then
            measured; a dry run profiles the stock clock alone), when the optimiser asks for phases; never in
            the run phase, and the recorded steps' figures feed nothing else (``runtime.profiling``).
            ``None``: the phase planner uses the modelled per-class split.
        phase_switcher: Requests a plan's clocks inside instructions (``runtime.phase_switcher``);
            ``None``: those phases keep their instruction's clock.
    """

    def __init__(
        self,
        config: EnergyConfig,
        context: JobContext,
        *,
        optimiser: Optimiser,
        controller: Controller,
        meter: Meter,
        timer: InstructionTimer,
        comms: RankComms,
        clocks_mhz: list[int],
        can_set_clocks: bool = True,
        cache: JobCache,
        spec: GpuSpec,
        guard: Guard | None = None,
        printer: Callable[[str], Any] = print,
        kernel_timeline: KernelTimeline | None = None,
        phase_switcher: PhaseSwitching | None = None,
    ) -> None:
        self.config = config
        self.context = context
        self._fused_steps = {
            step.forward: step
            for step in context.orders.steps(context.pipeline_rank)
            if isinstance(step, FusedInstruction)
        }
        self.optimiser = optimiser
        self.controller = controller
        self.meter = meter
        self.laps = MeterThread(meter, synchronous=timer.source != "measured")
        """Every lap of ``meter`` goes through it (the run phase's off the training thread)."""
        self.timer = timer
        self.comms = comms
        self.cache = cache
        self.spec = spec
        self.guard = guard
        self.printer = printer
        self.kernel_timeline = kernel_timeline if optimiser.request.phases else None
        self.phase_switcher = phase_switcher
        self.stock_clock_mhz = clocks_mhz[0]
        self.grid_mhz = list(clocks_mhz)
        self.can_set_clocks = can_set_clocks
        sweep = can_set_clocks and optimiser.request.clock_grid
        self.collector = ProfileCollector(
            clocks_mhz=clocks_mhz if sweep else clocks_mhz[:1],
            steps_per_clock=config.profile_iters,
            blocked_power_w=spec.blocked_power_w,
            idle_power_w=spec.idle_power_w,
            stock_iters=pilot_steps(config.profile_iters),
            record_kernels=self.kernel_timeline is not None,
        )
        self._stock_decided = False
        self._step_lagged = False  # whether the step running now is timed without a device sync
        self.phase = SessionPhase.PROFILING
        self.plan: Plan | None = None
        self._buckets: tuple[MeasuredBucket, ...] | None = None  # every pipeline rank's, gathered to plan
        self.background_planning = config.planning == "background" or (
            config.planning == "auto" and timer.source == "measured"
        )
        """Whether training goes on at stock clocks while the plan is computed (``--energy-planning``)."""
        self._planner: ChildProcess[PlanRelease | Fallback] | PlanRelease | Fallback | None = None
        """Rank 0, from the start of planning to the decision: the planner process, or why it did not start,
        or (in the background, once polled) its outcome."""
        self._replica: ReplicaProfile | None = None
        """From the end of profiling until the planner starts: the planning replica's profile."""
        self._timelines: PendingTimelines | None = None
        """Likewise, where the optimiser plans phases: this rank's kernel timelines being read."""
        self._planning_began = (0, 0.0)  # the step profiling ended at, and when (time.monotonic)
        self._cache_writer: threading.Thread | None = None
        """Rank 0, once a plan is adopted: the thread caching it (``close`` waits for it)."""
        self.baseline = StockBaseline()
        self.runner: PlanRunner | None = None
        self.straggler: StragglerPolicy | None = None
        self._paces: StagedExchange[PaceVerdict] | None = None
        """The replicas' exchange of paces, every K run-phase steps (several replicas, once a plan runs)."""
        self._polls: StagedExchange[bool] | None = None
        """While the planner runs in the background: whether rank 0 has its outcome, every K steps."""
        self.safety = SafetyNet(config.safety_tolerance, config.safety_steps)
        self.history: list[StepFigures] = []
        self.host_cost = HostCost()
        self._outside: EnergyWindow | None = None
        self._lapped_at_start = False
        self._sealed: list[SealedStep] = []  # steps ended whose timing the timer has not returned yet
        self.energy_logger = EnergyLogger(context, comms, timer.source, spec.energy_counter_period_s, printer)
        self.energy_logger.log_file = config.log_file
        self.energy_logger.job = cache.fingerprint
        self.energy_logger.power_target = config.target if config.target.kind == "power" else None
        self._start_from_cache()
        if self.plan is None:
            self._refuse_budget_out_of_reach()

    @property
    def profile_source(self) -> str:
        """Where the profile's figures come from (its CSV says so too).

        ``measured`` when the grid's clocks were really set and timed on GPUs, ``simulated`` when they were
        set and timed on simulated GPUs (whose figures are the model's), ``modelled`` when only the stock
        clock was profiled and the rest extrapolated with the model.
        """
        if not self.can_set_clocks:
            return "modelled"
        return "simulated" if self.timer.source == "modelled" else "measured"

    # ----------------------------------------------------------------------------------- schedule events

    @host_timed
    def on_step_begin(self, step: int) -> None:
        """Start a step: choose its clock and kind while profiling, and start timing and metering.

        A synchronous profiling step reads the energy between the two schedules apart: the device finishes
        first, then the meter laps and the outside phases' durations are read, then the step's timing starts.
        A baseline step, like a run-phase step, does none of that.
        """
        planned = self.collector.begin_step() if self.phase == SessionPhase.PROFILING else None
        self._step_lagged = planned is None or not planned.synchronised
        self._lapped_at_start = not self._step_lagged
        if self._lapped_at_start:
            self.timer.wait_for_device()
            self._outside = self.laps.lap()
            self.collector.add_outside_phases(self.timer.outside_durations())
            if self.kernel_timeline is not None and planned is not None and planned.kind == "recorded":
                self.kernel_timeline.start(planned.clock_mhz)
        boundary = self.timer.step_begin()
        if planned is not None:
            self.controller.request(planned.clock_mhz, boundary)

    def _step(self, kind: str, microbatch: int, chunk: int) -> Step:
        """The step an instruction event names: a pass, or (kind ``fused``, with the forward's ids) a pair."""
        instruction = Instruction(self.context.pipeline_rank, chunk, microbatch, kind)
        if kind != FUSED:
            return instruction
        return self._fused_steps[instruction._replace(kind="forward")]

    @host_timed
    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Mark the instruction's boundary and, when a plan runs, ask for its clock at that boundary.

        The clocks of phases inside it go to the phase switcher, anchored to the same boundary marker.
        """
        instruction = self._step(kind, microbatch, chunk)
        # kernel ranges cover single passes only: the kernel optimiser plans no combined 1F1B steps
        if (
            self.kernel_timeline is not None
            and self.kernel_timeline.recording
            and isinstance(instruction, Instruction)
        ):
            self.kernel_timeline.instruction_begin(instruction)
        boundary = self.timer.begin(instruction)
        if self.runner is not None:
            clock = self.runner.clock_at(instruction)
            if clock is not None:
                self.controller.request(clock, boundary)
            if self.phase_switcher is not None:
                requests = self.runner.inside_requests(instruction)
                if requests:
                    self.phase_switcher.begin(instruction, boundary, requests)

    @host_timed
    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Mark the instruction's end (the phase switcher drops its requests the GPU passes it by)."""
        instruction = self._step(kind, microbatch, chunk)
        marker = self.timer.end(instruction)
        if self.phase_switcher is not None:
            self.phase_switcher.end(instruction, marker)
        if (
            self.kernel_timeline is not None
            and self.kernel_timeline.recording
            and isinstance(instruction, Instruction)
        ):
            self.kernel_timeline.instruction_end(instruction)

    @host_timed
    def on_outside_begin(self, name: str) -> None:
        """Mark an outside phase's start and, when a plan runs, request the clocks planned at its hook."""
        boundary = self.timer.phase_begin(name)
        if self.runner is not None:
            for clock in self.runner.outside_clocks(name):
                self.controller.request(clock, boundary)

    @host_timed
    def on_outside_end(self, name: str) -> None:
        """Mark an outside phase's end (a simulated GPU runs its emulated work); request a planned restore."""
        self.timer.phase_end(name)
        if self.runner is not None:
            for clock in self.runner.outside_clocks(name, end=True):
                self.controller.request(clock)

    def on_p2p_begin(self, op: str) -> None:
        """Pipeline communication needs no action: it is part of the waiting time between instructions."""

    def on_p2p_end(self, op: str) -> None:
        """See ``on_p2p_begin``."""

    def on_step_end(self, step: int) -> None:
        """Seal the step (:meth:`_seal_step`, host-timed), then close its host-time count."""
        run_phase = self.phase != SessionPhase.PROFILING
        self._seal_step(step)
        self._check_phase_switcher()
        self.host_cost.end_step(run_phase)

    def _check_phase_switcher(self) -> None:
        """Turn phase switching off, with a log line, if an error stopped it; the instruction clocks go on."""
        switcher = self.phase_switcher
        problem = None if switcher is None else switcher.take_error()
        if switcher is None or problem is None:
            return
        switcher.close()
        self.phase_switcher = None
        self.printer(
            f"[energy] rank {self.context.global_rank}: phase switching turned off "
            f"({type(problem).__name__}: {problem}); training continues at the instruction clocks"
        )

    @host_timed
    def _seal_step(self, step: int) -> None:
        """Seal the step's measurements; handle every step whose timing is complete, and advance the phase.

        A step that ran in the planning phase ends with a step of the poll for the planner's outcome
        (:meth:`_poll_planner`).

        A synchronous profiling step waits for the device and returns this step. In a baseline step and in
        the run phase nothing here waits for the GPU: the timer returns the previous step
        (``runtime.cuda_timer``; simulated GPUs still return this one), whose figures the straggler policy,
        the safety net and the log then see one step late. The counter lap is host-only work (an NVML read,
        ~3 ms), taken while the GPU still runs the backward pass queued before it, so it costs the GPU no
        idle time; it is this step's energy, and is kept with the step until its timing comes.
        """
        planning = self.phase == SessionPhase.PLANNING
        timings = self.timer.finish_step(lagged=self._step_lagged)
        if self.kernel_timeline is not None and self.kernel_timeline.recording:
            self.kernel_timeline.stop()  # the synchronous step's kernels have run
        self._sealed.append(
            SealedStep(
                step=step,
                phase=self.phase,  # the log describes the step as it ran
                predicted_j=None if self.runner is None else self.runner.predicted_energy_j,
                baseline=StockBaseline() if self.phase == SessionPhase.PROFILING else self.baseline,
                outside=self._outside,
                rest=self.laps.lap_later(),  # read off the training thread (runtime.meter_thread)
                lapped_at_start=self._lapped_at_start,
            )
        )
        for timing in timings:
            self._finish(self._sealed.pop(0), timing)
        if planning:
            self._poll_planner(step)

    def _finish(self, sealed: SealedStep, timing: StepTiming) -> None:
        """One step's figures: the profile or the run-phase policies, then the energy log.

        A profiling step's span is the replica's: the maximum of the stages' spans, one fixed-size max over
        the pipeline group (a real GPU's timer knows its own stage only; the run phase leaves this to the
        straggler exchange every K steps).
        """
        if sealed.phase == SessionPhase.PROFILING:
            (span_s,) = self.comms.start_all_reduce([timing.intrinsic_s], "max", "pipeline").wait()
            timing = dataclasses.replace(timing, intrinsic_s=span_s)
        figures = sealed.figures(timing)
        self.history.append(figures)
        if sealed.phase == SessionPhase.PROFILING:
            self.collector.add_step(figures)
            if not self._stock_decided and self.collector.stock_begun == self.collector.stock_iters:
                self._decide_stock_steps(figures.exact)  # at the pilot's end, before another step begins
            if self.collector.done:
                self._plan(sealed.step)
        elif sealed.phase != SessionPhase.PLANNING:  # while planning, at stock clocks: nothing to police
            # every run-phase rank takes each step of the straggler exchange, the safety-netted ones too: a
            # replica that skipped one would leave the others waiting in its collective
            alone = self._follow_stragglers(sealed.step, figures)
            self._check_safety(figures, alone, sealed.step, sealed.phase)
        self.energy_logger.add(
            sealed.step, self._label(sealed.phase), figures, sealed.predicted_j, sealed.baseline
        )

    def _flush(self, why: str = "last") -> None:
        """At close (or suspension): the step the timer still holds joins the history and the log window.

        No collective runs at close (a rank that stops on an error would leave the others waiting), so the
        step takes no part in the straggler policy, and a log line it would complete is printed by each rank
        for itself.
        """
        for timing in self.timer.flush():
            sealed = self._sealed.pop(0)
            figures = sealed.figures(timing)
            self.history.append(figures)
            self.energy_logger.window.add(sealed.step, self._label(sealed.phase), figures)
            if (sealed.step + 1) % self.context.log_interval == 0:
                self.printer(
                    f"[energy] rank {self.context.global_rank} iteration {sealed.step + 1} ({why}, this rank "
                    f"only): {figures.energy_j:.1f} J, {1e3 * figures.iteration_s:.1f} ms ({timing.source})"
                )

    def _label(self, phase: str) -> str:
        """What the log says ran: the phase, and that no clock was set when the controller only records."""
        return phase if self.can_set_clocks else f"{phase} (clocks not set)"

    def close(self) -> None:
        """Stop the controller (which resets the clocks it locked), release the clock guard, then flush.

        The flush (the last step of a lagged timer) never raises: the process is ending. Rank 0 of a job that
        ran a plan then logs the stock plan's prediction against the measured stock steps
        (``runtime.stock_check``): the run's last word on how well the model matched. Every rank first logs
        its own host time in the hooks (``runtime.host_cost``), and what became of the requests inside
        instructions (``runtime.phase_switcher``). A planner or kernel-timeline process still running is
        terminated first.
        """
        if isinstance(self._planner, ChildProcess):
            self._planner.terminate()
        if self._cache_writer is not None:
            self._cache_writer.join()
        if self._timelines is not None:
            self._timelines.terminate()
        if self.kernel_timeline is not None:
            self.kernel_timeline.close()
        if self.phase_switcher is not None:
            self.phase_switcher.close()
            counts = self.phase_switcher.counts
            if counts.scheduled:
                self.printer(f"[energy] rank {self.context.global_rank}: {counts.summary()}")
        self.controller.close()
        if self.guard is not None:
            self.guard.close()
        try:
            self._flush()
        except Exception as problem:  # a failing flush must not mask how the run ended
            self.printer(f"[energy] rank {self.context.global_rank}: last step not logged: {problem}")
        self.energy_logger.close()
        self.laps.close()
        measured_s = self.baseline.iteration_s if self.timer.source == "measured" else None  # no host/model
        host_line = self.host_cost.summary(self.context.global_rank, measured_s)
        if host_line is not None:
            self.printer(host_line)
        if self.context.global_rank == 0 and self.plan is not None:
            try:
                comparison = compare_stock(self.plan, self.baseline)
            except (ValueError, ZeroDivisionError) as problem:  # a closing line never fails the job
                self.printer(f"[energy] {TITLE}: not computed ({problem})")
                return
            if comparison is not None:
                self.printer(comparison_line(comparison))

    def suspend(self) -> None:
        """Stand aside from the next step on (``runtime.overhead_check``): stock clocks, held step read out.

        Call at a step boundary, on every rank at the same step; until :meth:`resume`, no schedule event
        may reach the session. Nothing here is a collective.
        """
        self.controller.request(RESET)
        self._flush("before the overhead check suspends the session")

    def resume(self) -> None:
        """Take part again from the next step on.

        The energy lap restarts; the plan's clocks return with the next instruction's request.
        """
        self.laps.lap()

    def energy_window(self) -> Future[EnergyWindow | None]:
        """This rank's energy since the previous call, in a meter window of its own (the overhead check's).

        Read off the training thread like the steps' laps, so neither kind of block waits for the counter.
        """
        return self.laps.lap_later(OVERHEAD_WINDOW)

    # ------------------------------------------------------------------------------------------- phases

    def _decide_stock_steps(self, exact: bool) -> None:
        """At the pilot's last step's end, every rank agrees on how many baseline steps to measure (max).

        Under the lag the pilot's last step is not recorded yet: the decision uses the steps that are.
        """
        self._stock_decided = True
        period_s = 0.0 if exact else self.spec.energy_counter_period_s
        collector = self.collector
        try:
            mine = stock_steps_needed(
                collector.baseline_steps(), period_s, collector.steps_per_clock, collector.stock_begun
            )
        except Exception:  # a rank that cannot tell keeps the pilot; the others decide
            mine = collector.stock_iters
        (agreed,) = reduce_everywhere(self.comms, [float(mine)])
        self.collector.set_stock_steps(int(agreed))

    def _start_from_cache(self) -> None:
        """Rank 0 loads the cached release (if any and verified); every rank adopts it, or all profile.

        A cache that verifies but cannot be used (a baseline that is not one, a plan of another job, a plan
        some rank cannot run) is moved aside by rank 0 like one that fails verification, so the store after
        re-planning never overwrites it.
        """
        decision: PlanRelease | None = None
        if self.context.global_rank == 0:
            try:
                decision, message = load_release(self.cache)
            except Exception as problem:  # any unreadable cache means: profile again
                decision, message = None, self._set_cache_aside(f"unusable ({problem})")
            self.printer(f"[energy] {message}")
        decision = broadcast_from_root(self.comms, decision)
        if decision is not None and not self._adopt_everywhere(decision):
            if self.context.global_rank == 0:
                self.printer(f"[energy] {self._set_cache_aside('holds a plan a rank cannot run')}")
            self.printer(
                f"[energy] rank {self.context.global_rank}: not using the cached plan; profiling again"
            )
        self.laps.lap()

    def _refuse_budget_out_of_reach(self) -> None:
        """On simulated GPUs, a power budget below the job's modelled power at the lowest clock: no profiling.

        Simulated GPUs are the GPU spec's model, so the model knows before profiling what the job draws with
        every instruction at the spec's lowest clock (``sim.power_floor.slowest_power_w``). Every rank
        computes the same figure and falls back together, at stock clocks; rank 0 alone says why. On GPUs
        the budget is checked against the profile, after profiling.
        """
        shape = self.context.shape
        if self.timer.source != "modelled" or shape is None:
            return
        problem = modelled_floor_problem(self.config.target, shape, self.spec, self.context.orders)
        if problem is not None:
            self._fall_back(problem, once=True)

    def _set_cache_aside(self, why: str) -> str:
        """Move the job's cached files aside (rank 0); the log line that says why and where."""
        try:
            aside = self.cache.set_aside()
        except OSError as error:
            return f"energy cache at {self.cache.folder} {why}; could not move it aside ({error}); profiling"
        if aside is None:
            return f"energy cache at {self.cache.folder} {why}; profiling again"
        return (
            f"energy cache at {self.cache.folder} {why}; moved its files to {aside} (kept for inspection, "
            "delete when done); profiling again"
        )

    def _plan(self, step: int) -> None:
        """At the end of profiling (``step``): the planning replica's profiles on rank 0, planning begun.

        The other ranks take part in fixed-size reductions only (``runtime.replica_profile``). Where the
        optimiser plans phases, each rank of the planning replica starts reading its kernel timelines in a
        child process. With background planning every rank then trains at stock clocks in the planning phase
        and asks every K steps whether every rank has read its timelines, then whether the outcome has come
        (:meth:`_poll_planner`); otherwise the timelines and rank 0's planner are waited for here and every
        rank takes the decision at this step's end.
        """
        self._buckets = self._gather_buckets()
        self._replica = replica_profile(
            self.comms,
            self._profile_contribution(),
            self.collector.stock_iters,
            self.stock_clock_mhz,
            self.context.global_rank,
        )
        self._planning_began = (step, time.monotonic())
        self._timelines = self._read_timelines() if self.optimiser.request.phases else None
        if not self.background_planning:
            self._start_planning()
            self._take_decision(step)
            return
        sizes = [self.comms.size(group) for group in GROUPS]
        self._polls = StagedExchange(exchange_period(sizes, self._replica.stock.iteration_s))
        self.controller.request(RESET)  # the last profiled clock need not be the stock one
        self.phase = SessionPhase.PLANNING
        if self._timelines is None:
            self._start_planning()

    def _read_timelines(self) -> PendingTimelines:
        """Start reading this rank's kernel timelines (none outside the planning replica, or unrecorded)."""
        if self.kernel_timeline is None or not in_planning_replica(self.comms):
            return ReadTimelines({})
        try:
            return self.kernel_timeline.read()
        except Exception as problem:  # the phase planner then models this stage's split
            return ReadTimelines(TimelinesUnread(f"{type(problem).__name__}: {problem}"))

    def _start_planning(self) -> None:
        """The replica's kernel timelines (if asked for) on rank 0, and rank 0's planner started."""
        replica, self._replica = self._replica, None
        assert replica is not None  # set at the end of profiling
        timelines = None
        if self._timelines is not None:
            timelines = gather_replica(self.comms, self._own_timelines(self._timelines.wait()))
            self._timelines = None
        if replica.stages is not None:
            self._planner = self._start_planner(replica, merge_timelines(timelines or []))

    def _own_timelines(self, outcome: Timelines | TimelinesUnread) -> Timelines:
        """This rank's phases per instruction class; none, with a log line, where they could not be read."""
        if isinstance(outcome, TimelinesUnread):
            rank = self.context.global_rank
            self.printer(f"[energy] rank {rank}: kernel timeline not read: {outcome.reason}")
            return {}
        return outcome

    def _poll_planner(self, step: int) -> None:
        """A planning-phase step: every K steps, one link a step, whether planning may go on.

        While kernel timelines are read, the exchange asks whether any rank still reads its own; once none
        does, every rank gathers them at that step and rank 0 starts the planner. Then it asks whether rank 0
        has the planner's outcome; once the exchange (``runtime.staged_exchange.any_rank_stages``) says so,
        every rank takes the decision at the same step.
        """
        polls = self._polls
        if polls is None:
            return
        if self._replica is not None:
            still_reading = polls.step(lambda: any_rank_stages(self.comms, not self._timelines_read()))
            if still_reading is False:
                self._start_planning()
        elif polls.step(lambda: any_rank_stages(self.comms, self._outcome_ready())):
            self._take_decision(step)

    def _timelines_read(self) -> bool:
        """Whether this rank's kernel timelines have been read (or there were none to read)."""
        return self._timelines is None or self._timelines.poll() is not None

    def _outcome_ready(self) -> bool:
        """Rank 0: whether the planner has ended (its outcome is kept for the decision); others: ``False``."""
        if isinstance(self._planner, ChildProcess):
            outcome = self._planner.poll()
            if outcome is None:
                return False
            self._planner = outcome
        return self._planner is not None

    def _take_decision(self, step: int) -> None:
        """At the end of ``step``: rank 0's planner outcome reaches every rank down the groups' tree.

        Rank 0 waits for the planner if it has not ended (simulated GPUs, ``--energy-planning wait``). Every
        rank adopts the plan (from the next step on) or falls back together. Rank 0 caches the plan only once
        every rank has adopted it (a plan some rank cannot run is never cached), and logs after how many steps
        and seconds it took effect.
        """
        outcome = self._planner
        if isinstance(outcome, ChildProcess):
            outcome = outcome.wait()
        began_s = time.perf_counter()
        decision: PlanRelease | Fallback = broadcast_from_root(self.comms, outcome)
        self._planner = self._polls = None
        if isinstance(decision, Fallback):
            self._fall_back(decision)
        elif not self._adopt_everywhere(decision):
            self._fall_back("a rank could not run the plan (its log says why)")
        elif self.context.global_rank == 0:
            self._cache_writer = threading.Thread(
                target=self._store, args=(decision,), name="megatron_energy cache writer", daemon=True
            )
            self._cache_writer.start()
            self.printer(self._took_effect_line(step, time.perf_counter() - began_s))

    def _took_effect_line(self, step: int, adopting_s: float) -> str:
        """Rank 0's line: when the plan took effect, how long planning and adopting took (measured).

        Planning: wall clock since profiling ended; adopting: the training thread's time in the decision's
        broadcast, the plan's parsing and the runner's set-up.
        """
        began_step, began_s = self._planning_began
        took = f"plan took effect at iteration {step + 2}: computed in {time.monotonic() - began_s:.1f} s"
        adopting = f"adopting it took {1e3 * adopting_s:.1f} ms of the training thread (measured)"
        if self.background_planning:
            return f"[energy] {took} while {step - began_step} iteration(s) ran at stock clocks; {adopting}"
        why = "--energy-planning wait" if self.config.planning == "wait" else "simulated GPUs"
        return f"[energy] {took} while training waited for it ({why}); {adopting}"

    def _profile_contribution(self) -> tuple[list[ProfileRow], list[StepRecord]] | Fallback:
        """This rank's rows and measured stock steps, or why it has none (logged here too)."""
        try:
            return self.collector.rows(), self.collector.stock_steps()
        except Exception as problem:  # agreed on in the reductions: rank 0 decides for every rank
            reason = f"rank {self.context.global_rank} could not summarise its profile: {problem}"
            self.printer(f"[energy] {reason}")
            return Fallback(reason)

    def _start_planner(
        self, replica: ReplicaProfile, timelines: Timelines
    ) -> ChildProcess[PlanRelease | Fallback] | Fallback:
        """Start the planner process on rank 0; a failure becomes the fallback every rank takes (no raise)."""
        stages = replica.stages or []
        failures = [stage for stage in stages if isinstance(stage, Fallback)]
        if failures:
            return failures[0]
        if replica.failed:
            return Fallback("a rank could not summarise its profile (its log says why)")
        profiles = [stage for stage in stages if isinstance(stage, StageProfile)]
        self._report_spread(profiles)
        if self.optimiser.request.phases:
            clocks = 0 if self.kernel_timeline is None else self.kernel_timeline.response_clocks
            self.printer(f"[energy] {timelines_line(timelines, self.timer.source, clocks)}")
        try:
            return ChildProcess(self._planner_input(profiles, replica.stock, timelines))
        except Exception as problem:  # planning must never break the training step
            return Fallback(f"planning failed: {type(problem).__name__}: {problem}")

    def _store(self, release: PlanRelease) -> None:
        """Cache the release every rank runs; a write error only costs the next run a profile.

        Rank 0 runs it on the cache writer thread, so the writes' fsyncs stay off the training thread.
        """
        try:
            store_release(self.cache, release)
        except OSError as problem:
            self.printer(
                f"[energy] could not cache the plan in {self.cache.folder} ({problem}); running it uncached, "
                "the next run profiles again"
            )

    def _report_spread(self, profiles: list[StageProfile]) -> None:
        """Rank 0 says which stages' ranks differ at stock clocks beyond the tolerance (``StageSpread``)."""
        for stage, profile in enumerate(profiles):
            spread = profile.spread.disagreement()
            if spread is not None:
                self.printer(
                    f"[energy] stage {stage}: its tensor- and data-parallel ranks differ at stock clocks "
                    f"({self.timer.source}): {spread}; the plan is made from rank {profile.global_rank}'s "
                    "profile, and a slower replica is followed as a straggler"
                )

    def _planner_input(
        self, profiles: list[StageProfile], stock: JobStock, timelines: Timelines
    ) -> PlannerInput:
        """What the planner process plans from; its optimiser is built from ``--energy-mode`` again."""
        gathered = [(profile.rows, profile.steps) for profile in profiles]
        rows = [rank_rows for rank_rows, _ in gathered]
        if not self.can_set_clocks:
            rows = [extrapolate_rows(rank_rows, self.spec, self.grid_mhz) for rank_rows in rows]
        profile = profile_from_rows(
            merge_rows(rows),
            gpu_name=self.spec.name,
            source=self.profile_source,
            blocked_power_w=self.spec.blocked_power_w,
            idle_power_w=self.spec.idle_power_w,
        )
        request = self.optimiser.request
        measured = MeasuredInputs(
            request,
            tail_from_profiling(gathered),
            tail_phases_from_profiling(gathered),
            timelines or None,
            self._buckets,
        )
        job = planning_job(self.config, self.context, self.spec, self.cache.fingerprint, request, measured)
        ranks = [profile.global_rank for profile in profiles]
        baseline = baseline_from_profiling(gathered, ranks, stock, source=self.timer.source)
        return PlannerInput(self.config.mode, registry.registered(), profile, job, baseline)

    def _gather_buckets(self) -> tuple[MeasuredBucket, ...] | None:
        """Every pipeline rank's measured DDP bucket layout (one all-gather over the pipeline), or ``None``.

        Every rank joins when the optimiser plans collectives and the job describes them (the same on every
        rank); ``None`` when any rank has no measured layout (the planner then models the buckets).
        """
        setup = self.context.collectives
        if not self.optimiser.request.collectives or setup is None:
            return None
        layouts = self.comms.all_gather(setup.buckets, "pipeline")
        if any(layout is None for layout in layouts):
            return None
        return tuple(bucket for layout in layouts for bucket in layout)

    def _adopt_everywhere(self, release: PlanRelease) -> bool:
        """Every rank parses the same plan text; all run it only if every rank could (one small reduction).

        With several data-parallel replicas the straggler exchange starts with the plan
        (:meth:`_pace_exchange`).
        """
        try:
            plan = Plan.from_json_text(
                release.plan_text, source="the broadcast plan", expected_fingerprint=self.cache.fingerprint
            )
            runner = PlanRunner(
                plan, self.context.pipeline_rank, self.context.orders.steps(self.context.pipeline_rank)
            )
            problem = None
        except Exception as error:  # agreed on below, never raised into the step
            problem = error
            self.printer(f"[energy] rank {self.context.global_rank}: cannot run the plan: {error}")
        (failed_anywhere,) = reduce_everywhere(self.comms, [0.0 if problem is None else 1.0])
        if failed_anywhere:
            return False
        if self.context.global_rank == 0:
            self.printer(plan_summary(plan, release.plan_text))
        hooks = runner.hook_report(inside_switched=self.phase_switcher is not None)
        if hooks is not None and self.context.data_parallel_rank == 0:
            self.printer(f"[energy] rank {self.context.global_rank}: {hooks}")
        self.plan = plan
        self.baseline = release.baseline
        self.runner = runner
        self.straggler = StragglerPolicy(nominal_time_s=plan.target_point.iteration_time_s)
        self._paces = self._pace_exchange(plan)
        self.phase = SessionPhase.PLANNED
        return True

    def _pace_exchange(self, plan: Plan) -> StagedExchange[PaceVerdict] | None:
        """The replicas' exchange of paces every K steps (``runtime.exchange_period``); none with one replica.

        K follows from the job's group sizes and the plan's iteration time, the same on every rank; rank 0
        says what it is and what an exchange costs (modelled).
        """
        if self.context.data_parallel_size == 1:
            return None
        sizes = [self.comms.size(group) for group in GROUPS]
        period = exchange_period(sizes, plan.target_point.iteration_time_s)
        if self.context.global_rank == 0:
            cost_s = exchange_cost_s(sizes)
            self.printer(
                f"[energy] the data-parallel replicas exchange their pace every {period} step(s) over their "
                f"pipeline, tensor and data-parallel groups (sizes {'/'.join(map(str, sizes))}): "
                f"{1e3 * cost_s:.2f} ms per exchange at {1e6 * HOP_S:.0f} µs per hop, "
                f"{1e3 * cost_s / period:.3f} ms per step (modelled)"
            )
        return StagedExchange(period)

    def _fall_back(self, decision: Fallback | str, once: bool = False) -> None:
        """Run the rest of the job at stock clocks; every rank comes here together.

        Each rank says why, except where the target cannot be met (``once``, or a sound profile came with the
        decision): rank 0 then says it, once, for every rank, and caches the profile, if any, for a run with
        another target (``runtime.replanning``).
        """
        fallback = Fallback(decision) if isinstance(decision, str) else decision
        self.runner = None
        self.controller.request(RESET)
        self.phase = SessionPhase.PLANNING_FAILED
        rank = self.context.global_rank
        if fallback.profile_artefacts is None and not once:
            self.printer(
                f"[energy] rank {rank}: not optimising, training continues at stock clocks: {fallback.reason}"
            )
        elif rank == 0:
            artefacts = fallback.profile_artefacts
            kept = "" if artefacts is None else f"; {self._keep_profile(artefacts)}"
            self.printer(
                "[energy] not optimising, training continues at stock clocks on every rank: "
                f"{fallback.reason}{kept}"
            )

    def _keep_profile(self, artefacts: dict[str, str]) -> str:
        """Cache the profile without a plan (rank 0); what the log says of it."""
        try:
            self.cache.store(artefacts)
        except OSError as problem:
            return f"the profile could not be cached in {self.cache.folder} ({problem})"
        return (
            f"the profile is cached in {self.cache.folder}: run again with another --energy-target and it "
            "is planned without profiling"
        )

    def _follow_stragglers(self, step: int, figures: StepFigures) -> tuple[bool, int] | None:
        """A step of the replicas' exchange of paces; when one completes, follow the slowest replica.

        Returns, on the steps an exchange completes, whether this replica alone was slow and at which step
        (the one the exchange compared); ``None`` on the others. A replica that is slow while another replica
        keeps its plan's pace is slowed by something outside the plan (throttling, a slow node): the plan,
        the same on every replica, is not to blame.
        """
        plan, paces, straggler = self.plan, self._paces, self.straggler
        if plan is None or paces is None or straggler is None:
            return None
        tail_s = 0.0 if plan.measured_tail is None else plan.measured_tail.time_s
        # this stage's span (its pipeline's maximum is the replica's, which a slower replica does not
        # lengthen on this one), plus the measured tail, against what the point running at this step predicts
        span_s = figures.timing.intrinsic_s + tail_s
        runner = self.runner
        predicted_s = plan.baseline.iteration_time_s if runner is None else runner.predicted_time_s
        contribution = functools.partial(straggler.contribution, predicted_s=predicted_s)
        verdict = paces.step(lambda: pace_stages(self.comms, step, span_s, contribution))
        if verdict is None:
            return None
        straggling = verdict.mine_s != straggler.nominal_time_s
        alone = (straggling and verdict.fastest_s == straggler.nominal_time_s, verdict.step)
        runner = self.runner  # the point may have changed since: a trip, a re-arm
        if self.safety.tripped or runner is None:
            return alone
        pace_s = straggler.update(verdict.slowest_s, straggling=straggling)
        if pace_s is None:
            return alone
        runner.select(plan.index_for_time(pace_s))
        following = not runner.on_target
        self.phase = SessionPhase.FOLLOWING_STRAGGLER if following else SessionPhase.PLANNED
        self.printer(
            f"[energy] rank {self.context.global_rank}: "
            + (
                f"a data-parallel replica runs at {1e3 * pace_s:.1f} ms/iter; moving to the frontier point "
                f"at {1e3 * runner.predicted_time_s:.1f} ms (modelled)"
                if following
                else "straggler recovered; back to the target plan"
            )
        )
        return alone

    def allowed_time_s(self, predicted_s: float) -> float:
        """The measured iteration time a plan point predicted at ``predicted_s`` may take.

        The measured stock time scaled by the point's predicted slowdown over stock clocks; without a
        measured stock time, the prediction itself.
        """
        stock_s = self.baseline.iteration_s
        if stock_s is None or self.plan is None:
            return predicted_s
        return stock_s * predicted_s / self.plan.baseline.iteration_time_s

    def _check_safety(
        self, figures: StepFigures, alone: tuple[bool, int] | None, step: int, phase: str
    ) -> None:
        """Feed the safety net run-phase step ``step`` (``phase``: the one it ran in); revert or re-arm.

        ``alone`` is the replicas' verdict, on the steps an exchange of paces completes: whether this
        replica alone was slow, and at which step. With several replicas a trip waits for a verdict about a
        step of the slow streak that says the other replicas were slow too.
        """
        if self.runner is None:
            if phase == SessionPhase.SAFETY_NET:
                self._rearm_after(figures)
            return
        if alone is not None and alone[0]:
            self.safety.excuse()
            return
        allowed_s = self.allowed_time_s(self.runner.predicted_time_s)
        allowed_w = allowed_power_w(self.config.target, self.runner.point, self.context.pipeline_rank)
        power_w = None if allowed_w is None else figures.energy_j / figures.iteration_s
        noise_s = self.baseline.iteration_noise_s
        replicas = self.context.data_parallel_size > 1
        observed = self.safety.observe(
            figures.iteration_s, allowed_s, power_w, allowed_w, noise_s, hold=replicas
        )
        if observed or (alone is not None and self.safety.confirm(since=step - alone[1])):
            self.runner = None
            if self.phase_switcher is not None:
                self.phase_switcher.cancel()  # no phase clock lands after the reset
            self.controller.request(RESET)
            self.phase = SessionPhase.SAFETY_NET
            broken = (
                f"power {power_w:.1f} W exceeded the allowed {allowed_w:.1f} W (power budget)"
                if self.safety.last_cause == "power" and power_w is not None and allowed_w is not None
                else f"iteration time {1e3 * figures.iteration_s:.1f} ms exceeded the allowed "
                f"{1e3 * allowed_s:.1f} ms"
            )
            outcome = (
                "clocks reverted to stock"
                if self.can_set_clocks
                else "the plan is left (no clock had been set, so the slowdown came from outside the plan)"
            )
            until = (
                ", until stock steps show the slowdown is not the plan's and it has passed"
                if self.safety.last_cause == "time" and self.safety.rearms > 0
                else " for the rest of the run"
            )
            self.printer(
                f"[energy] rank {self.context.global_rank}: {broken} by more "
                f"than {100 * self.config.safety_tolerance:.0f}% for {self.config.safety_steps} consecutive "
                f"steps; {outcome}{until}"
            )

    def _rearm_after(self, figures: StepFigures) -> None:
        """A stock step after a trip: the plan runs again once the net re-arms (``observe_stock``)."""
        stock_s, plan = self.baseline.iteration_s, self.plan
        if stock_s is None or plan is None:
            return
        if not self.safety.observe_stock(figures.iteration_s, stock_s, self.baseline.iteration_noise_s):
            return
        rank = self.context.pipeline_rank
        self.runner = PlanRunner(plan, rank, self.context.orders.steps(rank))
        self.straggler = StragglerPolicy(nominal_time_s=plan.target_point.iteration_time_s)
        self.phase = SessionPhase.PLANNED
        self.printer(
            f"[energy] rank {self.context.global_rank}: stock steps were as slow as the plan's, then "
            f"recovered (the slowdown came from outside the plan); the plan runs again ({self.safety.rearms} "
            "more re-arm(s) left)"
        )
