"""``EnergySession``: one rank's lifecycle, profile → plan → run, dispatched from Megatron's schedule events.

The session is the event dispatcher of four rooms over one explicit phase (``SessionPhase``, in the shared
``SessionState``); it does not know how plans are made (it asks the optimiser ``--energy-mode`` selected,
``optimisers.registry``) and runs whatever plan comes back. The rooms, in the order the data flows through
them (profiling, the planning round, running the plan, the energy log), are described in the runtime's
package docstring (``megatron_energy.runtime``). The session dispatches the step events itself and hands the
instruction and outside-phase events to ``runtime.instruction_events``.

Nothing the session does at a run-phase step's end waits for the GPU: a real GPU's timing is read one step
later (``runtime.cuda_timer``), paired with the energy lapped at that step's own end, and the session's
messages go over gloo groups of the job's own groups (``runtime.control_plane``), never one that spans the
world; so the policies and the log see each step one step late. Whatever fails before or during planning on
any rank is agreed on through collectives every rank joins anyway; no exception reaches Megatron's step.
(Whatever stops a rank from starting its session is agreed on earlier, by ``runtime.assembly.build_session``.)
"""

from __future__ import annotations

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
from megatron_energy.pipeline.profile_csv import ProfileSource
from megatron_energy.plan import Plan
from megatron_energy.plan_outcome import run_band
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import RankComms
from megatron_energy.runtime.energy_log.closing_lines import log_closing_lines
from megatron_energy.runtime.energy_log.energy_logger import EnergyLogger
from megatron_energy.runtime.energy_log.host_cost import HostCost, host_timed
from megatron_energy.runtime.energy_log.meter_thread import MeterThread
from megatron_energy.runtime.energy_log.overhead_check import WINDOW as OVERHEAD_WINDOW
from megatron_energy.runtime.energy_log.power_cap_record import PowerCapRecord
from megatron_energy.runtime.energy_log.power_log import PowerLog
from megatron_energy.runtime.graph_replay import GraphReplay
from megatron_energy.runtime.instruction_events import InstructionEvents
from megatron_energy.runtime.parts import Controller, Guard, Meter, PhaseSwitching
from megatron_energy.runtime.planning_round.cache import JobCache
from megatron_energy.runtime.planning_round.coordinator import PlanningRound
from megatron_energy.runtime.profiling.baseline_length import pilot_steps
from megatron_energy.runtime.profiling.collector import ProfileCollector
from megatron_energy.runtime.profiling.kernel_timeline import KernelTimeline
from megatron_energy.runtime.profiling.partial_profile import close_while_profiling, drop_partial_profile
from megatron_energy.runtime.profiling.power_cap_watch import PowerCapWatch
from megatron_energy.runtime.profiling.profile_steps import ProfileSteps
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
        self.profile_steps = ProfileSteps(
            self.collector, self.power_cap, spec=spec, context=context, comms=comms, clock_source=timer.source
        )
        self.state = SessionState(phase_switcher=phase_switcher)
        """The phase, the adopted plan and its runner: written by the planning round and the run guard."""
        self.instructions = InstructionEvents(
            context,
            timer=timer,
            controller=controller,
            state=self.state,
            power_cap=self.power_cap,
            kernel_timeline=self.kernel_timeline,
            switch_phases=config.phase_switching != "off",
        )
        """The instruction and outside-phase events: their marks and the clocks requested at them."""
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
        self.graph.begin(
            captured, self.instructions.step, self.runner, self.state.phase_switcher, self._step_boundary
        )

    def on_unmeasured_step(self, step: int) -> None:
        """Step ``step`` captured the graph: wait for it, then start the next step's energy and cycle anew."""
        self.graph.captured_in_step()
        self.laps.lap()

    @host_timed
    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Mark the instruction's boundary, and request the plan's clocks there (``instruction_events``)."""
        self.instructions.instruction_begin(kind, microbatch, chunk)

    @host_timed
    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Mark the instruction's end (the phase switcher drops its requests the GPU passes it by)."""
        self.instructions.instruction_end(kind, microbatch, chunk)

    @host_timed
    def on_outside_begin(self, name: str) -> None:
        """Mark an outside phase's start and, when a plan runs, request the clocks planned at its hook."""
        self.instructions.outside_begin(name)

    @host_timed
    def on_outside_end(self, name: str) -> None:
        """Mark an outside phase's end (a simulated GPU runs its emulated work); request a planned restore."""
        self.instructions.outside_end(name)

    def on_p2p_begin(self, op: str) -> None:
        """Pipeline communication needs no action: it is part of the waiting time between instructions."""

    def on_p2p_end(self, op: str) -> None:
        """See ``on_p2p_begin``."""

    def on_step_end(self, step: int) -> None:
        """Seal the step (:meth:`_seal_step`, host-timed), then close its host-time count."""
        run_phase = self.phase != SessionPhase.PROFILING
        self._seal_step(step)
        self.instructions.check_switcher(replaying=self.graph.replaying)
        self.host_cost.end_step(run_phase)

    def _adopted(self, plan: Plan) -> None:
        """Every rank runs the plan: the run guard starts, and the log gives modelled changes its band."""
        self.energy_logger.plan_band = run_band(plan, 0.0)
        self.run_guard.start(plan)

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
        """One step's figures: the profile (``profiling.profile_steps``) or the run policies, then the log."""
        if sealed.phase == SessionPhase.PROFILING:
            timing = self.profile_steps.replica_timing(timing)
        figures = sealed.figures(timing)
        self.history.append(figures)
        self.graph.timed(timing)
        if sealed.phase == SessionPhase.PROFILING:
            self.profile_steps.add(figures)
            if self.collector.done:
                drop_partial_profile(JobFiles(self.cache.folder), self.context.global_rank)
                check = self.profile_steps.check_power_cap()
                if check is not None:  # rank 0 appends its record to --energy-log-file
                    record = PowerCapRecord(sealed.step + 1, check, self.cache.fingerprint)
                    self.energy_logger.write_record(record)
                self.planning.begin(sealed.step)
        elif sealed.phase != SessionPhase.PLANNING:  # while planning, at stock clocks: nothing to police
            self.run_guard.after_step(sealed.step, figures, sealed.phase)
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
        self.instructions.close_switcher()
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
        measured = self.timer.source == "measured"
        log_closing_lines(self.context.global_rank, self.host_cost, self.plan, self.baseline, measured)

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
