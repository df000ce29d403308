"""One rank's power log: its GPU's sampled power at each log interval, as a record, scalars and a raw trace.

The rank's :class:`~megatron_energy.dvfs.power_sampler.PowerSampler` reads its GPU on a thread of its own;
the session tells the power log where each iteration ends (:meth:`PowerLog.step_end`, on the host, at the
step's end hook, stamped with the sampler's clock). That is all the training thread does, O(1) a step: at a
log interval's last iteration it hands the interval (its start, its iteration ends) to the sampler's thread
(:meth:`~megatron_energy.dvfs.power_sampler.PowerSampler.run_beside`), which after its next read takes the
interval's readings from its ring, makes the figures (``runtime.energy_log.power_interval.interval_power``,
one vectorised pass) and, with ``--energy-power-trace``, appends the readings and iteration ends to the
rank's own trace file (``runtime.energy_log.power_trace_file``; the file is the power log's alone). At a
later step end the training thread writes what the thread finished, in iteration order: rank 0 appends the
:class:`~megatron_energy.runtime.energy_log.power_record.PowerRecord` to ``--energy-log-file`` (the energy
logger's writer), a rank with metric writers writes its scalars. At :meth:`PowerLog.close` the intervals
still pending are finished within :data:`CLOSE_BUDGET_S`; any left are named. Nothing here is a collective;
the figures are the rank's own GPU's, of a fixed size whatever the job's. The training thread takes one
reading itself only when the sampler took none in the interval (a simulated GPU's virtual time can run far
ahead of the wall clock the thread sleeps on), so every interval has one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.backends import GpuHandle
from megatron_energy.dvfs.power_reader import PowerReadingsUnavailableError
from megatron_energy.dvfs.power_sampler import PowerSampler
from megatron_energy.energy_dir import JobFiles
from megatron_energy.errors import EnergyValueError
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.energy_log.energy_line import write_scalars
from megatron_energy.runtime.energy_log.power_interval import interval_power
from megatron_energy.runtime.energy_log.power_record import PowerRecord, power_scalars
from megatron_energy.runtime.energy_log.power_trace_file import PowerTraceWriter

logger = logging.getLogger(__name__)

CLOSE_BUDGET_S = 10.0
"""How long :meth:`PowerLog.close` spends finishing the intervals still pending; the rest are named as left
out. One interval of 100 iterations of 20 ms readings takes about a millisecond."""


def open_power_log(
    config: EnergyConfig, handle: GpuHandle, context: JobContext, job: JobFiles
) -> PowerLog | None:
    """The rank's power log (sampling) as ``--energy-power-sample-ms`` and ``--energy-power-trace`` ask.

    ``None`` when sampling is off, or when the GPU's power cannot be read (the rank says why, once).
    """
    if config.power_sample_ms == 0:
        return None
    index = context.local_device_index
    try:
        sampler = PowerSampler.from_handle(handle, index, config.power_sample_ms / 1000.0)
        sampler.read_once()  # the first interval's first reading; a GPU that cannot be read says so here
    except (PowerReadingsUnavailableError, ImportError) as problem:
        logger.warning(f"[energy] rank {context.global_rank}: no power log ({problem})")
        return None
    except Exception as problem:  # an NVML error on the first read
        why = f"GPU {index}: {type(problem).__name__}: {problem}"
        logger.warning(f"[energy] rank {context.global_rank}: no power log ({why})")
        return None
    trace = None
    if config.power_trace != "off":
        path = job.power_trace(context.global_rank, config.power_trace)
        trace = PowerTraceWriter(path, config.power_trace, context.global_rank, index)
    return PowerLog(
        sampler,
        rank=context.global_rank,
        gpu=index,
        log_interval=context.log_interval,
        sinks=context.log_sinks,
        trace=trace,
    )


@dataclass(frozen=True)
class PendingInterval:
    """An interval whose iteration ends the training thread noted, for the sampler's thread to finish."""

    start_s: float
    """When its first iteration began (the previous iteration's end; the sampler's clock). Units: s."""
    ends: tuple[tuple[int, float], ...]
    """Each iteration's ``(iteration, end)``, 1-based, oldest first."""
    phase: str
    """What ran in its last iteration."""
    logged: bool
    """Whether it gets figures (a record, scalars); otherwise only its trace rows (steps the log missed)."""
    trace_end_s: float
    """The trace takes the readings up to here. Units: s."""


class PowerLog:
    """The power part of one rank's energy log (module docstring).

    Args:
        sampler: The rank's GPU's sampler, holding a first reading (started here).
        rank: The global rank.
        gpu: The GPU's local index.
        log_interval: Iterations per log interval.
        sinks: The rank's metric writers (empty on ranks without them).
        trace: The raw trace's writer (``--energy-power-trace``), or ``None``.

    Attributes:
        write_record: Appends a record to ``--energy-log-file`` (the energy logger's writer, set by the
            session); ``None`` on every rank but 0.
        job: The job's fingerprint, written into every record.
    """

    def __init__(
        self,
        sampler: PowerSampler,
        *,
        rank: int,
        gpu: int,
        log_interval: int,
        sinks: tuple[Callable[[str, float, int], Any], ...],
        trace: PowerTraceWriter | None = None,
    ) -> None:
        self.sampler = sampler
        self.rank = rank
        self.gpu = gpu
        self.log_interval = log_interval
        self.sinks = sinks
        self.trace = trace
        self.write_record: Callable[[PowerRecord], None] | None = None
        self.job = ""
        self._start_s = sampler.clock()
        """When the interval's first iteration began (the previous iteration's end)."""
        self._ends: list[tuple[int, float]] = []
        """The interval's iterations so far and their ends."""
        self._last_step: int | None = None
        """The last step whose end the log saw (0-based)."""
        self._pending: deque[PendingInterval] = deque()
        """Intervals handed to the sampler's thread and not finished yet, oldest first."""
        self._finished: deque[PowerRecord] = deque()
        """Records the sampler's thread finished, for the training thread to write, oldest first."""
        sampler.start()

    def step_end(self, step: int, phase: str) -> None:
        """Note where step ``step`` (0-based) ended; at a log interval's end, hand the interval over.

        O(1) on the training thread: the interval's figures and trace rows are made on the sampler's thread
        (:meth:`PowerSampler.run_beside`); the records it finished are written here, at the next step end.
        After steps the log did not see (the overhead check's suspended blocks), the interval so far gets
        no record (its iteration ends still go to the trace) and the next starts at this step's end.
        """
        now_s = self.sampler.clock()
        if self._last_step is not None and step != self._last_step + 1:
            trace_end_s = self._ends[-1][1] if self._ends else self._start_s
            self._hand_over(PendingInterval(self._start_s, tuple(self._ends), phase, False, trace_end_s))
            self._ends, self._start_s = [], now_s
        else:
            self._ends.append((step + 1, now_s))
        self._last_step = step
        if (step + 1) % self.log_interval == 0 and self._ends:
            ends, self._ends = tuple(self._ends), []
            start_s, self._start_s = self._start_s, ends[-1][1]
            self._read_if_unread(start_s)
            self._hand_over(PendingInterval(start_s, ends, phase, True, ends[-1][1]))
        self._write_finished()

    def close(self) -> None:
        """Stop the sampler, finish the pending intervals, write the rest of the trace, say what went wrong.

        The pending intervals are finished here within :data:`CLOSE_BUDGET_S`; any left are named.
        """
        self.sampler.close()
        deadline_s = time.monotonic() + CLOSE_BUDGET_S
        while self._pending and time.monotonic() < deadline_s:
            self._finish_oldest()
        if self._pending:
            covered = f"iterations {self._pending[0].ends[0][0]}-{self._pending[-1].ends[-1][0]}"
            logger.warning(f"[energy] rank {self.rank}: {covered}: no power figures (left out at exit)")
            self._pending.clear()
        self._write_finished()
        self._write_trace(list(self._ends))
        if self.sampler.error is not None:
            logger.warning(f"[energy] rank {self.rank} GPU {self.gpu}: {self.sampler.error}")

    def _read_if_unread(self, start_s: float) -> None:
        """One reading now if the thread took none since ``start_s``, so every interval has one.

        A simulated GPU's virtual time can run far ahead of the wall clock the thread sleeps on; a GPU's
        thread reads every period, so this reads nothing there.
        """
        newest_s = self.sampler.newest_s()
        if self.sampler.error is not None or (newest_s is not None and newest_s > start_s):
            return
        try:
            self.sampler.read_once()
        except Exception as problem:  # an NVML error: the interval goes without figures
            self.sampler.error = f"power reading failed: {type(problem).__name__}: {problem}"

    def _hand_over(self, interval: PendingInterval) -> None:
        """Queue ``interval`` for the sampler's thread (or, where it does not run, finish it now)."""
        self._pending.append(interval)
        self.sampler.run_beside(self._finish_oldest)

    def _finish_oldest(self) -> None:
        """The oldest pending interval's figures and trace rows (on the sampler's thread, or at close)."""
        if not self._pending:
            return
        interval = self._pending[0]
        record = self._record(interval) if interval.logged else None
        self._write_trace(list(interval.ends), interval.trace_end_s)
        if record is not None:
            self._finished.append(record)
        self._pending.popleft()

    def _record(self, interval: PendingInterval) -> PowerRecord | None:
        """The interval's record, or ``None`` (said once) where it has no figures."""
        ends, start_s = interval.ends, interval.start_s
        try:
            figures = interval_power(self.sampler.samples(start_s, ends[-1][1]), start_s, ends)
        except EnergyValueError as problem:  # never into the training step: the interval goes without
            covered = f"iterations {ends[0][0]}-{ends[-1][0]}"
            logger.warning(f"[energy] rank {self.rank}: {covered}: no power figures ({problem})")
            return None
        if figures is None:
            return None
        if self.sampler.error is not None:
            note = "; ".join(part for part in (figures.note, self.sampler.error) if part)
            figures = dataclasses.replace(figures, note=note)
        return PowerRecord(ends[-1][0], ends[0][0], interval.phase, self.rank, self.gpu, figures, self.job)

    def _write_finished(self) -> None:
        """Write the records the sampler's thread finished to the energy log and the metric writers."""
        while self._finished:
            record = self._finished.popleft()
            if self.write_record is not None:
                self.write_record(record)
            for iteration, scalars in power_scalars(record).items():
                write_scalars(scalars, iteration, self.sinks)

    def _write_trace(self, ends: list[tuple[int, float]], end_s: float | None = None) -> None:
        """Append the readings up to ``end_s`` (all when ``None``) and ``ends`` to the trace, if one is kept.

        A trace that cannot be written is reported once and no longer kept.
        """
        if self.trace is None:
            return
        samples = self.sampler.samples() if end_s is None else self.sampler.samples(end_s=end_s)
        try:
            self.trace.append(samples, ends)
        except OSError as problem:
            logger.warning(
                f"[energy] rank {self.rank}: cannot append to {self.trace.path} ({problem}); no trace"
            )
            self.trace = None
