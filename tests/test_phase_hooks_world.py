"""``--energy-mode kernel`` on a gloo world: phases inside instructions and in the tail get their clocks.

One world (PP=2 on simulated H100s, 10 ms switch latency): megatron-core's DDP fires ``all-grads-sync``
(``finalize_model_grads``) and each step ends with an optimizer step inside Megatron's ``optimizer`` timer, as
``train_step`` runs it; the simulated GPUs run an emulated gradient sync (30 ms, communication) and optimizer
step (40 ms, memory-bound) at the clock in effect, then idle 15 ms (host work). The profiling steps measure
both phases through their hooks, the phase planner gives them clocks, and the run phase must request them at
those hooks: the clock each phase's work ran at (read from the simulated GPU) is the one the plan's requests
at that hook set, and the restore after the optimizer step lands in the idle gap, so the iteration is no
slower than at stock clocks.

The simulated GPUs time a Llama-70B stage (instructions of 0.5-1 s, long enough for phases of at least two
switch latencies) on a grid topped at 1530 MHz (below the power cap's clock of every phase, so the plan's
per-phase model and the simulated GPU's per-instruction one agree on the phases' times): the last stage's
backward passes get phase clocks, which the phase switcher requests inside each instruction at their
offsets from its start (``runtime.running.simulated_phases``), and the simulated GPU runs the instruction's
phases at them: less energy than at the instruction's clock alone, in the same time.
"""

from __future__ import annotations

import json

import pytest
from session_world import ASSUMED_H100, RankReport, SessionSettings, run_world

from megatron_energy.dvfs.emulation import Emulation
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.pipeline.phase_labels import PhaseLabel
from megatron_energy.pipeline.workload import TransformerShape, instruction_work
from megatron_energy.plan import ClockAction, Plan, RankPlan
from megatron_energy.plan_file import load_plan

pytestmark = pytest.mark.world  # spawns a gloo world of megatron-core ranks

MODEL = "llama-70b"
GRID_MHZ = (1530, 1305, 1080, 900)
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
        model=MODEL,
        gpu_spec=ASSUMED_H100,  # the calibrated H100 finds no inside phase worth a switch on this job
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
    plan = load_plan(settings.energy_dir / fingerprint / "plan.json", expected_fingerprint=fingerprint)
    return reports, plan


def _labels(rank: RankPlan) -> list[tuple[PhaseLabel, int]]:
    """(label, clock) of the rank's phase requests, in plan order."""
    return [
        (a.at.phase, a.clock_mhz)
        for a in rank.actions
        if isinstance(a, ClockAction) and isinstance(a.at.phase, PhaseLabel)
    ]


def _tail_actions(rank: RankPlan) -> list[tuple[str, int]]:
    """(hook, clock) of the rank's tail requests, in plan order (``optimizer.end``: at the step's end)."""
    return [(str(label.hook), clock) for label, clock in _labels(rank) if not label.inside and label.hook]


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
        assert all(label.provenance == "measured" for label, _ in _labels(rank) if not label.inside)
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
        # 1e-6: the inside phases' planned offsets come from the planner's fitted work (modelled), within a
        # microsecond of where the simulated GPU's own work puts them
        assert all(step.iteration_s <= report.stock_time_s * (1 + 1e-6) for step in planned)
        assert all(step.energy_j < report.stock_energy_j for step in planned)


def _inside_actions(rank: RankPlan) -> dict[Instruction, int]:
    """How many clock requests the plan makes inside each instruction."""
    counts: dict[Instruction, int] = {}
    for action in rank.actions:
        phase = action.at.phase if isinstance(action, ClockAction) else None
        if isinstance(phase, PhaseLabel) and phase.inside:
            counts[action.at.instruction] = counts.get(action.at.instruction, 0) + 1
    return counts


def test_the_phase_switcher_requests_every_inside_clock(kernel_run) -> None:
    reports, plan = kernel_run
    assert any(_inside_actions(rank) for rank in plan.target_point.ranks), "the plan has inside phases"
    for report in reports:
        inside = sum(_inside_actions(plan.target_point.ranks[report.stage]).values())
        planned_steps = sum(step.phase == "planned" for step in report.steps)
        lines = [line for line in report.lines if "phase clocks inside instructions:" in line]
        if not inside:
            assert not lines
            continue
        expected = inside * planned_steps
        assert lines == [
            f"[energy] rank {report.rank}: phase clocks inside instructions: {expected} of {expected} "
            "requested at their offsets, 0 stale (instruction ended first), 0 dropped (queue full, revert "
            "or exit)"
        ]
        hooks = next(line for line in report.lines if "phase clocks on pipeline rank" in line)
        assert f"{inside} inside instructions applied time-anchored" in hooks


def test_inside_clocks_lower_the_simulated_energy_of_an_instruction_in_its_time(kernel_run) -> None:
    """Each instruction with phase clocks, as the simulated GPU ran it, against its clock alone (modelled)."""
    reports, plan = kernel_run
    spec = load_gpu_spec(ASSUMED_H100)
    model = GpuPowerModel(spec)
    work = instruction_work(TransformerShape.from_name(MODEL), spec, 2, 1)
    checked = 0
    for report in reports:
        rank = plan.target_point.ranks[report.stage]
        inside = _inside_actions(rank)
        base = {a.at.instruction: a.clock_mhz for a in rank.actions if isinstance(a, ClockAction)}
        first = min(step.step for step in report.steps if step.phase == "planned")
        planned = [i for i in report.instructions if i[1] == "planned" and i[0] > first]  # after the switch
        for _, _, kind, microbatch, duration_s, energy_j in planned:
            instruction = Instruction(report.stage, 0, microbatch, kind)
            if instruction not in inside:
                continue
            alone = work[instruction.work]
            assert energy_j is not None
            assert duration_s <= model.time_s(alone, base[instruction]) * (1 + 1e-6)
            assert energy_j < model.energy_j(alone, base[instruction]) - 0.5  # a joule-scale saving
            checked += 1
    assert checked
