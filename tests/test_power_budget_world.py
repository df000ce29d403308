"""Issue 33, item 5: a power budget out of reach, in a world of megatron-core ranks on simulated GPUs.

PP=2, 4 microbatches of GPT-3 1.3B stage work on simulated H100s (every figure modelled), a 4-clock grid:

- ``power:150`` is above the spec's idle power (115 W), so the flag parser lets it through, but below what
  the job draws with every instruction at the spec's lowest clock (about 180 W, modelled): refused before
  profiling, once, on rank 0; every rank trains at stock clocks.
- ``power:300`` is within the spec's model but below what the profiled grid reaches: refused after profiling,
  once, on rank 0, with the lowest reachable power; the verified profile is cached, and a retry with
  ``power:520`` re-plans from it without profiling.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from session_world import RankReport, SessionSettings, run_world

from megatron_energy.config import parse_target

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

GRID_MHZ = (1980, 1755, 1530, 1305)
FALLBACK_PHASE = "stock (planning failed)"


def settings(energy_dir: Path, target: str) -> SessionSettings:
    return SessionSettings(
        pipeline_size=2,
        num_microbatches=4,
        gpu_spec="h100-sxm",
        target=parse_target(target),
        freq_grid=GRID_MHZ,
        profile_iters=1,
        run_steps=4,
        energy_dir=energy_dir,
    )


def errors(report: RankReport) -> list[str]:
    return [line for line in report.lines if line.startswith("[energy] error: --energy-target")]


def phases(report: RankReport) -> list[str]:
    return [step.phase for step in report.steps]


@pytest.fixture(scope="module")
def below_the_model(tmp_path_factory) -> list[RankReport]:
    return run_world(settings(tmp_path_factory.mktemp("energy"), "power:150"), tmp_path_factory.mktemp("r"))


@pytest.fixture(scope="module")
def below_the_profile(tmp_path_factory) -> tuple[Path, list[RankReport], list[RankReport]]:
    """``power:300`` (out of the profile's reach), then ``power:520`` in a copy of its energy dir."""
    energy_dir = tmp_path_factory.mktemp("energy")
    first = run_world(settings(energy_dir, "power:300"), tmp_path_factory.mktemp("r"))
    retry_dir = tmp_path_factory.mktemp("retry") / "energy"
    shutil.copytree(energy_dir, retry_dir)
    return energy_dir, first, run_world(settings(retry_dir, "power:520"), tmp_path_factory.mktemp("r"))


def test_a_budget_below_the_models_floor_is_refused_before_profiling_once(below_the_model) -> None:
    for report in below_the_model:
        assert phases(report) == [FALLBACK_PHASE] * len(report.steps), "no profiling step"
        assert not [line for line in report.lines if "not optimising" in line]
    (line,) = errors(below_the_model[0])
    assert "no plan can meet it: the job draws at least " in line
    assert "W per GPU with every instruction at h100-sxm's lowest clock (modelled from the GPU spec" in line
    assert all(not errors(report) for report in below_the_model[1:]), "rank 0 alone says it"


def test_a_budget_below_the_profiles_reach_is_said_once_and_its_profile_kept_for_a_retry(
    below_the_profile,
) -> None:
    energy_dir, first, retry = below_the_profile
    for report in first:
        assert "profiling" in phases(report) and phases(report)[-1] == FALLBACK_PHASE
        assert not [line for line in report.lines if "not optimising" in line]
    (line,) = errors(first[0])
    assert "no plan fits; the lowest reachable average power is " in line
    assert "W per GPU (modelled (simulated profile)" in line and "the verified profile is kept in " in line
    assert all(not errors(report) for report in first[1:]), "rank 0 alone says it, not once per rank"
    folder = energy_dir / json.loads((energy_dir / "last_job.json").read_text())["fingerprint"]
    assert {"profile.csv", "baseline.json", "measured.json"} <= {path.name for path in folder.iterdir()}
    assert not (folder / "plan.json").exists()
    for report in retry:
        assert phases(report) == ["planned"] * len(report.steps), "re-planned from the cache, not profiled"
    (replanned,) = [line for line in retry[0].lines if "planning inputs changed" in line]
    assert (
        "planning.target: 'power:300' -> 'power:520'" in replanned and "without profiling again" in replanned
    )
