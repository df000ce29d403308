"""Which instructions ran held at the power cap while profiling at the stock clock, and what the model says.

A :class:`PowerCapWatch` reads the SM clock and NVML's clock-event reasons (``dvfs.clock_events``: two reads,
tens of microseconds) at each instruction's end hook, in the stock clock's synchronous profile steps only:
never in a baseline step (timed as the run phase is), at another clock or in the run phase, and on no thread
of its own. Each read is attributed to the instruction whose end hook fired: on a simulated GPU it has just
run; on a GPU, whose host runs ahead, it is the instruction just queued, which runs then or soon after (the
read may catch the instruction before it, of the same stage). A read is *held at the power cap* when the
clock is below the stock clock with the software power-cap reason set.

At profiling's end, :meth:`PowerCapWatch.summary` gives what the rank sends rank 0 (:class:`PowerCapSamples`):
per instruction class seen held at the cap, the clocks read (measured; modelled on a simulated GPU) and the
clock the model predicts for it at the stock clock (``GpuPowerModel.effective_clock_mhz`` of the work fitted
to this rank's profile rows of the class, ``dvfs.model.fit_work_profile``, as the planners fit it; modelled).
A read NVML refuses (a driver without the reasons call) stops the watch: the summary says why, once, and
training goes on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from megatron_energy.dvfs.clock_events import ClockEventReader
from megatron_energy.dvfs.kernel_classes import ClassMix
from megatron_energy.dvfs.model import GpuPowerModel, fit_work_profile
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.instruction import FUSED, Step, Work, is_fused_kind
from megatron_energy.runtime.profiling.collector import PlannedStep, ProfileRow


@dataclass(frozen=True)
class CappedWork:
    """One instruction class's reads held at the power cap on one rank, with the model's clock for it."""

    work: Work
    """The instruction class."""
    reads: int
    """How many reads of this class were taken (held at the cap or not)."""
    clocks_mhz: tuple[int, ...]
    """The SM clocks of the reads held at the cap (measured on a GPU, modelled on a simulated one)."""
    predicted_mhz: float
    """The clock the model predicts for the class at the stock clock (modelled)."""

    @property
    def kind(self) -> str:
        """What the log groups it by: ``forward``, ``backward`` or ``fused``."""
        return FUSED if is_fused_kind(self.work.kind) else self.work.kind


@dataclass(frozen=True)
class PowerCapSamples:
    """What one rank of the planning replica sends rank 0 after profiling (``power_cap_check``)."""

    global_rank: int
    """The rank that read them."""
    reads: int = 0
    """Reads taken in all."""
    capped: tuple[CappedWork, ...] = ()
    """The instruction classes seen held at the power cap."""
    unavailable: str | None = None
    """Why the check could not be made on this rank (no reasons call, a refused read); else ``None``."""


@dataclass
class PowerCapWatch:
    """Reads the clock at instruction ends of the stock clock's profile steps (module docstring).

    Args:
        reader: The GPU's clock-event reader; ``None`` reads nothing (see ``unavailable``).
        stock_clock_mhz: The stock clock (the profiling grid's first).
        unavailable: Why there is no reader, when one was wanted; ``None`` when the watch is simply off.
    """

    reader: ClockEventReader | None
    stock_clock_mhz: int
    unavailable: str | None = None
    _active: bool = False
    _reads: dict[Work, int] = field(default_factory=lambda: defaultdict(int))
    _capped: dict[Work, list[int]] = field(default_factory=lambda: defaultdict(list))

    def begin_step(self, planned: PlannedStep | None) -> None:
        """A step begins: read in it only if it is a synchronous profile step at the stock clock."""
        self._active = (
            self.reader is not None
            and planned is not None
            and planned.kind == "profile"
            and planned.clock_mhz == self.stock_clock_mhz
        )

    def instruction_end(self, step: Step) -> None:
        """Read the clock for the instruction whose end hook fired, if this step is read at all."""
        if not self._active or self.reader is None:
            return
        try:
            event = self.reader.read()
        except Exception as problem:  # the NVML boundary: any refusal ends the check, never the step
            self.reader, self._active = None, False
            self.unavailable = f"reading the clock-event reasons failed ({type(problem).__name__}: {problem})"
            return
        self._reads[step.work] += 1
        if event.held_at_power_cap(self.stock_clock_mhz):
            self._capped[step.work].append(event.sm_clock_mhz)

    def summary(
        self,
        rows: Callable[[], Sequence[ProfileRow]],
        spec: GpuSpec,
        global_rank: int,
        mixes: Mapping[Work, ClassMix] | None = None,
    ) -> PowerCapSamples:
        """What this rank sends rank 0: the classes held at the cap with the model's clock for each.

        Args:
            rows: This rank's profile rows (``ProfileCollector.rows``), asked for only if a read was capped.
            spec: The GPU spec of the model.
            global_rank: This rank.
            mixes: The kernel classes of each instruction class's compute time (the workload model's); a
                class missing: bf16 matrix products.

        Never raises: profile rows that cannot be had or fitted (no energy measured) make the check
        unavailable on this rank, and say why.
        """
        reads = sum(self._reads.values())
        if self.unavailable is not None or not self._capped:
            return PowerCapSamples(global_rank, reads, unavailable=self.unavailable)
        try:
            capped = self._predicted(rows(), spec, mixes or {})
        except Exception as problem:  # the check must never stop profiling from ending
            why = f"no work profile to predict the clocks from ({type(problem).__name__}: {problem})"
            return PowerCapSamples(global_rank, reads, unavailable=why)
        return PowerCapSamples(global_rank, reads, capped)

    def _predicted(
        self, rows: Sequence[ProfileRow], spec: GpuSpec, mixes: Mapping[Work, ClassMix]
    ) -> tuple[CappedWork, ...]:
        """Each class held at the cap with the model's clock for it at the stock clock (its rows fitted)."""
        model = GpuPowerModel(spec)
        capped = []
        for work, clocks in sorted(self._capped.items()):
            points = [(row.clock_mhz, row.time_s, row.energy_j) for row in rows if row.work == work]
            fitted = fit_work_profile(spec, points, mixes.get(work)).work
            predicted_mhz = model.effective_clock_mhz(fitted, self.stock_clock_mhz)
            capped.append(CappedWork(work, self._reads[work], tuple(clocks), predicted_mhz))
        return tuple(capped)
