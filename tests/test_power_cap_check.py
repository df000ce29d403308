"""The power-cap check's parts: reads in stock profile steps only, the model's clock, the line, the record.

The world tests (``test_power_cap_check_world``) run it in a live job; here each part on its own, on a
simulated H100 (modelled figures) or a stand-in NVML (the boundary, for the error paths).
"""

from __future__ import annotations

import json

import pynvml
import pytest

from megatron_energy.dvfs.clock_events import ClockEventReader, open_clock_events
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.simulated import SimulatedGPUs
from megatron_energy.dvfs.simulated_nvml import SimulatedNvml
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.runtime.energy_log.energy_line import (
    EnergyRecord,
    append_json_line,
    append_record,
    read_records,
)
from megatron_energy.runtime.energy_log.power_cap_record import PowerCapRecord, read_power_cap_records
from megatron_energy.runtime.profiling.collector import PlannedStep, ProfileRow
from megatron_energy.runtime.profiling.power_cap_check import (
    KindCheck,
    PowerCapCheck,
    check_line,
    power_cap_check,
    unavailable_line,
)
from megatron_energy.runtime.profiling.power_cap_watch import CappedWork, PowerCapSamples, PowerCapWatch

SPEC = load_gpu_spec("h100-sxm")
FORWARD = WorkProfile(compute_s=0.0019, memory_s=0.00046, fixed_s=0.000144)
"""Held near 1608 MHz by the H100's 700 W limit (modelled)."""
GRID_MHZ = (1980, 1200)  # one clock below the work's cap clock (~1450 MHz), so its fit splits the work
FORWARD_WORK = Work(0, 0, "forward")


def rows(work: WorkProfile = FORWARD) -> list[ProfileRow]:
    """The profile rows of ``work`` at the grid's clocks, as a simulated GPU measures them (modelled)."""
    model = GpuPowerModel(SPEC)
    return [
        ProfileRow(FORWARD_WORK, clock, model.time_s(work, clock), model.energy_j(work, clock), 4)
        for clock in GRID_MHZ
    ]


def run_step(
    watch: PowerCapWatch, gpus: SimulatedGPUs, planned: PlannedStep | None, microbatches: int
) -> None:
    """One step of forward passes on the simulated GPU, the watch told of each instruction's end."""
    watch.begin_step(planned)
    for microbatch in range(microbatches):
        gpus.execute(0, FORWARD)
        watch.instruction_end(Instruction(0, 0, microbatch, "forward"))


@pytest.fixture
def gpus(tmp_path) -> SimulatedGPUs:
    return SimulatedGPUs(SPEC, state_path=tmp_path / "gpus.json")


def test_the_watch_reads_in_the_stock_clocks_profile_steps_only(gpus) -> None:
    watch = PowerCapWatch(open_clock_events(gpus, 0), stock_clock_mhz=1980)
    for planned in (
        PlannedStep(1980, "settling"),
        PlannedStep(1980, "baseline"),
        PlannedStep(1200, "profile"),
    ):
        run_step(watch, gpus, planned, 3)
    run_step(watch, gpus, None, 3)  # the run phase
    assert watch.summary(rows, SPEC, global_rank=5) == PowerCapSamples(5)
    run_step(watch, gpus, PlannedStep(1980, "profile"), 3)
    samples = watch.summary(rows, SPEC, global_rank=5)
    predicted = GpuPowerModel(SPEC).effective_clock_mhz(FORWARD, 1980)
    (capped,) = samples.capped
    assert (samples.reads, samples.unavailable, capped.work, capped.reads) == (3, None, FORWARD_WORK, 3)
    assert capped.clocks_mhz == (round(predicted),) * 3
    assert capped.predicted_mhz == pytest.approx(predicted, abs=0.5)  # fitted to the rows: the same work


def test_rows_are_asked_for_only_when_a_read_was_capped(gpus) -> None:
    gpus.lock_clocks(0, 1200, 1200)  # below the cap's clock
    gpus.wait(0, 1.0, blocked=True)
    watch = PowerCapWatch(open_clock_events(gpus, 0), stock_clock_mhz=1200)

    def no_rows() -> list[ProfileRow]:
        raise AssertionError("rows asked for")

    run_step(watch, gpus, PlannedStep(1200, "profile"), 2)
    assert watch.summary(no_rows, SPEC, global_rank=0) == PowerCapSamples(0, reads=2)


class _NvmlRefusingReasons(SimulatedNvml):
    """The NVML boundary of a driver that refuses the reasons call (``pynvml``'s own error)."""

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:  # noqa: N802 - NVML's name
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_a_refused_read_ends_the_watch_and_the_summary_says_why(gpus) -> None:
    watch = PowerCapWatch(ClockEventReader(_NvmlRefusingReasons(gpus), 0), stock_clock_mhz=1980)
    run_step(watch, gpus, PlannedStep(1980, "profile"), 3)
    run_step(watch, gpus, PlannedStep(1980, "profile"), 3)
    samples = watch.summary(rows, SPEC, global_rank=1)
    assert (samples.reads, samples.capped, watch.reader) == (0, (), None)
    assert samples.unavailable is not None
    assert (
        "reading the clock-event reasons failed (NVMLError_NotSupported: Not Supported)"
        in samples.unavailable
    )


def test_rows_without_energy_make_the_check_unavailable_on_that_rank(gpus) -> None:
    watch = PowerCapWatch(open_clock_events(gpus, 0), stock_clock_mhz=1980)
    run_step(watch, gpus, PlannedStep(1980, "profile"), 1)

    def unmetered() -> list[ProfileRow]:
        return [ProfileRow(FORWARD_WORK, 1980, 0.003, 0.0, 1)]

    samples = watch.summary(unmetered, SPEC, global_rank=2)
    assert samples.capped == () and samples.reads == 1
    assert samples.unavailable is not None and samples.unavailable.startswith("no work profile to predict")


def capped(stage: int, kind: str, clocks: tuple[int, ...], predicted_mhz: float) -> CappedWork:
    return CappedWork(Work(stage, 0, kind), len(clocks) + 1, clocks, predicted_mhz)


def test_the_check_takes_medians_per_kind_over_the_replica() -> None:
    gathered = [
        PowerCapSamples(
            0, 8, (capped(0, "backward", (1400, 1420), 1450.0), capped(0, "forward", (1380,), 1412.0))
        ),
        None,  # a rank without a watch
        PowerCapSamples(2, 8, (capped(1, "forward", (1370, 1390), 1400.0),)),
        PowerCapSamples(3, 0, unavailable="no reasons call"),
    ]
    check = power_cap_check(gathered, "h100-sxm", 1980, "measured")
    assert check is not None
    forward, backward = check.kinds
    assert (forward.kind, forward.classes, forward.capped_reads, forward.reads) == ("forward", 2, 3, 5)
    assert (forward.measured_mhz, forward.modelled_mhz) == (1380.0, 1400.0)  # medians of the same 3 reads
    assert (backward.kind, backward.measured_mhz, backward.modelled_mhz) == ("backward", 1410.0, 1450.0)
    line = check_line(check)
    assert line.startswith(
        "[energy] power-cap check at the stock clock (1980 MHz): forward held at the power "
    )
    assert (
        "forward held at the power cap in 3 of 5 reads (2 instruction classes) ran at 1380 MHz (median, "
        "measured) where the model predicts 1400 MHz (median, modelled, h100-sxm): model +1.4 % vs measured; "
        "backward"
    ) in line
    assert "backward held at the power cap in 2 of 3 reads (1 instruction class) ran at 1410 MHz" in line


def test_nothing_capped_is_no_check_and_unavailable_ranks_are_named_once() -> None:
    gathered = [
        PowerCapSamples(0, 8),
        PowerCapSamples(1, 0, unavailable="why"),
        PowerCapSamples(2, 0, unavailable="why"),
    ]
    assert power_cap_check(gathered, "h100-sxm", 1980, "measured") is None
    assert unavailable_line(gathered) == (
        "[energy] power-cap check unavailable (ranks 1, 2: why); training goes on without it"
    )
    assert unavailable_line([PowerCapSamples(0, 8), None]) is None


def test_the_record_sits_beside_the_iteration_records_of_the_energy_log(tmp_path) -> None:
    path = tmp_path / "log.jsonl"
    kinds = (KindCheck("forward", 2, 3, 5, 1380.0, 1400.0),)
    record = PowerCapRecord(12, PowerCapCheck("h100-sxm", 1980, "measured", kinds), job="ab12")
    append_record(path, EnergyRecord(11, "profiling", "measured", {"energy/iteration_s": 0.5}, job="ab12"))
    append_json_line(path, record.to_json())
    assert [r.iteration for r in read_records(path)] == [11]
    (read,) = read_power_cap_records(path)
    assert (read.iteration, read.check, read.job) == (12, record.check, "ab12")
    assert json.loads(path.read_text().splitlines()[1])["record"] == "power-cap check"


def test_a_broken_record_is_refused_with_its_line(tmp_path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(
        json.dumps({"record": "power-cap check", "iteration": 3, "clock_source": "guessed"}) + "\n"
    )
    with pytest.raises(ValueError, match=r"log\.jsonl:1 is not a power-cap check record"):
        read_power_cap_records(path)
