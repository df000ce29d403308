"""``--energy-mode all`` (Perseus, Kareus, then phases) under a power budget, end to end on a gloo world."""

from __future__ import annotations

import json

import pytest
from session_world import SessionSettings, run_world

from megatron_energy.pipeline.phase_labels import PhaseLabel
from megatron_energy.plan import ClockAction
from megatron_energy.plan_file import load_plan
from megatron_energy.target import parse_target

pytestmark = pytest.mark.world  # spawns a gloo world of megatron-core ranks


def test_all_modes_plan_with_phases_and_log_power_against_the_budget(tmp_path) -> None:
    demo = SessionSettings(
        pipeline_size=2,
        num_microbatches=4,
        gpu_spec="h100-sxm",
        freq_grid=(1980, 1755, 1530, 1305),
        profile_iters=1,
        run_steps=4,
        log_interval=4,
        energy_dir=tmp_path / "energy",
        mode="all",
        target=parse_target("power:2000"),
    )
    reports = run_world(demo, tmp_path / "results")
    fingerprint = json.loads((demo.energy_dir / "last_job.json").read_text())["fingerprint"]
    plan = load_plan(demo.energy_dir / fingerprint / "plan.json", expected_fingerprint=fingerprint)
    # the session describes the job's collectives, so Kareus plans its part too; where its model prices the
    # point slower than the target allows, `all` leaves it out and says so
    assert plan.optimisers in (("perseus", "kareus", "kernel"), ("perseus", "kernel"))
    assert plan.target == "power:2000"
    assert ("kareus" in plan.optimisers) == (not plan.notes)
    phase_actions = [
        a
        for rank in plan.target_point.ranks
        for a in rank.actions
        if isinstance(a, ClockAction) and a.at.phase
    ]
    assert all(
        isinstance(a.at.phase, PhaseLabel) and a.at.phase.provenance == "modelled" for a in phase_actions
    )
    for report in reports:
        assert report.steps[-1].phase == "planned"  # within budget: the safety net never tripped
    lines = [line for line in reports[0].lines if line.startswith("[energy] iteration") and "planned" in line]
    assert lines and "power modelled:" in lines[-1] and "vs budget 2000 W: within" in lines[-1]
