"""``ProfileSteps``: what becomes of a profiling step's figures once the timer returns its timing.

A profiling step's span is the replica's: the maximum of the stages' spans, one fixed-size max over the
pipeline group (a real GPU's timer knows its own stage only; the run phase leaves this to the straggler
exchange every K steps). The step's figures join the profile (``runtime.profiling.collector``); at the stock
pilot's end every rank agrees on how many baseline steps to measure (``runtime.profiling.baseline_length``),
before another step begins.

At profiling's end, the planning replica's power-cap samples (``runtime.profiling.power_cap_watch``) go to
rank 0 in one gather over its pipeline (no other rank takes part); rank 0 says once where the check could not
be made and, when some instruction was read held at the power cap, logs the check's line
(``runtime.profiling.power_cap_check``) and hands the check back for the energy log's record.
"""

from __future__ import annotations

import dataclasses
import logging

from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import RankComms
from megatron_energy.runtime.control_plane.group_chain import gather_replica
from megatron_energy.runtime.profiling.baseline_length import agree_stock_steps
from megatron_energy.runtime.profiling.collector import ProfileCollector
from megatron_energy.runtime.profiling.power_cap_check import (
    PowerCapCheck,
    check_line,
    power_cap_check,
    unavailable_line,
)
from megatron_energy.runtime.profiling.power_cap_watch import PowerCapWatch
from megatron_energy.runtime.step_figures import StepFigures
from megatron_energy.runtime.timing import StepTiming
from megatron_energy.stats import Source

logger = logging.getLogger(__name__)


class ProfileSteps:
    """Takes each timed profiling step into the profile; checks the power cap at profiling's end.

    Args:
        collector: The profile being collected.
        power_cap: This rank's power-cap watch.
        spec: The GPU's spec (its energy counter's period, its name and model for the check).
        context: This rank's place in the job.
        comms: Collectives over the job's process groups.
        clock_source: Where the clocks read come from (the timer's source).
    """

    def __init__(
        self,
        collector: ProfileCollector,
        power_cap: PowerCapWatch,
        *,
        spec: GpuSpec,
        context: JobContext,
        comms: RankComms,
        clock_source: Source,
    ) -> None:
        self.collector = collector
        self.power_cap = power_cap
        self.spec = spec
        self.context = context
        self.comms = comms
        self.clock_source: Source = clock_source
        self._stock_decided = False

    def replica_timing(self, timing: StepTiming) -> StepTiming:
        """The step's timing with the replica's span (the maximum of the stages' spans)."""
        (span_s,) = self.comms.start_all_reduce([timing.intrinsic_s], "max", "pipeline").wait()
        return dataclasses.replace(timing, intrinsic_s=span_s)

    def add(self, figures: StepFigures) -> None:
        """Add a step's figures to the profile; at the stock pilot's end, agree on the baseline's length."""
        self.collector.add_step(figures)
        if not self._stock_decided and self.collector.stock_begun == self.collector.stock_iters:
            self._stock_decided = True  # at the pilot's end, before another step begins
            period_s = 0.0 if figures.exact else self.spec.energy_counter_period_s
            agree_stock_steps(self.collector, self.comms, period_s)

    def check_power_cap(self) -> PowerCapCheck | None:
        """At profiling's end: gather the replica's samples on rank 0 and log the check's lines there.

        Returns:
            On rank 0, the check when some read was held at the power cap; ``None`` otherwise.
        """
        mixes = self.context.compute_mixes(self.spec)
        samples = self.power_cap.summary(self.collector.rows, self.spec, self.context.global_rank, mixes)
        gathered = gather_replica(self.comms, samples)
        if gathered is None:
            return None
        unavailable = unavailable_line(gathered)
        if unavailable is not None:
            logger.info(unavailable)
        check = power_cap_check(gathered, self.spec.name, self.power_cap.stock_clock_mhz, self.clock_source)
        if check is not None:
            logger.info(check_line(check))
        return check
