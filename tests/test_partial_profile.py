"""A job that ends while profiling keeps each rank's finished clocks in a partial profile (issue 44, item 3);
one that ends while planning in the background keeps its complete profile, and its next run plans from it.

One rank's session on a simulated H100 (``runtime.assembly.build_session``, the parts the launcher builds)
over a one-stage pipeline, its steps driven here as the hooks drive them; every figure is modelled.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from log_lines import capture_lines

from megatron_energy.config import EnergyConfig
from megatron_energy.config.energy_config import Planning
from megatron_energy.energy_dir import JobFiles
from megatron_energy.pipeline.profile_csv import read_profile_csv
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import TransformerShape
from megatron_energy.runtime.assembly import build_session
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import LocalComms
from megatron_energy.runtime.session import EnergySession
from megatron_energy.runtime.session_phase import SessionPhase

GRID = (1980, 1500, 1005)
MICROBATCHES = 2
STOCK_BLOCK_STEPS = 1 + 4 + 1
"""The stock clock's steps (one profile step a clock): settling, the 4-step baseline pilot, one profile."""
BLOCK_STEPS = 2
"""Every other clock's: settling, one profile step."""


def _session(energy_dir: Path, planning: Planning = "auto") -> EnergySession:
    context = JobContext(
        pipeline_rank=0,
        orders=pipeline_orders(1, MICROBATCHES),
        data_parallel_rank=0,
        data_parallel_size=1,
        shape=TransformerShape.from_name("gpt3-1.3b"),
    )
    config = EnergyConfig(
        optimise=True,
        backend="simulated",
        gpu_spec="h100-sxm",
        dir=energy_dir,
        profile_iters=1,
        freq_grid=GRID,
        planning=planning,
    )
    return build_session(config, context, LocalComms())


def _run(energy_dir: Path, steps: int, planning: Planning = "auto") -> EnergySession:
    """A job of ``steps`` iterations, closed at its end as the launcher closes it."""
    session = _session(energy_dir, planning)
    for step in range(steps):
        session.on_step_begin(step)
        for kind in ("forward", "backward"):
            for microbatch in range(MICROBATCHES):
                session.on_instruction_begin(kind, microbatch, 0)
                session.on_instruction_end(kind, microbatch, 0)
        session.on_step_end(step)
    session.close()
    return session


def _partial(session: EnergySession) -> Path:
    return JobFiles(session.cache.folder).partial_profile(0)


@pytest.mark.slow
def test_a_job_cut_short_keeps_its_finished_clocks_in_a_partial_profile_and_says_where(tmp_path):
    lines = capture_lines()
    session = _run(tmp_path, STOCK_BLOCK_STEPS + BLOCK_STEPS)  # the stock clock and 1500 MHz finish
    assert session.phase == "profiling"
    table = read_profile_csv(_partial(session))
    assert table.source == "simulated"
    by_clock = {(row.frequency, row.instruction): row for row in table.rows}
    assert set(by_clock) == {(clock, kind) for clock in GRID[:2] for kind in ("forward", "backward")}
    assert by_clock[(1500, "forward")].time > by_clock[(1980, "forward")].time  # a real slower clock
    assert not (session.cache.folder / "profile.csv").exists()  # the cache holds complete profiles only
    (line,) = [line for line in lines if "the job ended while profiling" in line]
    assert str(_partial(session)) in line
    assert "the stock clock and 1 more, 2 of 3 clocks (1980, 1500 MHz)" in line
    assert "does not reuse it and profiles from the start" in line

    lines.clear()
    again = _run(tmp_path, 3)  # a later run of the job: a miss, not a corrupt cache; nothing new kept
    assert "[energy] energy cache empty for this job: profiling" in lines
    assert not any("failed verification" in line for line in lines)
    assert read_profile_csv(_partial(again)) == table
    assert any("not even the stock clock's steps completed, so no partial profile" in line for line in lines)


@pytest.mark.slow
def test_a_job_that_finishes_profiling_removes_the_partial_profile_of_a_run_cut_short(tmp_path):
    cut = _run(tmp_path, STOCK_BLOCK_STEPS)
    assert {row.frequency for row in read_profile_csv(_partial(cut)).rows} == {GRID[0]}
    finished = _run(tmp_path, STOCK_BLOCK_STEPS + 2 * BLOCK_STEPS + 2)
    assert finished.phase != "profiling" and finished.cache.folder == cut.cache.folder
    assert (finished.cache.folder / "profile.csv").exists()
    assert not _partial(finished).exists()


@pytest.mark.slow
def test_a_job_that_ends_while_planning_keeps_its_profile_and_the_next_run_plans_from_it(tmp_path):
    lines = capture_lines()
    profiled = STOCK_BLOCK_STEPS + 2 * BLOCK_STEPS
    ended = _run(tmp_path, profiled + 1, planning="background")  # the planner process has just started
    assert ended.phase == SessionPhase.PLANNING
    folder = ended.cache.folder
    assert (folder / "profile.csv").exists() and not (folder / "plan.json").exists()
    (line,) = [line for line in lines if "the job ended while planning" in line]
    assert f"the profile is cached in {folder}: the next run of this job plans from it" in line

    lines.clear()
    again = _run(tmp_path, 2, planning="background")
    assert again.phase == "planned" and (folder / "plan.json").exists()  # planned from the first step
    assert not any(line.startswith("[energy] energy cache empty") for line in lines)
