"""``--energy-mode kernel`` on a gloo world: the iteration tail's phases get their planned clocks at run time.

One world (PP=2 on simulated H100s, 10 ms switch latency): megatron-core's DDP fires ``all-grads-sync``
(``finalize_model_grads``) and each step ends with an optimizer step inside Megatron's ``optimizer`` timer, as
``train_step`` runs it; the simulated GPUs run an emulated gradient sync (30 ms, communication) and optimizer
step (40 ms, memory-bound) at the clock in effect, then idle 15 ms (host work). The profiling steps measure
both phases through their hooks, the phase planner gives them clocks, and the run phase must request them at
those hooks: the clock each phase's work ran at (read from the simulated GPU) is the one the plan's requests
at that hook set, while the instructions run at the stock clock, and the restore after the optimizer step
lands in the idle gap, so the iteration is no slower than at stock clocks.
"""

from __future__ import annotations

import json

import pytest
from session_world import RankReport, SessionSettings, run_world

from megatron_energy.dvfs.emulation import Emulation
from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.phases.labels import parse_phase_label
from megatron_energy.plan import ClockAction, Plan, RankPlan

pytestmark = pytest.mark.world  # spawns a gloo world of megatron-core ranks

GRID_MHZ = (1980, 1755, 1530, 1305)
EMULATION = Emulation(
    grad_sync=WorkProfile(compute_s=0.0, memory_s=0.0, fixed_s=0.030),
    between_steps=WorkProfile(compute_s=0.0, memory_s=0.040),
    idle_between_steps_s=0.015,  # host work after the optimizer step: the restore lands in it
)


@pytest.fixture(scope="module")
def kernel_run(tmp_path_factory) -> tuple[list[RankReport], Plan]:
    root = tmp_path_factory.mktemp("phase_hooks")
    settings = SessionSettings(
        pipeline_size=2,
        num_microbatches=4,
        gpu_spec="h100-sxm",
        freq_grid=GRID_MHZ,
        profile_iters=1,
        run_steps=4,
        log_interval=4,
        energy_dir=root / "energy",
        mode="kernel",
        emulation=EMULATION,
        ddp=True,
        optimizer_step=True,
    )
    reports = run_world(settings, root / "results")
    fingerprint = json.loads((settings.energy_dir / "last_job.json").read_text())["fingerprint"]
    plan = Plan.load(settings.energy_dir / fingerprint / "plan.json", expected_fingerprint=fingerprint)
    return reports, plan


def _tail_actions(rank: RankPlan) -> list[tuple[str, int]]:
    """(hook, clock) of the rank's tail requests, in plan order."""
    actions = [a for a in rank.actions if isinstance(a, ClockAction) and a.at.phase]
    labels = [(parse_phase_label(a.at.phase or ""), a.clock_mhz) for a in actions]
    return [(label.hook, clock) for label, clock in labels if label.scope.startswith("tail") and label.hook]


def _expected(rank: RankPlan) -> dict[str, int]:
    """The clock in force over each tail phase: the last request at or before its start hook."""
    instruction_clocks = [a.clock_mhz for a in rank.actions if isinstance(a, ClockAction) and not a.at.phase]
    clock = instruction_clocks[-1]  # the last instruction's, unless a tail request changes it
    requested = dict(_tail_actions(rank))
    expected = {}
    for hook in ("grad-sync", "optimizer"):
        clock = requested.get(hook, clock)
        expected[hook] = clock
    return expected


def test_the_plan_gives_the_measured_tail_phases_their_own_clocks(kernel_run) -> None:
    _, plan = kernel_run
    assert plan.optimisers == ("kernel",)
    for rank in plan.target_point.ranks:
        tail = _tail_actions(rank)
        assert tail, "every rank's tail has phase requests"
        hooks = {hook for hook, _ in tail}
        assert hooks <= {"grad-sync", "optimizer", "optimizer.end"}
        labels = [a.at.phase or "" for a in rank.actions if isinstance(a, ClockAction) and a.at.phase]
        assert all(":measured:" in label for label in labels if label.startswith("tail"))
        # the optimizer step (memory-bound) runs below the stock clock, and the tail restores after it
        assert _expected(rank)["optimizer"] < max(GRID_MHZ)
        assert ("optimizer.end", max(GRID_MHZ)) in tail


def test_each_outside_phase_runs_at_its_planned_clock(kernel_run) -> None:
    reports, plan = kernel_run
    for report in reports:
        expected = _expected(plan.target_point.ranks[report.stage])
        planned = [(s, name, clock) for s, phase, name, clock in report.outside_clocks if phase == "planned"]
        assert {name for _, name, _ in planned} == {"grad-sync", "optimizer"}
        for step, name, clock in planned:
            assert clock == expected[name], (report.rank, step, name)


def test_profiling_steps_run_the_tail_at_the_profiled_clock(kernel_run) -> None:
    reports, _ = kernel_run
    for report in reports:
        profiled = [clock for _, phase, _, clock in report.outside_clocks if phase == "profiling"]
        assert profiled and set(profiled) <= set(GRID_MHZ)


def test_the_log_says_which_phase_clocks_are_hooked(kernel_run) -> None:
    reports, _ = kernel_run
    for report in reports:
        lines = [line for line in report.lines if "phase clocks on pipeline rank" in line]
        assert lines and "requested at outside-phase hooks (grad-sync, optimizer" in lines[0]


def test_the_tail_clocks_save_energy_at_stock_iteration_time(kernel_run) -> None:
    reports, _ = kernel_run
    for report in reports:
        planned = [step for step in report.steps if step.phase == "planned"][1:]  # after the first switch
        assert report.stock_time_s is not None and report.stock_energy_j is not None
        assert all(step.iteration_s <= report.stock_time_s * (1 + 1e-9) for step in planned)
        assert all(step.energy_j < report.stock_energy_j for step in planned)
