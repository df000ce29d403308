"""A GPU's power over a log interval: synthetic readings with known answers, the record, the trace."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest
from test_power_sampler import HandlelessGpus

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.backends import GpuHandle, open_gpus
from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.dvfs.power_sampler import PowerSampler, PowerSamples
from megatron_energy.energy_dir import JobFiles
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.energy_log import power_trace_file
from megatron_energy.runtime.energy_log.energy_line import EnergyRecord, append_record, read_records
from megatron_energy.runtime.energy_log.power_interval import interval_power
from megatron_energy.runtime.energy_log.power_log import PowerLog, open_power_log
from megatron_energy.runtime.energy_log.power_record import PowerRecord, power_scalars, read_power_records
from megatron_energy.runtime.energy_log.power_trace_file import PowerTraceWriter, read_power_trace


def square_wave(refresh_s: float = 0.1, seconds: float = 3.0) -> PowerSamples:
    """Readings every 50 ms of 1 s iterations: 0.3 s at 300 W (the step boundary's trough), 0.7 s at 600 W."""
    times = np.round(np.arange(0.0, seconds, 0.05), 9)
    instant = np.where(times % 1.0 < 0.3 - 1e-9, 300.0, 600.0)
    clock = np.where(times % 1.0 < 0.3 - 1e-9, 1980.0, 1755.0)
    average = np.full_like(times, 510.0)
    return PowerSamples(times, average, instant, clock, "measured", "instant field 186", 0.05, refresh_s)


ENDS = [(11, 1.0), (12, 2.0), (13, 3.0)]


def test_a_square_wave_swings_from_trough_to_peak_with_ramps_at_the_fields_refresh():
    power = interval_power(square_wave(), 0.0, ENDS)
    assert power is not None
    assert (power.resolution_s, power.band_resolution_s) == pytest.approx((0.05, 0.1))
    assert power.band_hz == pytest.approx((0.1, 5.0))  # the Nyquist frequency of a 100 ms refresh
    assert (power.instant_min_w, power.instant_max_w, power.average_w) == (300.0, 600.0, 510.0)
    assert power.instant_mean_w == pytest.approx(510.0)
    assert (power.sm_clock_median_mhz, power.sm_clock_min_mhz) == (1755.0, 1755.0)
    assert [swing.iteration for swing in power.iterations] == [11, 12, 13]
    for swing in power.iterations:
        assert swing.duration_s == pytest.approx(1.0)
        assert (swing.peak_w, swing.trough_w, swing.swing_w) == pytest.approx((600.0, 300.0, 300.0))
        assert swing.ramp_up_w_per_s == pytest.approx(3000.0)  # 300 W within one 100 ms refresh
        assert swing.band_share == pytest.approx(1.0)  # a 1 Hz square wave: all of it in 1-5 Hz
        assert swing.mean_w == pytest.approx(510.0)
    # the fall into the trough at a step boundary is the ramp of the iteration it begins (none before 11)
    assert [swing.ramp_down_w_per_s for swing in power.iterations] == pytest.approx(
        [0.0, 3000.0, 3000.0], abs=1e-6
    )
    assert power.source == "measured" and power.note == ""


def test_readings_of_the_averaged_power_resolve_no_swing_in_a_one_second_iteration_and_say_so():
    power = interval_power(square_wave(refresh_s=1.0), 0.0, ENDS)
    assert power is not None
    assert power.band_hz == pytest.approx((0.1, 0.5))
    assert power.iterations == ()
    assert "3 iteration(s) without swing figures" in power.note


def test_a_reading_before_the_interval_holds_into_it():
    samples = square_wave()
    power = interval_power(samples, 1.22, [(12, 2.0)])  # the reading of 1.20 s (300 W) holds from 1.22 s
    assert power is not None and power.instant_min_w == 300.0
    assert power.instant_mean_w == pytest.approx((0.08 * 300 + 0.7 * 600) / 0.78)


def test_an_interval_without_readings_has_no_figures():
    assert interval_power(square_wave(), 5.0, [(20, 6.0)]) is None


def record() -> PowerRecord:
    power = interval_power(square_wave(), 0.0, ENDS)
    assert power is not None
    return PowerRecord(13, 11, "planned (clocks not set)", 0, 0, power, "job123")


def test_the_record_reads_back_from_the_energy_log_beside_the_iteration_records(tmp_path):
    log = tmp_path / "energy.jsonl"
    append_record(log, EnergyRecord(13, "planned", "measured", {"energy/j_per_iter_total": 1.0}, "job123"))
    written = record()
    with log.open("a") as handle:
        handle.write(json.dumps(written.to_json()) + "\n")
    (read,) = read_power_records(log)
    assert read == PowerRecord(**{**vars(written), "time_utc": read.time_utc})
    assert [r.iteration for r in read_records(log)] == [13]  # the iteration records leave it out


def test_scalars_give_each_iterations_swing_and_the_intervals_levels_at_its_last_iteration():
    scalars = power_scalars(record())
    assert sorted(scalars) == [11, 12, 13]
    assert scalars[12] == pytest.approx(
        {
            "energy/swing_w": 300.0,
            "energy/ramp_up_w_per_s": 3000.0,
            "energy/ramp_down_w_per_s": 3000.0,
            "energy/band_share": 1.0,
        }
    )
    assert scalars[13]["energy/power_w"] == 510.0 and scalars[13]["energy/power_instant_min_w"] == 300.0
    assert scalars[13]["energy/sm_clock_median_mhz"] == 1755.0


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_trace_written_in_two_appends_reads_back_to_the_same_figures(tmp_path, fmt):
    samples = square_wave()
    path = JobFiles(tmp_path / "job").power_trace(3, fmt)
    writer = PowerTraceWriter(path, fmt, rank=3, gpu=1)
    first = samples.time_s <= 1.5
    arrays = {
        name: getattr(samples, name)[first] for name in ("time_s", "average_w", "instant_w", "sm_clock_mhz")
    }
    writer.append(dataclasses.replace(samples, **arrays), ENDS[:1])
    writer.append(samples, ENDS[1:])  # readings already written are not written again
    trace = read_power_trace(path)
    assert path.name == f"power_trace.rank3.{fmt}"
    assert trace.ends == tuple(ENDS)
    assert np.array_equal(trace.samples.time_s, samples.time_s)
    assert np.array_equal(trace.samples.instant_w, samples.instant_w)
    assert (trace.samples.source, trace.samples.refresh_s, trace.samples.period_s) == ("measured", 0.1, 0.05)
    assert interval_power(trace.samples, 0.0, list(trace.ends)) == interval_power(samples, 0.0, ENDS)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_trace_written_in_chunks_has_one_header_and_every_row(tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(power_trace_file, "CHUNK_ROWS", 7)
    samples = square_wave()
    path = tmp_path / f"trace.{fmt}"
    PowerTraceWriter(path, fmt, rank=0, gpu=0).append(samples, ENDS)
    trace = read_power_trace(path)
    assert np.array_equal(trace.samples.time_s, samples.time_s) and trace.ends == tuple(ENDS)
    assert path.read_text().count("power trace" if fmt == "jsonl" else "time_s") == 1


def test_a_file_that_is_not_a_trace_is_refused_with_its_name(tmp_path):
    path = tmp_path / "power_trace.rank0.jsonl"
    path.write_text('{"time_s": 1.0}\n')
    with pytest.raises(ValueError, match=r"power_trace\.rank0\.jsonl is not a power trace"):
        read_power_trace(path)


def test_the_power_log_of_a_simulated_gpu_logs_each_interval_modelled(tmp_path):
    handle = open_gpus(
        "simulated", "h200", dry_run=True, num_simulated_gpus=1, state_path=tmp_path / "g.json"
    )
    gpus, spec = handle.gpus, handle.spec
    sampler = PowerSampler.from_handle(handle, 0, 0.02)
    sampler.read_once()
    records: list[PowerRecord] = []
    scalars: list[tuple[str, float, int]] = []
    trace = PowerTraceWriter(tmp_path / "trace.jsonl", "jsonl", rank=0, gpu=0)
    log = PowerLog(
        sampler,
        rank=0,
        gpu=0,
        log_interval=2,
        sinks=(lambda *s: scalars.append(s),),
        trace=trace,
    )
    sampler.close()  # the test reads at virtual times of its own choosing
    log.write_record = records.append
    work = WorkProfile(compute_s=0.02, memory_s=0.0)
    for step in range(4):
        for _ in range(10):  # 0.2 s of work at the stock clock (longer at the power cap's), then 0.1 s idle
            gpus.execute(0, work)
            sampler.read_once()
        for _ in range(5):
            gpus.wait(0, 0.02, blocked=False)
            sampler.read_once()
        log.step_end(step, "profiling")
    log.close()
    assert [(r.first_iteration, r.iteration) for r in records] == [(1, 2), (3, 4)]
    power = records[1].power
    assert power.source == "modelled" and power.band_resolution_s == power.resolution_s  # the model is exact
    assert power.band_hz == pytest.approx((0.1, 0.5 / power.resolution_s))
    assert power.instant_min_w == pytest.approx(spec.idle_power_w)
    assert power.instant_max_w > 2 * spec.idle_power_w
    assert [s.iteration for s in power.iterations] == [3, 4]
    assert power.iterations[0].swing_w == pytest.approx(power.instant_max_w - spec.idle_power_w)
    assert power.iterations[0].duration_s == pytest.approx(gpus.virtual_time_s(0) / 4)
    capped_mhz = round(gpus.model.effective_clock_mhz(work, spec.default_sm_clock_mhz))  # the power cap's
    assert (power.sm_clock_median_mhz, power.sm_clock_min_mhz) == (capped_mhz, capped_mhz)
    written = {(name, iteration) for name, _, iteration in scalars}
    assert {
        ("energy/swing_w", 1),
        ("energy/swing_w", 4),
        ("energy/power_w", 2),
        ("energy/power_w", 4),
    } <= written
    ends = read_power_trace(tmp_path / "trace.jsonl").ends
    assert [iteration for iteration, _ in ends] == [1, 2, 3, 4]


def test_steps_the_log_did_not_see_leave_their_interval_without_a_record(tmp_path):
    handle = open_gpus(
        "simulated", "h200", dry_run=True, num_simulated_gpus=1, state_path=tmp_path / "g.json"
    )
    sampler = PowerSampler.from_handle(handle, 0, 0.02)
    sampler.read_once()
    log = PowerLog(sampler, rank=0, gpu=0, log_interval=2, sinks=())
    sampler.close()
    records: list[PowerRecord] = []
    log.write_record = records.append
    for step in (0, 1, 2, 5, 6, 7):  # steps 3 and 4 ran suspended (the overhead check)
        for _ in range(5):
            handle.gpus.execute(0, WorkProfile(compute_s=0.02, memory_s=0.0))
            sampler.read_once()
        log.step_end(step, "planned")
    assert [(r.first_iteration, r.iteration) for r in records] == [(1, 2), (7, 8)]
    assert records[1].power.iterations[0].duration_s == pytest.approx(
        records[0].power.iterations[1].duration_s
    )


def test_iterations_that_end_at_the_same_instant_get_no_figures_and_raise_nothing():
    samples = square_wave()
    assert interval_power(samples, 1.0, [(12, 1.0)]) is None
    power = interval_power(samples, 0.0, [(11, 1.0), (12, 1.0), (13, 2.0)])
    assert power is not None and [swing.iteration for swing in power.iterations] == [11, 13]


def test_the_flags_open_a_power_log_with_its_trace_in_the_job_folder_or_none(tmp_path, caplog):
    handle = open_gpus(
        "simulated", "h200", dry_run=True, num_simulated_gpus=2, state_path=tmp_path / "g.json"
    )
    context = JobContext(0, pipeline_orders(2, 4), 0, 1, global_rank=5, local_device_index=1, log_interval=3)
    job = JobFiles(tmp_path / "job")
    assert open_power_log(EnergyConfig(power_sample_ms=0), handle, context, job) is None
    log = open_power_log(EnergyConfig(power_trace="csv"), handle, context, job)
    assert log is not None and log.trace is not None
    log.close()
    assert (log.gpu, log.log_interval, log.sampler.period_s) == (1, 3, 0.05)
    assert log.trace.path == tmp_path / "job" / "power_trace.rank5.csv"
    amd = GpuHandle(HandlelessGpus(), "dry-run", "", "zeus", handle.spec)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="megatron_energy"):
        assert open_power_log(EnergyConfig(), amd, context, job) is None
    (line,) = caplog.messages
    assert line.startswith("[energy] rank 5: no power log (GPU 1 has no NVML handle (not an NVIDIA GPU")
