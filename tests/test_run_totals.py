"""The run's totals at its end: energy over every phase, Wh per token, the saving against stock clocks with
its interval, CO₂ at a grid intensity, Megatron's --log-energy beside them; their record in the energy log."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from log_lines import capture_lines
from reductions import over_ranks

from megatron_energy.config import EnergyConfig
from megatron_energy.config.energy_config import EnergyConfigError
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import TransformerShape
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import LocalComms
from megatron_energy.runtime.energy_log.energy_line import (
    JobInterval,
    StageEnergy,
    StockSamples,
    read_records,
)
from megatron_energy.runtime.energy_log.energy_logger import EnergyLogger
from megatron_energy.runtime.energy_log.log_aggregate import interval_vectors, job_interval
from megatron_energy.runtime.energy_log.run_totals import J_PER_KWH, RunTally, read_run_totals
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.runtime.step_figures import StepFigures
from megatron_energy.runtime.timing import StepTiming

SHAPE = TransformerShape(
    num_layers=2,
    hidden_size=64,
    ffn_hidden_size=256,
    num_attention_heads=4,
    seq_length=128,
    micro_batch_size=2,
    vocab_size=1000,
)
STOCK_J = 100.0
"""The stock baseline's energy per iteration (one GPU)."""


def _figures(energy_j: float, iteration_s: float = 0.1) -> StepFigures:
    timing = StepTiming((), iteration_s, "modelled", cycle_s=iteration_s)
    return StepFigures(timing, iteration_s, energy_j, None, exact=True)


def _logger(
    tmp_path: Path, lines: list[str], *, log_energy: bool = False, grid: float | None = None
) -> EnergyLogger:
    context = JobContext(
        pipeline_rank=0,
        orders=pipeline_orders(1, 4),
        data_parallel_rank=0,
        data_parallel_size=1,
        shape=SHAPE,
        log_interval=4,
        megatron_log_energy=log_energy,
    )
    capture_lines(lines)
    logger = EnergyLogger(context, LocalComms(), "modelled", 0.0)
    logger.log_file = tmp_path / "energy.jsonl"
    logger.job = "job-a"
    logger.grid_gco2_per_kwh = grid
    return logger


def _stock() -> StockBaseline:
    return StockBaseline(
        iteration_s=0.1, step_iteration_s=(0.1,) * 8, step_energy_j=(STOCK_J,) * 8, source="modelled"
    )


def _run(logger: EnergyLogger) -> None:
    """Steps 0-2 profile at 100 J, steps 3-7 run the plan at 80 J: a phase changes inside the first line."""
    for step in range(8):
        planned = step >= 3
        baseline = _stock() if planned else StockBaseline()
        logger.add(
            step, "planned" if planned else "profiling", _figures(80.0 if planned else 100.0), None, baseline
        )
    logger.close()


def test_the_totals_count_every_step_of_every_phase_and_state_the_saving_tokens_and_co2(
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    logger = _logger(tmp_path, lines, grid=400.0)
    _run(logger)
    totals = logger.tally.totals("modelled", 2 * 128 * 4, 400.0)
    assert totals is not None
    energy_j = 3 * 100.0 + 5 * 80.0  # the line at iteration 4 averages its planned step only; totals all four
    assert totals.iterations == 8 and (totals.first_iteration, totals.last_iteration) == (1, 8)
    assert totals.energy_kwh == pytest.approx(energy_j / J_PER_KWH)
    assert totals.tokens == 8 * 2 * 128 * 4  # iterations x micro batch x microbatches x replicas x sequence
    assert totals.wh_per_token == pytest.approx(1e3 * energy_j / J_PER_KWH / totals.tokens)
    assert totals.saving is not None
    assert totals.saving.kwh == pytest.approx((8 * STOCK_J - energy_j) / J_PER_KWH)
    assert totals.saving.fraction == pytest.approx(1 - energy_j / (8 * STOCK_J))
    assert totals.saving.resolved and totals.saving.source == "modelled"
    assert totals.co2_kg == pytest.approx(energy_j / J_PER_KWH * 0.4)
    assert totals.co2_saved_kg == pytest.approx(totals.saving.kwh * 0.4)
    (line,) = [line for line in lines if line.startswith("[energy] run totals")]
    assert "iterations 1-8 over 1 GPU(s) (modelled)" in line
    assert (
        "saving vs stock clocks, profiling included:" in line
        and "12.5 % less energy; modelled, no noise in modelled figures" in line
    )
    assert "CO2" in line and "400 g/kWh" in line
    assert "Megatron" not in line
    (record,) = read_run_totals(tmp_path / "energy.jsonl")
    assert record.job == "job-a" and record.time_utc
    assert record.energy_kwh == pytest.approx(totals.energy_kwh) and record.saving == totals.saving
    assert len(read_records(tmp_path / "energy.jsonl")) == 2  # the iteration records alone


def test_without_a_grid_intensity_or_stock_baseline_no_co2_and_no_saving_are_claimed(tmp_path: Path) -> None:
    lines: list[str] = []
    logger = _logger(tmp_path, lines)
    for step in range(4):
        logger.add(step, "profiling", _figures(100.0), None, StockBaseline())
    logger.close()
    (line,) = [line for line in lines if line.startswith("[energy] run totals")]
    assert "no stock baseline was measured" in line and "CO2" not in line
    (record,) = read_run_totals(tmp_path / "energy.jsonl")
    assert record.saving is None and record.co2_kg is None


def test_megatrons_log_energy_total_is_named_beside_ours_in_its_unit(tmp_path: Path) -> None:
    lines: list[str] = []
    _run(_logger(tmp_path, lines, log_energy=True))
    (line,) = [line for line in lines if line.startswith("[energy] run totals")]
    assert f"{700.0 / 1e6:.3f} MJ beside Megatron's --log-energy 'Total training energy (GPU)'" in line
    assert "same NVML counter" in line


def test_iterations_after_the_last_line_are_named_as_left_out(tmp_path: Path) -> None:
    lines: list[str] = []
    logger = _logger(tmp_path, lines)
    for step in range(5):
        logger.add(step, "profiling", _figures(100.0), None, StockBaseline())
    logger.add_unlogged(5, "profiling", _figures(100.0))  # a lagged timer's last step, flushed at close
    logger.close()
    assert "[energy] run totals, iterations 1-4 " in lines[-2]
    assert lines[-1] == (
        "[energy] run totals leave out iterations 5-6: they ended after the last energy log line"
    )


def test_a_run_no_line_covered_prints_no_totals(tmp_path: Path) -> None:
    lines: list[str] = []
    logger = _logger(tmp_path, lines)
    logger.add(0, "profiling", _figures(100.0), None, StockBaseline())
    logger.close()
    assert not [line for line in lines if "run totals" in line]


def test_the_run_energy_sums_every_gpu_and_the_steps_are_counted_once() -> None:
    ranks = [
        StageEnergy(stage, 10.0, None, 0.1, run_energy_j=energy, run_steps=4)
        for stage, energy in ((0, 40.0), (1, 60.0), (0, 44.0), (1, 66.0))
    ]
    job = job_interval(*over_ranks([interval_vectors(rank, 2, 3) for rank in ranks]), 2)
    assert job.run_j == pytest.approx(210.0) and job.run_steps == 4 and job.gpus == 4


def test_noisy_measured_lines_give_the_saving_an_interval_that_widens_with_the_noise() -> None:
    rng = random.Random(3)
    tally = RunTally()
    stock = StockSamples(tuple(rng.gauss(STOCK_J, 3.0) for _ in range(20)), (0.5,) * 20, 0.1)
    for line in range(10):
        energy = sum(rng.gauss(90.0, 3.0) for _ in range(10))
        job = JobInterval((), None, 0.5, (), (), 1, run_j=energy, run_steps=10)
        tally.add(job, 10 * line + 1, 10 * line + 10, stock)
    totals = tally.totals("measured", None, None)
    assert totals is not None and totals.saving is not None and totals.tokens is None
    saving = totals.saving
    assert saving.low_kwh < saving.kwh < saving.high_kwh and math.isfinite(saving.high_kwh)
    assert saving.resolved and saving.fraction == pytest.approx(0.1, abs=0.03)


@pytest.mark.parametrize("value", [0.0, -5.0, math.inf, math.nan])
def test_a_grid_intensity_must_be_positive_and_finite(value: float) -> None:
    with pytest.raises(EnergyConfigError, match=r"--energy-grid-gco2-per-kwh\) must be a positive finite"):
        EnergyConfig(grid_gco2_per_kwh=value)
    assert EnergyConfig(grid_gco2_per_kwh=400.0).grid_gco2_per_kwh == 400.0
