"""The power log's interval work runs on the sampler's thread; the training thread only notes ends."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from test_power_sampler import FakeNvml, field_value

from megatron_energy.dvfs.power_reader import PowerReader
from megatron_energy.dvfs.power_sampler import PowerSampler
from megatron_energy.runtime.energy_log import power_log
from megatron_energy.runtime.energy_log.power_log import PowerLog
from megatron_energy.runtime.energy_log.power_record import PowerRecord


class GatedNvml(FakeNvml):
    """NVML whose averaged-power read waits while the gate is shut (a read the test holds up)."""

    def __init__(self) -> None:
        super().__init__(field_value(500_000))
        self.gate = threading.Event()
        self.gate.set()

    def nvmlDeviceGetPowerUsage(self, handle):  # noqa: N802
        self.gate.wait()
        return super().nvmlDeviceGetPowerUsage(handle)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def gated_power_log(clock: Clock) -> tuple[GatedNvml, PowerLog, list[PowerRecord]]:
    """A power log of 2-iteration intervals on a sampler holding readings every 0.1 s up to 2.4 s, whose
    thread is held in its first read until the test opens the gate (nothing handed to it runs till then)."""
    nvml = GatedNvml()
    sampler = PowerSampler(PowerReader(nvml, object()), 0.01, clock=clock)
    for _ in range(25):
        sampler.read_once()
        clock.now = round(clock.now + 0.1, 9)
    clock.now = 0.0
    nvml.gate.clear()
    log = PowerLog(sampler, rank=0, gpu=0, log_interval=2, sinks=())
    records: list[PowerRecord] = []
    log.write_record = records.append
    return nvml, log, records


def end_steps(log: PowerLog, clock: Clock, steps: range) -> None:
    for step in steps:
        clock.now = 0.4 * (step + 1)
        log.step_end(step, "planned")


def test_an_intervals_figures_are_made_on_the_samplers_thread_and_written_at_a_later_step_end(monkeypatch):
    threads: list[str] = []
    made = threading.Event()
    figures = power_log.interval_power

    def figures_seen(*args, **kwargs):
        threads.append(threading.current_thread().name)
        made.set()
        return figures(*args, **kwargs)

    monkeypatch.setattr(power_log, "interval_power", figures_seen)
    sampler = PowerSampler(PowerReader(FakeNvml(field_value(500_000)), object()), 0.01)
    sampler.read_once()
    log = PowerLog(sampler, rank=0, gpu=0, log_interval=2, sinks=())
    records: list[PowerRecord] = []
    log.write_record = records.append
    for step in range(2):
        time.sleep(0.25)
        log.step_end(step, "planned")
    assert records == []  # the training thread handed the interval over, nothing more
    assert made.wait(5.0)
    time.sleep(0.05)
    log.step_end(2, "planned")  # the next step end writes what the thread finished
    assert [(r.first_iteration, r.iteration) for r in records] == [(1, 2)]
    log.close()
    assert threads == ["power-sampler"]
    assert [swing.iteration for swing in records[0].power.iterations] == [1, 2]


def test_close_finishes_the_intervals_still_pending_in_order():
    clock = Clock()
    nvml, log, records = gated_power_log(clock)
    end_steps(log, clock, range(6))
    assert records == []
    nvml.gate.set()
    log.close()
    assert [(r.first_iteration, r.iteration) for r in records] == [(1, 2), (3, 4), (5, 6)]
    assert [swing.duration_s for swing in records[2].power.iterations] == pytest.approx([0.4, 0.4])


def test_intervals_close_cannot_finish_within_its_budget_are_named(monkeypatch, caplog):
    monkeypatch.setattr(power_log, "CLOSE_BUDGET_S", 0.0)
    clock = Clock()
    nvml, log, records = gated_power_log(clock)
    end_steps(log, clock, range(6))
    nvml.gate.set()
    with caplog.at_level(logging.WARNING, logger="megatron_energy"):
        log.close()
    assert len(records) <= 1  # the thread finishes at most the one it took after its read
    assert "-6: no power figures (left out at exit)" in caplog.text


def test_work_handed_to_a_sampler_whose_thread_does_not_run_runs_at_once_in_order():
    sampler = PowerSampler(PowerReader(FakeNvml(field_value(500_000)), object()), 0.01)
    done: list[int] = []
    sampler.run_beside(lambda: done.append(1))
    sampler.run_beside(lambda: done.append(2))
    assert done == [1, 2]


def test_work_that_raises_on_the_samplers_thread_is_reported_and_reading_goes_on(caplog):
    sampler = PowerSampler(PowerReader(FakeNvml(field_value(500_000)), object()), 0.01)
    ran = threading.Event()

    def broken() -> None:
        ran.set()
        raise RuntimeError("bad interval")

    sampler.start()
    with caplog.at_level(logging.ERROR, logger="megatron_energy"):
        sampler.run_beside(broken)
        assert ran.wait(5.0)
        before = len(sampler.samples())
        time.sleep(0.05)
    sampler.close()
    assert len(sampler.samples()) > before and sampler.error is None
    assert "bad interval" in caplog.text
