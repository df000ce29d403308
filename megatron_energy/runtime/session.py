"""``EnergySession``: one rank's lifecycle, profile → plan → run, dispatched from Megatron's schedule events.

The session is the event dispatcher of four rooms over one explicit phase (``SessionPhase``, in the shared
``SessionState``); it does not know how plans are made (it asks the optimiser ``--energy-mode`` selected,
``optimisers.registry``) and runs whatever plan comes back.

1. **Profiling** (``runtime.profiling``): the controller holds each clock of a grid for a settling step and
   a few measured steps, the stock clock first (``profiling.collector``); the timer times every instruction
   on the device timeline and the whole iteration; the meter gives each step's energy. The stock clock's
   **baseline steps**, as many as ``profiling.baseline_length`` asks (every rank agrees on the count), are
   timed exactly as the run phase times its steps (lagged, no device sync) and are the stock baseline every
   measured change is compared with; the **synchronous profile steps** wait for the device at their begin
   and end, so the counter laps separate the pipeline span's energy from what ran between two schedules
   (``runtime.step_figures``): they give the profile rows and the measured iteration tail; at the stock
   clock, the planning replica also reads the SM clock and its power-cap reason at their instruction ends,
   and at profiling's end rank 0 sets the clock of those held at the cap against the model's
   (``runtime.profiling.power_cap_watch``, ``runtime.profiling.power_cap_check``).
2. **The planning round** (``runtime.planning_round.coordinator.PlanningRound``): a verified cached plan at
   the start, else, at profiling's end, the planning replica's profiles on rank 0, the planner in a process
   of its own, polled every K steps while training goes on at stock clocks (real GPUs) or waited for
   (simulated GPUs), and one decision every rank takes at the same step: adopt the plan, or fall back.
3. **Running the plan** (``runtime.running``): a :class:`PlanRunner` applies this rank's actions at hook
   events (an instruction's clock at its boundary on the GPU timeline, a tail phase's at its outside-phase
   hook); the clocks of phases inside an instruction go to a phase switcher anchored on the instruction's
   start marker (``running.phase_switcher``; ``running.simulated_phases`` on simulated GPUs); an error there
   turns phase switching off with a log line. A step replayed from a full-iteration CUDA graph runs no hook:
   the timer reads the markers captured in the graph, and every clock of the step goes to the phase switcher
   as an offset from the replay's start, measured on the previous replay (``running.graph_requests``).
   After each run-phase step the ``running.run_guard.RunGuard``
   follows a straggling data-parallel replica and reverts to stock clocks when the plan is slow.
4. **The energy log** (``runtime.energy_log``): each step's energy and time next to the prediction, with its
   change against the stock baseline over a window of the phase's iterations; at close the plugin's own host
   time and model vs measured at stock clocks.

Nothing the session does at a run-phase step's end waits for the GPU: a real GPU's timing is read one step
later (``runtime.cuda_timer``), paired with the energy lapped at that step's own end, and the session's
messages go over gloo groups of the job's own groups (``runtime.control_plane``), never one that spans the
world; so the policies and the log see each step one step late. Whatever fails before or during planning on
any rank is agreed on through collectives every rank joins anyway; no exception reaches Megatron's step.
(Whatever stops a rank from starting its session is agreed on earlier, by ``runtime.assembly.build_session``.)
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from typing import Any

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.controller import RESET
from megatron_energy.dvfs.meter import EnergyWindow
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.energy_dir import JobFiles
from megatron_energy.events import CapturedStep
from megatron_energy.optimisers.interface import Optimiser
from megatron_energy.pipeline.instruction import FUSED, FusedInstruction, Instruction, Step
from megatron_energy.pipeline.profile_csv import ProfileSource
from megatron_energy.plan import Plan
from megatron_energy.plan_outcome import run_band
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import RankComms
from megatron_energy.runtime.control_plane.group_chain import gather_replica
from megatron_energy.runtime.energy_log.energy_logger import EnergyLogger
from megatron_energy.runtime.energy_log.host_cost import HostCost, host_timed
from megatron_energy.runtime.energy_log.meter_thread import MeterThread
from megatron_energy.runtime.energy_log.overhead_check import WINDOW as OVERHEAD_WINDOW
from megatron_energy.runtime.energy_log.power_cap_record import PowerCapRecord
from megatron_energy.runtime.energy_log.power_log import PowerLog
from megatron_energy.runtime.energy_log.stock_check import TITLE, compare_stock, comparison_line
from megatron_energy.runtime.graph_replay import GraphReplay
from megatron_energy.runtime.parts import Controller, Guard, Meter, PhaseSwitching
from megatron_energy.runtime.planning_round.cache import JobCache
from megatron_energy.runtime.planning_round.coordinator import PlanningRound
from megatron_energy.runtime.profiling.baseline_length import agree_stock_steps, pilot_steps
from megatron_energy.runtime.profiling.collector import ProfileCollector
from megatron_energy.runtime.profiling.kernel_timeline import KernelTimeline
from megatron_energy.runtime.profiling.partial_profile import close_while_profiling, drop_partial_profile
from megatron_energy.runtime.profiling.power_cap_check import check_line, power_cap_check, unavailable_line
from megatron_energy.runtime.profiling.power_cap_watch import PowerCapWatch
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.runtime.running.plan_runner import PlanRunner
from megatron_energy.runtime.running.run_guard import RunGuard
from megatron_energy.runtime.session_phase import SessionPhase
from megatron_energy.runtime.session_state import SessionState
from megatron_energy.runtime.step_figures import SealedStep, StepFigures
from megatron_energy.runtime.timing import InstructionTimer, StepTiming

logger = logging.getLogger(__name__)


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
        kernel_timeline: Records kernel timelines of one instance per instruction class
            (``runtime.profiling.torch_recorder``: CUDA only) in a recorded step that ends each profiled
            clock's block (their clock response is then measured; a dry run profiles the stock clock alone),
            when the optimiser asks for phases; never in the run phase, and the recorded steps' figures feed
            nothing else (``runtime.profiling.collector``). Rank 0 logs what each recorded step cost on the
            host once its trace is written (``runtime.profiling.recorded_step``). ``None``: the phase planner
            uses the modelled per-class split.
        phase_switcher: Requests a plan's clocks inside instructions (``runtime.running.phase_switcher``);
            ``None``: those phases keep their instruction's clock.
        power_cap: Reads the clock at instruction ends of the stock profile steps, for the power-cap check
            (``runtime.profiling.power_cap_watch``), on the ranks of the planning replica. ``None``: this rank
            reads nothing (it still sends rank 0 its empty samples at profiling's end).
        power_log: The GPU's sampled power at each log interval (``runtime.energy_log.power_log``); ``None``:
            none (``--energy-power-sample-ms 0``, or a GPU whose power cannot be read).
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
        kernel_timeline: KernelTimeline | None = None,
        phase_switcher: PhaseSwitching | None = None,
        power_cap: PowerCapWatch | None = None,
        power_log: PowerLog | None = None,
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
        self.kernel_timeline = kernel_timeline if optimiser.request.phases else None
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
        self.power_cap = power_cap or PowerCapWatch(None, self.collector.clocks_mhz[0])
        self.state = SessionState(phase_switcher=phase_switcher)
        """The phase, the adopted plan and its runner: written by the planning round and the run guard."""
        self.run_guard = RunGuard(
            config,
            context,
            state=self.state,
            controller=controller,
            comms=comms,
            can_set_clocks=can_set_clocks,
        )
        self.planning = PlanningRound(
            config,
            context,
            optimiser=optimiser,
            state=self.state,
            collector=self.collector,
            controller=controller,
            comms=comms,
            cache=cache,
            spec=spec,
            timer_source=timer.source,
            can_set_clocks=can_set_clocks,
            grid_mhz=clocks_mhz,
            kernel_timeline=self.kernel_timeline,
            on_adopted=self._adopted,
        )
        self._stock_decided = False
        self._step_lagged = False  # whether the step running now is timed without a device sync
        self.history: list[StepFigures] = []
        self.host_cost = HostCost()
        self._outside: EnergyWindow | None = None
        self._lapped_at_start = False
        self._sealed: list[SealedStep] = []  # steps ended whose timing the timer has not returned yet
        self._step_boundary: Any = None  # the marker of the running step's start
        self.graph = GraphReplay(timer, inside=config.phase_switching != "off")
        self.energy_logger = EnergyLogger(context, comms, timer.source, spec.energy_counter_period_s)
        self.energy_logger.log_file = config.log_file
        self.energy_logger.job = cache.fingerprint
        self.energy_logger.grid_gco2_per_kwh = config.grid_gco2_per_kwh
        self.energy_logger.power_target = config.target if config.target.kind == "power" else None
        self.power_log = power_log
        if power_log is not None:
            power_log.job = cache.fingerprint
            power_log.write_record = self.energy_logger.write_record if context.global_rank == 0 else None
        self.planning.start_from_cache()
        self.laps.lap()
        if self.state.phase == SessionPhase.PROFILING:
            self.planning.refuse_budget_out_of_reach()

    @property
    def phase(self) -> SessionPhase:
        """What the session is doing now (the energy log names each step by the phase it ran in)."""
        return self.state.phase

    @property
    def plan(self) -> Plan | None:
        """The plan every rank adopted, if any."""
        return self.state.plan

    @property
    def runner(self) -> PlanRunner | None:
        """What applies this rank's actions now; ``None`` while no plan's clocks run."""
        return self.state.runner

    @property
    def baseline(self) -> StockBaseline:
        """The stock baseline every measured change is set against (the adopted release's)."""
        return self.state.baseline

    @property
    def profile_source(self) -> ProfileSource:
        """Where the profile's figures come from: ``measured``, ``simulated`` or ``modelled``."""
        return self.planning.profile_source

    # ----------------------------------------------------------------------------------- schedule events

    @host_timed
    def on_step_begin(self, step: int) -> None:
        """Start a step: choose its clock and kind while profiling, and start timing and metering.

        A synchronous profiling step reads the energy between the two schedules apart: the device finishes
        first, then the meter laps and the outside phases' durations are read, then the step's timing starts.
        A baseline step, like a run-phase step, does none of that.
        """
        planned = self.collector.begin_step() if self.state.phase == SessionPhase.PROFILING else None
        self.power_cap.begin_step(planned)
        self._step_lagged = planned is None or not planned.synchronised
        self._lapped_at_start = not self._step_lagged
        if self._lapped_at_start:
            self.timer.wait_for_device()
            self._outside = self.laps.lap()
            self.collector.add_outside_phases(self.timer.outside_durations())
            if self.kernel_timeline is not None and planned is not None and planned.kind == "recorded":
                self.kernel_timeline.start(planned.clock_mhz, step)
        boundary = self._step_boundary = self.timer.step_begin()
        if planned is not None:
            self.controller.request(planned.clock_mhz, boundary)

    @host_timed
    def on_graph_replay(self, captured: CapturedStep) -> None:
        """The step that began replays the captured graph (``runtime.graph_replay``)."""
        self.graph.begin(captured, self._step, self.runner, self.state.phase_switcher, self._step_boundary)

    def on_unmeasured_step(self, step: int) -> None:
        """Step ``step`` captured the graph: wait for it, then start the next step's energy and cycle anew."""
        self.graph.captured_in_step()
        self.laps.lap()

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
            if self.state.phase_switcher is not None and self.config.phase_switching != "off":
                requests = self.runner.inside_requests(instruction)
                if requests:
                    self.state.phase_switcher.begin(instruction, boundary, requests)

    @host_timed
    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Mark the instruction's end (the phase switcher drops its requests the GPU passes it by)."""
        instruction = self._step(kind, microbatch, chunk)
        marker = self.timer.end(instruction)
        self.power_cap.instruction_end(instruction)
        if self.state.phase_switcher is not None:
            self.state.phase_switcher.end(instruction, marker)
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

    def _adopted(self, plan: Plan) -> None:
        """Every rank runs the plan: the run guard starts, and the log gives modelled changes its band."""
        self.energy_logger.plan_band = run_band(plan, 0.0)
        self.run_guard.start(plan)

    def _check_phase_switcher(self) -> None:
        """Turn phase switching off, with a log line, if an error stopped it; the instruction clocks go on."""
        switcher = self.state.phase_switcher
        problem = None if switcher is None else switcher.take_error()
        if switcher is None or problem is None:
            return
        switcher.close()
        self.state.phase_switcher = None
        if self.graph.replaying:  # every clock of a replayed step went through the switcher
            self.controller.request(RESET)
        clocks = "stock clocks" if self.graph.replaying else "the instruction clocks"
        logger.info(
            f"[energy] rank {self.context.global_rank}: phase switching turned off "
            f"({type(problem).__name__}: {problem}); training continues at {clocks}"
        )

    @host_timed
    def _seal_step(self, step: int) -> None:
        """Seal the step's measurements; handle every step whose timing is complete, and advance the phase.

        A step that ran in the planning phase ends with a step of the poll for the planner's outcome
        (``PlanningRound.poll``).

        A synchronous profiling step waits for the device and returns this step. In a baseline step and in
        the run phase nothing here waits for the GPU: the timer returns the previous step
        (``runtime.cuda_timer``; simulated GPUs still return this one), whose figures the straggler policy,
        the safety net and the log then see one step late. The counter lap is host-only work (an NVML read,
        ~3 ms), taken while the GPU still runs the backward pass queued before it, so it costs the GPU no
        idle time; it is this step's energy, and is kept with the step until its timing comes.
        """
        planning = self.phase == SessionPhase.PLANNING
        if self.power_log is not None:
            self.power_log.step_end(step, self._label(self.phase))
        timings = self.timer.finish_step(lagged=self._step_lagged)
        if self.kernel_timeline is not None:
            if self.kernel_timeline.recording:
                self.kernel_timeline.stop()  # the synchronous step's kernels have run
            self._log_recorded_step()
        self._sealed.append(
            SealedStep(
                step=step,
                phase=self.phase,  # the log describes the step as it ran
                predicted_j=None if self.runner is None else self.runner.predicted_energy_j,
                baseline=StockBaseline() if self.phase == SessionPhase.PROFILING else self.baseline,
                outside=self._outside,
                rest=self.laps.lap_later(),  # read off the training thread (runtime.energy_log.meter_thread)
                lapped_at_start=self._lapped_at_start,
            )
        )
        for timing in timings:
            self._finish(self._sealed.pop(0), timing)
        if planning:
            self.planning.poll(step)

    def _log_recorded_step(self) -> None:
        """Rank 0 logs what a recorded step cost on the host, once its trace is written (measured)."""
        assert self.kernel_timeline is not None
        cost = self.kernel_timeline.finished()
        if cost is not None and self.context.global_rank == 0:
            logger.info(cost.line(self.context.global_rank))

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
        self.graph.timed(timing)
        if sealed.phase == SessionPhase.PROFILING:
            self.collector.add_step(figures)
            if not self._stock_decided and self.collector.stock_begun == self.collector.stock_iters:
                self._stock_decided = True  # at the pilot's end, before another step begins
                period_s = 0.0 if figures.exact else self.spec.energy_counter_period_s
                agree_stock_steps(self.collector, self.comms, period_s)
            if self.collector.done:
                drop_partial_profile(JobFiles(self.cache.folder), self.context.global_rank)
                self._check_power_cap(sealed.step)
                self.planning.begin(sealed.step)
        elif sealed.phase != SessionPhase.PLANNING:  # while planning, at stock clocks: nothing to police
            self.run_guard.after_step(sealed.step, figures, sealed.phase)
        self.energy_logger.add(
            sealed.step, self._label(sealed.phase), figures, sealed.predicted_j, sealed.baseline
        )

    def _check_power_cap(self, step: int) -> None:
        """At profiling's end: the power-cap check (``runtime.profiling.power_cap_check``) on rank 0.

        The planning replica's samples go to rank 0 in one gather over its pipeline (no other rank takes
        part). Rank 0 says once where the check could not be made, and, when some instruction was read held
        at the power cap, prints the check's line and appends its record to ``--energy-log-file``.
        """
        samples = self.power_cap.summary(
            self.collector.rows, self.spec, self.context.global_rank, self.context.compute_mixes(self.spec)
        )
        gathered = gather_replica(self.comms, samples)
        if gathered is None:
            return
        unavailable = unavailable_line(gathered)
        if unavailable is not None:
            logger.info(unavailable)
        check = power_cap_check(gathered, self.spec.name, self.power_cap.stock_clock_mhz, self.timer.source)
        if check is not None:
            logger.info(check_line(check))
            self.energy_logger.write_record(PowerCapRecord(step + 1, check, self.cache.fingerprint))

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
            self.energy_logger.add_unlogged(sealed.step, self._label(sealed.phase), figures)
            if (sealed.step + 1) % self.context.log_interval == 0:
                logger.info(
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
        (``runtime.energy_log.stock_check``): the run's last word on how well the model matched. Every rank
        first logs its own host time in the hooks (``runtime.energy_log.host_cost``), and what became of the
        requests inside instructions (``runtime.running.phase_switcher``). A planner or kernel-timeline
        process still running is terminated first.
        """
        self.planning.close()
        if self.kernel_timeline is not None:
            self.kernel_timeline.close()  # waits for a trace still being written
            self._log_recorded_step()
        if self.state.phase_switcher is not None:
            self.state.phase_switcher.close()
            counts = self.state.phase_switcher.counts
            if counts.scheduled:
                logger.info(f"[energy] rank {self.context.global_rank}: {counts.summary()}")
        self.controller.close()
        if self.guard is not None:
            self.guard.close()
        try:
            self._flush()
        except Exception as problem:  # a failing flush must not mask how the run ended
            logger.info(f"[energy] rank {self.context.global_rank}: last step not logged: {problem}")
        self.energy_logger.close()
        if self.power_log is not None:
            self.power_log.close()
        self.laps.close()
        if self.phase == SessionPhase.PROFILING:  # the job ended first: keep what was measured
            close_while_profiling(
                self.collector, JobFiles(self.cache.folder), self.context.global_rank, self.profile_source
            )
        measured_s = self.baseline.iteration_s if self.timer.source == "measured" else None  # no host/model
        host_line = self.host_cost.summary(self.context.global_rank, measured_s)
        if host_line is not None:
            logger.info(host_line)
        if self.context.global_rank == 0 and self.plan is not None:
            try:
                comparison = compare_stock(self.plan, self.baseline)
            except (ValueError, ZeroDivisionError) as problem:  # a closing line never fails the job
                logger.info(f"[energy] {TITLE}: not computed ({problem})")
                return
            if comparison is not None:
                logger.info(comparison_line(comparison))

    def suspend(self) -> None:
        """Stand aside from the next step on (``energy_log.overhead_check``): stock clocks, held step read.

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
