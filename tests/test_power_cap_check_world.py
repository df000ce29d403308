"""The power-cap check in a live job: megatron-core's real pipeline schedule over gloo with simulated GPUs.

The simulated GPUs time the stage work of GPT-3 1.3B, so every figure is modelled. On an H100 SXM the model's
700 W limit holds that work below the stock clock (about 1610 MHz of 1980), so the simulated GPU reports the
power-cap reason at its instruction ends and rank 0 prints the check; on an A100 SXM 80GB nothing is capped
and nothing is printed. A driver without the clock-event reasons call (mocked at the NVML boundary on one
rank) makes the check unavailable there, said once, and training goes on.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from session_world import ASSUMED_H100, RankReport, SessionSettings, run_world

from megatron_energy.dvfs.model import GpuPowerModel
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.workload import TransformerShape, instruction_work
from megatron_energy.runtime.energy_log.energy_line import read_records
from megatron_energy.runtime.energy_log.power_cap_record import read_power_cap_records

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

CHECK = "[energy] power-cap check at the stock clock"
UNAVAILABLE = "[energy] power-cap check unavailable"
KIND = re.compile(
    r"(?P<kind>\w+) held at the power cap in (?P<capped>\d+) of (?P<reads>\d+) reads \((?P<classes>\d+) "
    r"instruction class(es)?\) ran at (?P<read>\d+) MHz \(median, simulated GPU: modelled\) where the "
    r"model predicts (?P<model>\d+) MHz \(median, modelled, (?P<spec>[\w.-]+)\): "
    r"model (?P<change>[+-]\d+\.\d) % vs simulated GPU"
)
"""One instruction kind's part of the check's line."""


def job(energy_dir: Path, **changes) -> SessionSettings:
    """A small job: PP=2, 4 microbatches, two profiled clocks with one measured step each."""
    base = SessionSettings(
        pipeline_size=2,
        num_microbatches=4,
        gpu_spec=ASSUMED_H100,  # caps this work at the stock clock (the calibrated H100's 0.39 does not)
        freq_grid=(1980, 1200),  # the second below the cap clock of the work (~1480 MHz)
        profile_iters=1,
        run_steps=2,
        energy_dir=energy_dir,
        log_file=energy_dir / "energy_log.jsonl",
    )
    return replace(base, **changes)


def lines(report: RankReport, text: str) -> list[str]:
    return [line for line in report.lines if line.startswith(text)]


@pytest.fixture(scope="module")
def capped(tmp_path_factory) -> tuple[SessionSettings, list[RankReport]]:
    settings = job(tmp_path_factory.mktemp("energy"))
    return settings, run_world(settings, tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def uncapped(tmp_path_factory) -> tuple[SessionSettings, list[RankReport]]:
    settings = job(tmp_path_factory.mktemp("energy"), gpu_spec="a100-sxm-80gb", freq_grid=(1410, 1110))
    return settings, run_world(settings, tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def refusing(tmp_path_factory) -> tuple[SessionSettings, list[RankReport]]:
    settings = job(tmp_path_factory.mktemp("energy"), nvml_refusing_ranks=(1,))
    return settings, run_world(settings, tmp_path_factory.mktemp("results"))


def modelled_clocks_mhz(settings: SessionSettings, kind: str) -> set[int]:
    """The model's clock, at the stock clock, of every stage's work of ``kind`` (what the GPUs ran)."""
    spec = load_gpu_spec(settings.gpu_spec)
    work = instruction_work(TransformerShape.from_name(settings.model), spec, settings.pipeline_size, 1, None)
    model = GpuPowerModel(spec)
    return {round(model.effective_clock_mhz(piece, 1980)) for key, piece in work.items() if key.kind == kind}


def test_rank_zero_compares_the_clock_read_at_the_power_cap_with_the_models(capped) -> None:
    settings, reports = capped
    (line,) = lines(reports[0], CHECK)
    assert line.startswith(f"{CHECK} (1980 MHz): ")
    kinds = {match["kind"]: match for match in KIND.finditer(line)}
    assert sorted(kinds) == ["backward", "forward"], line
    for kind, match in kinds.items():
        # every read of every stage held at the cap: 4 microbatches in the one stock profile step, 2 stages
        counts = (match["capped"], match["reads"], match["classes"], match["spec"])
        assert counts == ("8", "8", "2", "h100-sxm-assumed")
        read_mhz, model_mhz = int(match["read"]), int(match["model"])
        assert read_mhz < 1980
        assert abs(read_mhz - model_mhz) <= 1, line  # the simulated GPU runs the model: they agree
        clocks = modelled_clocks_mhz(settings, kind)
        assert min(clocks) - 1 <= read_mhz <= max(clocks) + 1
        assert abs(float(match["change"])) <= 0.1
    assert all(not lines(report, CHECK) for report in reports[1:])
    assert all(not lines(report, UNAVAILABLE) for report in reports)


def test_the_check_is_a_typed_record_of_the_energy_log(capped) -> None:
    settings, reports = capped
    assert settings.log_file is not None
    (record,) = read_power_cap_records(settings.log_file)
    assert (record.check.gpu_spec, record.check.stock_clock_mhz, record.check.clock_source) == (
        "h100-sxm-assumed",
        1980,
        "modelled",
    )
    line = lines(reports[0], CHECK)[0]
    for kind in record.check.kinds:
        assert f"{kind.kind} held at the power cap in {kind.capped_reads} of {kind.reads} reads" in line
        assert f"ran at {kind.measured_mhz:.0f} MHz" in line
        assert f"predicts {kind.modelled_mhz:.0f} MHz" in line
    profiling = [r for r in read_records(settings.log_file) if r.phase == "profiling"]
    assert record.iteration >= max(r.iteration for r in profiling)  # the iteration records are still read


def test_the_plan_runs_after_the_check(capped) -> None:
    _, reports = capped
    assert all(sum(step.phase == "planned" for step in report.steps) == 2 for report in reports)


def test_no_line_and_no_record_when_nothing_runs_at_the_power_cap(uncapped) -> None:
    settings, reports = uncapped
    assert all(not lines(report, CHECK) and not lines(report, UNAVAILABLE) for report in reports)
    assert settings.log_file is not None
    assert read_power_cap_records(settings.log_file) == []
    assert all(sum(step.phase == "planned" for step in report.steps) == 2 for report in reports)


def test_a_driver_without_the_reasons_call_is_said_once_and_training_goes_on(refusing) -> None:
    _, reports = refusing
    (unavailable,) = lines(reports[0], UNAVAILABLE)
    assert "rank 1: reading the clock-event reasons failed (NVMLError_FunctionNotFound" in unavailable
    assert "training goes on without it" in unavailable
    assert all(not lines(report, UNAVAILABLE) for report in reports[1:])
    (line,) = lines(reports[0], CHECK)  # stage 0 still read its clocks
    assert [match["classes"] for match in KIND.finditer(line)] == ["1", "1"]
    assert all(sum(step.phase == "planned" for step in report.steps) == 2 for report in reports)
