"""The power sampler: a simulated GPU's reads (modelled), NVML's field mocked at its boundary, the ring."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from megatron_energy.dvfs.backends import open_gpus
from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.dvfs.power_reader import (
    AVERAGE_POWER_FIELD,
    AVERAGE_WINDOW_S,
    INSTANT_FIELD_REFRESH_S,
    INSTANT_POWER_FIELD,
    PowerReader,
    PowerReadingsUnavailableError,
    open_power_reader,
)
from megatron_energy.dvfs.power_sampler import THREAD_NAME, PowerSampler
from megatron_energy.errors import EnergyValueError
from megatron_energy.plugin_threads import cpu_seconds

WORK = WorkProfile(compute_s=0.04, memory_s=0.0)


@pytest.fixture
def handle(tmp_path):
    return open_gpus(
        "simulated", "h200", dry_run=True, num_simulated_gpus=1, state_path=tmp_path / "gpus.json"
    )


def test_a_simulated_gpu_reads_its_modelled_instant_and_averaged_power_on_its_virtual_clock(handle):
    sampler = PowerSampler.from_handle(handle, 0, 0.05)
    gpus = handle.gpus
    gpus.execute(0, WORK)
    gpus.execute(0, WORK)
    sampler.read_once()
    busy_w = gpus.state(0).power_w
    gpus.wait(0, 0.2, blocked=False)
    sampler.read_once()
    samples = sampler.samples()
    assert samples.source == "modelled" and samples.refresh_s == 0.0
    assert samples.instant_source == "instant field 186"
    assert samples.time_s == pytest.approx([gpus.virtual_time_s(0) - 0.2, gpus.virtual_time_s(0)])
    assert samples.instant_w == pytest.approx([busy_w, handle.spec.idle_power_w], abs=1e-3)
    assert busy_w > 2 * handle.spec.idle_power_w
    assert samples.average_w[1] == pytest.approx(gpus.average_power_w(0), abs=1e-3)
    assert samples.average_w[1] > samples.instant_w[1]  # the 1 s average still holds the busy stretch
    assert samples.sm_clock_mhz[1] == handle.spec.default_sm_clock_mhz


def test_a_reading_at_the_same_virtual_time_replaces_the_last_one(handle):
    sampler = PowerSampler.from_handle(handle, 0, 0.05)
    handle.gpus.execute(0, WORK)
    sampler.read_once()
    sampler.read_once()
    assert len(sampler.samples()) == 1


@dataclass
class FakeNvml:
    """NVML at its boundary: averaged 400 W, field answers set by the test, SM clock 1980 MHz.

    Field 185 (the averaged power) is unsupported unless ``average_answer`` says otherwise (as on a GA100).
    """

    field_answer: object = None
    average_answer: object = None
    calls: list[str] = field(default_factory=list)
    asked: list[list[int]] = field(default_factory=list)
    NVML_CLOCK_SM: int = 1

    def nvmlDeviceGetPowerUsage(self, handle):  # noqa: N802
        self.calls.append("power")
        return 400_000

    def nvmlDeviceGetClockInfo(self, handle, clock_type):  # noqa: N802
        return 1980

    def nvmlDeviceGetFieldValues(self, handle, field_ids):  # noqa: N802
        self.calls.append("field")
        self.asked.append(list(field_ids))
        if isinstance(self.field_answer, Exception):
            raise self.field_answer
        answers = {
            AVERAGE_POWER_FIELD: self.average_answer or field_value(0, status=3),
            INSTANT_POWER_FIELD: self.field_answer,
        }
        return [answers[field_id] for field_id in field_ids]


def field_value(value: int, value_type: int = 1, status: int = 0) -> SimpleNamespace:
    members = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
    return SimpleNamespace(
        nvmlReturn=status, valueType=value_type, value=SimpleNamespace(**{members[value_type]: value})
    )


def test_the_instant_field_is_read_in_watts_from_the_member_its_type_names():
    reader = PowerReader(FakeNvml(field_value(612_500, value_type=3)), handle=object())
    reading = reader.read()
    assert (reading.average_w, reading.instant_w, reading.sm_clock_mhz) == (400.0, 612.5, 1980.0)
    assert reader.instant_note == "" and reader.refresh_s == INSTANT_FIELD_REFRESH_S


@pytest.mark.parametrize(
    "answer, says",
    [
        (field_value(0, status=3), "unsupported (NVML return 3)"),
        (RuntimeError("NVML: Not Supported"), "unreadable"),
    ],
)
def test_an_unsupported_instant_field_falls_back_to_the_averaged_power_once_with_a_note(answer, says):
    nvml = FakeNvml(answer)
    reader = PowerReader(nvml, handle=object())
    first, second = reader.read(), reader.read()
    assert first.instant_w == second.instant_w == 400.0
    assert says in reader.instant_note
    assert reader.instant_source == "averaged power (instant field unsupported)"
    assert reader.refresh_s == AVERAGE_WINDOW_S
    assert nvml.calls.count("field") == 1  # not asked again


def test_a_gpu_with_the_averaged_power_field_reads_both_powers_in_one_call():
    nvml = FakeNvml(field_value(612_500), average_answer=field_value(455_000))
    reader = PowerReader(nvml, handle=object())
    first, second = reader.read(), reader.read()
    assert first == second and (first.average_w, first.instant_w) == (455.0, 612.5)
    assert nvml.calls == [
        "field",
        "field",
    ]  # no nvmlDeviceGetPowerUsage: two NVML calls a read, with the clock
    assert nvml.asked == [[AVERAGE_POWER_FIELD, INSTANT_POWER_FIELD]] * 2


def test_without_the_averaged_power_field_the_power_usage_call_stands_in_from_the_first_read_on():
    nvml = FakeNvml(field_value(612_500))
    reader = PowerReader(nvml, handle=object())
    first, second = reader.read(), reader.read()
    assert first == second and (first.average_w, first.instant_w) == (400.0, 612.5)
    assert nvml.asked == [[AVERAGE_POWER_FIELD, INSTANT_POWER_FIELD], [INSTANT_POWER_FIELD]]
    assert nvml.calls.count("power") == 2 and reader.instant_note == ""


class HandlelessGpus:
    """A zeus ``GPUs`` whose two GPUs have no NVML handle (AMD GPUs)."""

    gpus = (object(), object())

    def __len__(self) -> int:
        return 2


def test_a_gpu_without_an_nvml_handle_has_no_power_reader():
    with pytest.raises(PowerReadingsUnavailableError, match="no NVML handle"):
        open_power_reader(HandlelessGpus(), 0)  # type: ignore[arg-type]


class Counter:
    """A clock that advances 1 s at each reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_ring_keeps_the_newest_readings_and_a_span_keeps_the_one_that_holds_into_it():
    sampler = PowerSampler(
        PowerReader(FakeNvml(field_value(500_000)), object()), 0.05, clock=Counter(), capacity=4
    )
    for _ in range(6):
        sampler.read_once()
    assert sampler.samples().time_s.tolist() == [3.0, 4.0, 5.0, 6.0]
    assert sampler.samples().overwritten  # readings 1 and 2 are gone
    span = sampler.samples(4.5, 5.5)
    assert span.time_s.tolist() == [4.0, 5.0] and not span.overwritten
    assert np.all(span.instant_w == 500.0)


def test_a_period_faster_than_nvml_refreshes_is_refused():
    with pytest.raises(EnergyValueError, match=r"below 0\.01 s"):
        PowerSampler(PowerReader(FakeNvml(), object()), 0.001)


def lost(handle: object) -> int:
    raise RuntimeError("GPU is lost")


@pytest.mark.slow
def test_the_thread_reads_on_its_cadence_counts_its_cpu_time_and_stops_on_an_nvml_error():
    nvml = FakeNvml(field_value(500_000))
    sampler = PowerSampler(PowerReader(nvml, object()), 0.02)
    sampler.start()
    time.sleep(0.3)
    assert 5 <= len(sampler.samples()) <= 20
    assert THREAD_NAME in cpu_seconds()
    nvml.nvmlDeviceGetPowerUsage = lost  # type: ignore[method-assign]
    time.sleep(0.1)
    assert sampler.error is not None and "GPU is lost" in sampler.error
    kept = len(sampler.samples())
    sampler.close()
    assert len(sampler.samples()) == kept
