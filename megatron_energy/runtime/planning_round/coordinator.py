"""``PlanningRound``: from a cached plan or a finished profile to one decision every rank takes together.

The round starts at the session's start with the cache: rank 0 loads a verified release and every rank
adopts it, or all profile. At the end of profiling (:meth:`PlanningRound.begin`) the planning replica's
profiles go to rank 0 (``profiling.replica_profile``), where the optimiser plans in a process of its own
(``planning_round.planner_process``); where it plans phases inside instructions, each rank of the planning
replica first reads its kernel timelines in a process of its own (``profiling.kernel_timeline``). On real GPUs
(``--energy-planning``) training goes on meanwhile at stock clocks, in the planning phase, and every K steps
the ranks ask, one group a step, whether every rank has read its timelines and then whether rank 0's planner
has ended (:meth:`PlanningRound.poll`, ``control_plane.staged_exchange.any_rank_stages``); on simulated GPUs
rank 0 waits for the planner at once, so their runs stay deterministic. The decision then goes down a tree of
the job's groups (``control_plane.group_chain.broadcast_from_root``) and every rank adopts the plan from the
next step on, or falls back to stock clocks, at the same step.

Whatever fails on any rank (an unreadable or tampered cache, a rank that cannot summarise its profile, a
solver error, a plan a rank cannot run) is agreed on through the collectives every rank joins anyway; no
exception reaches Megatron's step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.controller import RESET
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.optimisers.interface import Optimiser
from megatron_energy.pipeline.collectives import MeasuredBucket
from megatron_energy.pipeline.profile_csv import ProfileSource
from megatron_energy.plan import Plan
from megatron_energy.runtime.child_process import ChildProcess
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import GROUPS, RankComms
from megatron_energy.runtime.control_plane.exchange_period import exchange_period
from megatron_energy.runtime.control_plane.group_chain import (
    broadcast_from_root,
    gather_replica,
    in_planning_replica,
)
from megatron_energy.runtime.control_plane.staged_exchange import StagedExchange, any_rank_stages
from megatron_energy.runtime.parts import Controller
from megatron_energy.runtime.planning_round.adoption import adopt_everywhere
from megatron_energy.runtime.planning_round.cache import JobCache
from megatron_energy.runtime.planning_round.planner_input import planner_input
from megatron_energy.runtime.planning_round.planner_process import PlannerInput
from megatron_energy.runtime.planning_round.planning import (
    Fallback,
    PlanRelease,
    load_release,
    profile_artefacts,
    store_release,
)
from megatron_energy.runtime.profiling.collector import ProfileCollector, ProfileRow, StepRecord
from megatron_energy.runtime.profiling.kernel_timeline import (
    KernelTimeline,
    PendingTimelines,
    ReadTimelines,
    Timelines,
    TimelinesUnread,
    merge_timelines,
    timelines_line,
)
from megatron_energy.runtime.profiling.replica_profile import ReplicaProfile, StageProfile, replica_profile
from megatron_energy.runtime.session_phase import SessionPhase
from megatron_energy.runtime.session_state import SessionState
from megatron_energy.sim.power_floor import modelled_floor_problem

logger = logging.getLogger(__name__)


class PlanningRound:
    """One rank's part in deciding what runs: a cached plan, a new plan, or stock clocks.

    Args:
        config: The ``--energy-*`` configuration.
        context: This rank's place in the job.
        optimiser: The optimiser(s) ``--energy-mode`` selected (its request says what it plans).
        state: The session's state: the round sets the phase, and on adoption the plan, baseline and runner.
        collector: The profile collector whose rows and stock steps the round plans from.
        controller: This rank's clock controller (the round requests stock clocks on a fallback).
        comms: Collectives over the job's process groups.
        cache: The job's ``JobCache``.
        spec: The GPU's spec.
        timer_source: ``measured`` (CUDA events) or ``modelled`` (simulated GPUs).
        can_set_clocks: Whether clocks are really set (otherwise the other clocks are extrapolated).
        grid_mhz: The planning grid, highest (stock) first.
        kernel_timeline: Records the kernel timelines, where the optimiser plans phases; else ``None``.
        on_adopted: Called on every rank with the plan once every rank has adopted it (the run guard starts).
    """

    def __init__(
        self,
        config: EnergyConfig,
        context: JobContext,
        *,
        optimiser: Optimiser,
        state: SessionState,
        collector: ProfileCollector,
        controller: Controller,
        comms: RankComms,
        cache: JobCache,
        spec: GpuSpec,
        timer_source: str,
        can_set_clocks: bool,
        grid_mhz: list[int],
        kernel_timeline: KernelTimeline | None,
        on_adopted: Callable[[Plan], None],
    ) -> None:
        self.config = config
        self.context = context
        self.optimiser = optimiser
        self.state = state
        self.collector = collector
        self.controller = controller
        self.comms = comms
        self.cache = cache
        self.spec = spec
        self.timer_source = timer_source
        self.can_set_clocks = can_set_clocks
        self.grid_mhz = list(grid_mhz)
        self.kernel_timeline = kernel_timeline
        self.on_adopted = on_adopted
        self.background = config.planning == "background" or (
            config.planning == "auto" and timer_source == "measured"
        )
        """Whether training goes on at stock clocks while the plan is computed (``--energy-planning``)."""
        self._buckets: tuple[MeasuredBucket, ...] | None = None  # every pipeline rank's, gathered to plan
        self._planner: ChildProcess[PlanRelease | Fallback] | PlanRelease | Fallback | None = None
        """Rank 0, from the start of planning to the decision: the planner process, or why it did not start,
        or (in the background, once polled) its outcome."""
        self._replica: ReplicaProfile | None = None
        """From the end of profiling until the planner starts: the planning replica's profile."""
        self._timelines: PendingTimelines | None = None
        """Likewise, where the optimiser plans phases: this rank's kernel timelines being read."""
        self._polls: StagedExchange[bool] | None = None
        """While the planner runs in the background: whether rank 0 has its outcome, every K steps."""
        self._began = (0, 0.0)  # the step profiling ended at, and when (time.monotonic)
        self._cache_writer: threading.Thread | None = None
        """Rank 0, once a plan is adopted: the thread caching it (``close`` waits for it)."""

    @property
    def profile_source(self) -> ProfileSource:
        """Where the profile's figures come from (its CSV says so too).

        ``measured`` when the grid's clocks were really set and timed on GPUs, ``simulated`` when they were
        set and timed on simulated GPUs (whose figures are the model's), ``modelled`` when only the stock
        clock was profiled and the rest extrapolated with the model.
        """
        if not self.can_set_clocks:
            return "modelled"
        return "simulated" if self.timer_source == "modelled" else "measured"

    # ------------------------------------------------------------------------------- before profiling

    def start_from_cache(self) -> None:
        """Rank 0 loads the cached release (if any and verified); every rank adopts it, or all profile.

        Where the cached profile shows the target out of reach, every rank falls back at once, and rank 0
        says why (``planning.load_release``).

        A cache that verifies but cannot be used (a baseline that is not one, a plan of another job, a plan
        some rank cannot run) is moved aside by rank 0 like one that fails verification, so the store after
        re-planning never overwrites it.
        """
        decision: PlanRelease | Fallback | None = None
        if self.context.global_rank == 0:
            try:
                decision, message = load_release(self.cache)
            except Exception as problem:  # any unreadable cache means: profile again
                decision, message = None, self._set_cache_aside(f"unusable ({problem})")
            logger.info(f"[energy] {message}")
        decision = broadcast_from_root(self.comms, decision)
        if isinstance(decision, Fallback):  # the cached profile already says the target is out of reach
            self.fall_back(decision, once=True)
        elif decision is not None and not self._adopt_everywhere(decision):
            if self.context.global_rank == 0:
                logger.info(f"[energy] {self._set_cache_aside('holds a plan a rank cannot run')}")
            logger.info(
                f"[energy] rank {self.context.global_rank}: not using the cached plan; profiling again"
            )

    def refuse_budget_out_of_reach(self) -> None:
        """On simulated GPUs, a power budget below the job's modelled power at the lowest clock: no profiling.

        Simulated GPUs are the GPU spec's model, so the model knows before profiling what the job draws with
        every instruction at the spec's lowest clock (``sim.power_floor.slowest_power_w``). Every rank
        computes the same figure and falls back together, at stock clocks; rank 0 alone says why. On GPUs
        the budget is checked against the profile, after profiling.
        """
        shape = self.context.shape
        if self.timer_source != "modelled" or shape is None:
            return
        problem = modelled_floor_problem(self.config.target, shape, self.spec, self.context.orders)
        if problem is not None:
            self.fall_back(problem, once=True)

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

    # --------------------------------------------------------------------------------- after profiling

    def begin(self, step: int) -> None:
        """At the end of profiling (``step``): the planning replica's profiles on rank 0, planning begun.

        The other ranks take part in fixed-size reductions only (``profiling.replica_profile``). Where the
        optimiser plans phases, each rank of the planning replica starts reading its kernel timelines in a
        child process. With background planning every rank then trains at stock clocks in the planning phase
        and asks every K steps whether every rank has read its timelines, then whether the outcome has come
        (:meth:`poll`); otherwise the timelines and rank 0's planner are waited for here and every rank takes
        the decision at this step's end.
        """
        self._buckets = self._gather_buckets()
        self._replica = replica_profile(
            self.comms,
            self._profile_contribution(),
            self.collector.stock_iters,
            self.grid_mhz[0],
            self.context.global_rank,
        )
        self._began = (step, time.monotonic())
        self._timelines = self._read_timelines() if self.optimiser.request.phases else None
        if not self.background:
            self._start_planning()
            self._take_decision(step)
            return
        sizes = [self.comms.size(group) for group in GROUPS]
        self._polls = StagedExchange(exchange_period(sizes, self._replica.stock.iteration_s))
        self.controller.request(RESET)  # the last profiled clock need not be the stock one
        self.state.phase = SessionPhase.PLANNING
        if self._timelines is None:
            self._start_planning()

    def poll(self, step: int) -> None:
        """A planning-phase step: every K steps, one link a step, whether planning may go on.

        While kernel timelines are read, the exchange asks whether any rank still reads its own; once none
        does, every rank gathers them at that step and rank 0 starts the planner. Then it asks whether rank 0
        has the planner's outcome; once the exchange (``control_plane.staged_exchange.any_rank_stages``) says
        so, every rank takes the decision at the same step.
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

    def close(self) -> None:
        """Stop what the round still runs: the planner and timeline processes; wait for the cache writer.

        A job that ends while its planner runs (rank 0) caches its complete profile without a plan.
        """
        if isinstance(self._planner, ChildProcess):
            self._planner.terminate()
            task = self._planner.task
            assert isinstance(task, PlannerInput)
            artefacts = profile_artefacts(task.profile, task.job, task.baseline, self.optimiser.request)
            kept = self._keep_profile(artefacts, "the next run of this job plans from it without profiling")
            logger.info(f"[energy] the job ended while planning; {kept}")
        if self._cache_writer is not None:
            self._cache_writer.join()
        if self._timelines is not None:
            self._timelines.terminate()

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
            logger.info(f"[energy] rank {rank}: kernel timeline not read: {outcome.reason}")
            return {}
        return outcome

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
            self.fall_back(decision)
        elif not self._adopt_everywhere(decision):
            self.fall_back("a rank could not run the plan (its log says why)")
        elif self.context.global_rank == 0:
            self._cache_writer = threading.Thread(
                target=self._store, args=(decision,), name="megatron_energy cache writer", daemon=True
            )
            self._cache_writer.start()
            logger.info(self._took_effect_line(step, time.perf_counter() - began_s))

    def _took_effect_line(self, step: int, adopting_s: float) -> str:
        """Rank 0's line: when the plan took effect, how long planning and adopting took (measured).

        Planning: wall clock since profiling ended; adopting: the training thread's time in the decision's
        broadcast, the plan's parsing and the runner's set-up.
        """
        began_step, began_s = self._began
        took = f"plan took effect at iteration {step + 2}: computed in {time.monotonic() - began_s:.1f} s"
        adopting = f"adopting it took {1e3 * adopting_s:.1f} ms of the training thread (measured)"
        if self.background:
            return f"[energy] {took} while {step - began_step} iteration(s) ran at stock clocks; {adopting}"
        why = "--energy-planning wait" if self.config.planning == "wait" else "simulated GPUs"
        return f"[energy] {took} while training waited for it ({why}); {adopting}"

    def _profile_contribution(self) -> tuple[list[ProfileRow], list[StepRecord]] | Fallback:
        """This rank's rows and measured stock steps, or why it has none (logged here too)."""
        try:
            return self.collector.rows(), self.collector.stock_steps()
        except Exception as problem:  # agreed on in the reductions: rank 0 decides for every rank
            reason = f"rank {self.context.global_rank} could not summarise its profile: {problem}"
            logger.info(f"[energy] {reason}")
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
            logger.info(f"[energy] {timelines_line(timelines, self.timer_source, clocks)}")
        try:
            job_input = planner_input(
                self.config,
                self.context,
                self.spec,
                self.cache.fingerprint,
                self.optimiser.request,
                profiles,
                replica.stock,
                timelines,
                self._buckets,
                can_set_clocks=self.can_set_clocks,
                grid_mhz=self.grid_mhz,
                profile_source=self.profile_source,
                timer_source=self.timer_source,
            )
            return ChildProcess(job_input)
        except Exception as problem:  # planning must never break the training step
            return Fallback(f"planning failed: {type(problem).__name__}: {problem}")

    def _store(self, release: PlanRelease) -> None:
        """Cache the release every rank runs; a write error only costs the next run a profile.

        Rank 0 runs it on the cache writer thread, so the writes' fsyncs stay off the training thread.
        """
        try:
            store_release(self.cache, release)
        except OSError as problem:
            logger.info(
                f"[energy] could not cache the plan in {self.cache.folder} ({problem}); running it uncached, "
                "the next run profiles again"
            )

    def _report_spread(self, profiles: list[StageProfile]) -> None:
        """Rank 0 says which stages' ranks differ at stock clocks beyond the tolerance (``StageSpread``)."""
        for stage, profile in enumerate(profiles):
            spread = profile.spread.disagreement()
            if spread is not None:
                logger.info(
                    f"[energy] stage {stage}: its tensor- and data-parallel ranks differ at stock clocks "
                    f"({self.timer_source}): {spread}; the plan is made from rank {profile.global_rank}'s "
                    "profile, and a slower replica is followed as a straggler"
                )

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

    # -------------------------------------------------------------------------------------- decisions

    def _adopt_everywhere(self, release: PlanRelease) -> bool:
        """Every rank adopts ``release``, or none does (``planning_round.adoption``)."""
        return adopt_everywhere(
            release,
            fingerprint=self.cache.fingerprint,
            context=self.context,
            comms=self.comms,
            state=self.state,
            controller=self.controller,
            on_adopted=self.on_adopted,
        )

    def fall_back(self, decision: Fallback | str, once: bool = False) -> None:
        """Run the rest of the job at stock clocks; every rank comes here together.

        Each rank says why, except where the target cannot be met (``once``, or a sound profile came with the
        decision): rank 0 then says it, once, for every rank, and caches the profile, if any, for a run with
        another target (``planning_round.replanning``).
        """
        fallback = Fallback(decision) if isinstance(decision, str) else decision
        self.state.stop()
        self.controller.request(RESET)
        self.controller.set_memory_clock(None)
        self.state.phase = SessionPhase.PLANNING_FAILED
        rank = self.context.global_rank
        if fallback.profile_artefacts is None and not once:
            logger.info(
                f"[energy] rank {rank}: not optimising, training continues at stock clocks: {fallback.reason}"
            )
        elif rank == 0:
            artefacts = fallback.profile_artefacts
            kept = ""
            if artefacts is not None:
                advice = "run again with another --energy-target and it is planned without profiling"
                kept = f"; {self._keep_profile(artefacts, advice)}"
            logger.info(
                "[energy] not optimising, training continues at stock clocks on every rank: "
                f"{fallback.reason}{kept}"
            )

    def _keep_profile(self, artefacts: dict[str, str], advice: str) -> str:
        """Cache the profile without a plan (rank 0); what the log says of it, with ``advice`` if kept."""
        try:
            self.cache.store(artefacts)
        except OSError as problem:
            return f"the profile could not be cached in {self.cache.folder} ({problem})"
        return f"the profile is cached in {self.cache.folder}: {advice}"
