"""What a run leaves for its summary: --energy-log-file records and the stock baseline's per-step samples."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from reductions import over_ranks

from megatron_energy.pipeline.instruction import Work
from megatron_energy.runtime.energy_log.energy_line import EnergyRecord, append_record, read_records
from megatron_energy.runtime.planning_round.planning import baseline_from_profiling, tail_from_profiling
from megatron_energy.runtime.profiling.collector import ProfileRow, StepRecord
from megatron_energy.runtime.profiling.job_stock import job_stock, stock_vectors
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline


def test_energy_records_are_appended_and_read_back_in_order(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "energy.jsonl"
    first = EnergyRecord(1, "profiling", "modelled", {"energy/j_per_iter_total": 235.9})
    scalars = {"energy/j_per_iter_total": 207.5, "energy/iteration_s": 0.1}
    second = EnergyRecord(2, "planned", "modelled", scalars)
    append_record(path, first)
    append_record(path, second)
    read = read_records(path)
    assert [dataclasses.replace(record, time_utc="") for record in read] == [first, second]
    assert all(record.time_utc for record in read)  # stamped when written


def test_a_line_that_is_not_a_record_is_named(tmp_path: Path) -> None:
    path = tmp_path / "energy.jsonl"
    append_record(path, EnergyRecord(1, "planned", "measured", {}))
    with path.open("a") as handle:
        handle.write('{"iteration": 2}\n')
    with pytest.raises(ValueError, match=r"energy.jsonl:2 is not an energy log record"):
        read_records(path)


def test_the_stock_baseline_keeps_each_steps_job_figures() -> None:
    # baseline steps (timed as the run phase times its own), then a synchronous profile step: left out
    synchronous = StepRecord(1980, 0.2, 90.0, 0.01, 5.0, synchronised=True)
    rank0 = [
        StepRecord(1980, 0.120, 50.0, synchronised=False),
        StepRecord(1980, 0.124, 52.0, synchronised=False),
    ]
    rank1 = [
        StepRecord(1980, 0.125, 70.0, synchronised=False),
        StepRecord(1980, 0.121, 71.0, synchronised=False),
        StepRecord(1980, 0.121, 72.0, synchronised=False),  # a step rank 0 did not measure: left out
    ]
    rank2 = [synchronous]  # no baseline step at all: the other ranks' steps still count
    rank0, rank1 = [*rank0, synchronous], [*rank1, synchronous]
    # the reductions over every rank (runtime.profiling.job_stock), three baseline steps agreed
    stock = job_stock(*over_ranks([stock_vectors(steps, 3) for steps in (rank0, rank1, rank2)]))
    assert stock.step_iteration_s == (0.125, 0.124)  # the slowest rank, step by step
    assert stock.step_energy_j == (120.0, 123.0)  # every rank's energy, step by step
    assert stock.iteration_s == pytest.approx(0.1223333)  # the slowest rank's mean
    # the planning replica: one rank per stage, here ranks 0 and 1 of a two-stage pipeline
    rows = [[ProfileRow(Work(stage, 0, "forward"), 1980, 0.01, 1.0, 2)] for stage in (0, 1)]
    baseline = baseline_from_profiling([(rows[0], rank0), (rows[1], rank1)], [0, 1], stock)
    assert (
        baseline.step_iteration_s == stock.step_iteration_s and baseline.step_energy_j == stock.step_energy_j
    )
    assert baseline.iteration_s == stock.iteration_s
    assert baseline.energy_by_rank == pytest.approx({0: 51.0, 1: 71.0})
    assert baseline.stage_by_rank == {0: 0, 1: 1}
    assert StockBaseline.from_json(baseline.to_json()) == baseline


def test_a_baseline_cached_without_step_samples_still_loads() -> None:
    old = '{"stock_time_s": 0.1, "stock_energy_by_rank": {"0": 10.0}}'
    baseline = StockBaseline.from_json(old)
    assert baseline.energy_by_rank == {0: 10.0}
    assert baseline.step_energy_j == () and baseline.step_iteration_s == ()


def test_the_measured_tail_is_the_slowest_ranks_time_and_each_stages_mean_energy_per_gpu() -> None:
    def rows(stage: int) -> list[ProfileRow]:
        return [ProfileRow(Work(stage, 0, "forward"), 1980, 0.01, 1.0, 2)]

    # ranks 0 and 2 run stage 0 (two replicas), rank 1 runs stage 1
    rank0 = [StepRecord(1980, 1.2, 500.0, 0.10, 40.0), StepRecord(1980, 1.2, 500.0, 0.12, 44.0)]
    rank1 = [StepRecord(1980, 1.2, 600.0, 0.09, 30.0), StepRecord(1980, 1.2, 600.0, 0.09, 30.0)]
    rank2 = [StepRecord(1980, 1.2, 500.0, 0.13, 50.0), StepRecord(1980, 1.2, 500.0, 0.13, 50.0)]
    tail = tail_from_profiling([(rows(0), rank0), (rows(1), rank1), (rows(0), rank2)])
    assert tail is not None and tail.is_measured
    assert tail.outside_s == pytest.approx(0.13)
    assert tail.stage_energy_j == pytest.approx((46.0, 30.0))
    # no energy counter: no measured tail
    unknown = [StepRecord(1980, 1.2, float("nan"), 0.1, float("nan"))] * 2
    assert tail_from_profiling([(rows(0), unknown)]) is None
    # nothing ran between the schedules (exact simulated GPUs): no tail, not a zero-length one
    nothing = [StepRecord(1980, 1.2, 500.0, 0.0, 0.0)] * 2
    assert tail_from_profiling([(rows(0), nothing)]) is None


def test_records_are_strict_json_with_their_job_and_time_and_unbounded_figures_read_back_as_nan(
    tmp_path: Path,
) -> None:
    import json
    import math

    path = tmp_path / "energy.jsonl"
    scalars = {"energy/change_vs_stock": -0.1, "energy/change_vs_stock_high": math.inf}
    append_record(path, EnergyRecord(3, "planned", "measured", scalars, job="ab12"))
    (line,) = path.read_text().splitlines()
    data = json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert data["scalars"]["energy/change_vs_stock_high"] is None and data["job"] == "ab12"
    assert data["time_utc"].endswith("+00:00")
    (record,) = read_records(path)
    assert record.job == "ab12" and math.isnan(record.scalars["energy/change_vs_stock_high"])
    assert record.scalars["energy/change_vs_stock"] == -0.1
