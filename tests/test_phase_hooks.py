"""Phase clocks at run-time hooks: outside-phase events, requests moved to hooks, the tail, the runner."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kernel_plans import gpt3_kernel_plan

from megatron_energy.dvfs.model import GpuPowerModel
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.events import ListenerFanout
from megatron_energy.megatron.expected_order import ExpectedOrder
from megatron_energy.megatron.hooked_timers import HookedTimers
from megatron_energy.megatron.schedule_hooks import ScheduleHooks
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.kernel.sequence_plan import plan_sequence
from megatron_energy.optimisers.kernel.switch_times import SwitchRequest, snap_to_phase_starts
from megatron_energy.optimisers.registry import resolve
from megatron_energy.pipeline.collective_names import END
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.pipeline.modelled_phases import tail_phases
from megatron_energy.pipeline.phase_labels import OutsideHook, PhaseLabel
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import Baseline, Boundary, ClockAction, Plan, PlanPoint, RankPlan
from megatron_energy.plan_file import plan_text, read_plan
from megatron_energy.runtime.planning_round.planning import tail_phases_from_profiling
from megatron_energy.runtime.profiling.collector import ProfileRow, StepRecord
from megatron_energy.runtime.running.plan_runner import InsideRequest, PlanRunner
from megatron_energy.target import EnergyTarget

SPEC = load_gpu_spec("h100-sxm")
MODEL = GpuPowerModel(SPEC)
GRID = [1980, 1530, 1080, 900, 630]
LATENCY_S = SPEC.switch_latency_s  # 10 ms


# ------------------------------------------------------------------------------ events from Megatron's timers


class _Timer:
    def start(self, barrier: bool = False) -> None:
        pass

    def stop(self, barrier: bool = False) -> None:
        pass


class _Timers:
    """Stands in for Megatron's ``Timers`` (callable as ``timers(name, log_level)``)."""

    def __call__(self, name: str, log_level: int | None = None) -> _Timer:
        return _Timer()


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    def on_step_begin(self, step: int) -> None:
        self.events.append(("step_begin",))

    def on_step_end(self, step: int) -> None:
        self.events.append(("step_end",))

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        self.events.append(("begin", kind))

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        self.events.append(("end", kind))

    def on_p2p_begin(self, op: str) -> None:
        pass

    def on_p2p_end(self, op: str) -> None:
        pass


class _OutsideRecorder(_Recorder):
    def on_outside_begin(self, name: str) -> None:
        self.events.append(("outside_begin", name))

    def on_outside_end(self, name: str) -> None:
        self.events.append(("outside_end", name))


def _iteration(timers: HookedTimers, training: bool) -> None:
    """What Megatron runs: the schedule (``finalize_model_grads`` inside it), then the optimizer step."""
    context: Any = torch.enable_grad() if training else torch.no_grad()
    with context:
        timers("forward-backward", log_level=1).start()
        for name in ("forward-compute", "backward-compute"):
            timers(name, log_level=2).start()
            timers(name).stop()
        timers("all-grads-sync", log_level=1).start()
        timers("all-grads-sync").stop()
        timers("forward-backward").stop()
    if training:
        timers("optimizer", log_level=1).start()
        timers("params-all-gather", log_level=1).start()
        timers("params-all-gather").stop()
        timers("optimizer").stop()


def test_megatrons_timers_report_the_outside_phases_of_training_iterations_only() -> None:
    outside, plain = _OutsideRecorder(), _Recorder()
    order = pipeline_orders(1, 1).stage(0)
    timers = HookedTimers(
        _Timers(), ScheduleHooks(ListenerFanout([outside, plain])), ExpectedOrder(lambda: order)
    )
    _iteration(timers, training=False)  # evaluation: nothing at all
    assert outside.events == [] and plain.events == []
    _iteration(timers, training=True)
    assert outside.events == [
        ("step_begin",),
        ("begin", "forward"),
        ("end", "forward"),
        ("begin", "backward"),
        ("end", "backward"),
        ("outside_begin", "grad-sync"),
        ("outside_end", "grad-sync"),
        ("step_end",),
        ("outside_begin", "optimizer"),
        ("outside_begin", "param-gather"),
        ("outside_end", "param-gather"),
        ("outside_end", "optimizer"),
    ]
    assert plain.events == [e for e in outside.events if not e[0].startswith("outside")]  # skipped, no error


# -------------------------------------------------------------------------------- requests moved to hooks


def test_requests_move_to_hooks_without_costing_time() -> None:
    starts = [0.0, 0.030, 0.070, 0.100]  # three phases, the end last
    requests = [
        SwitchRequest(0, 900, 0.0, 0.0),  # down at its start: stays
        SwitchRequest(1, 1530, 0.020, 0.030),  # up, 10 ms early: moves earlier, to phase 0's start
        SwitchRequest(2, 630, 0.070, 0.070),  # down at its start: stays
        SwitchRequest(3, 1980, 0.090, 0.100),  # the restore: goes out at the end
    ]
    snapped = snap_to_phase_starts(requests, starts)
    # the up-switch at phase 0's start overtakes phase 0's own request: phase 0 runs at 1530 (faster)
    assert [(r.phase, r.clock_mhz, r.hook, r.request_s) for r in snapped] == [
        (1, 1530, 0, 0.0),
        (2, 630, 2, 0.070),
        (3, 1980, 3, 0.100),
    ]
    assert snapped[0].lead_s == pytest.approx(0.030)
    with pytest.raises(ValueError, match="no hooks"):
        snap_to_phase_starts(requests, [0.0])


def _tail(gap_after_s: float):
    phases, hooks = tail_phases((("grad-sync", 0.030), ("optimizer", 0.040)))
    budget_s = sum(MODEL.time_s(phase.work, max(GRID)) for phase in phases)
    plan = plan_sequence(
        MODEL,
        phases,
        budget_s,
        GRID,
        1980,
        LATENCY_S,
        outgoing_mhz=1980,
        hooked=True,
        gap_after_s=gap_after_s,
    )
    return plan, hooks, budget_s


def test_a_restore_that_would_land_in_the_next_iteration_is_not_planned() -> None:
    plan, hooks, budget_s = _tail(gap_after_s=0.0)
    assert hooks == ["grad-sync", "optimizer"]
    # no idle gap and no slack: a restore at the tail's end would slow the next instruction, so the
    # optimizer step (the last phase) runs at the next iteration's clock
    assert plan.clocks_mhz[-1] == 1980
    assert all(request.phase < len(plan.phases) for request in plan.requests)
    assert plan.planned_s <= budget_s + 1e-12


def test_a_restore_lands_in_the_idle_gap_after_the_tail() -> None:
    plan, _, budget_s = _tail(gap_after_s=LATENCY_S)
    assert plan.clocks_mhz[-1] == SPEC.memory_saturation_mhz  # memory-bound: no slower down to f_sat
    restore = plan.requests[-1]
    assert (
        restore.phase == len(plan.phases) and restore.clock_mhz == 1980 and restore.hook == len(plan.phases)
    )
    assert plan.planned_s == pytest.approx(budget_s)
    unplanned_j = sum(MODEL.energy_j(phase.work, 1980) for phase in plan.phases)
    assert plan.energy_j < unplanned_j


def test_phase_labels_name_their_hook() -> None:
    label = PhaseLabel("tail-restore", 2, "restore", "measured", 0.07, 0.0, OutsideHook("optimizer", True))
    assert str(label).startswith("tail-restore2@optimizer.end (restore, measured)")
    assert not label.inside
    assert PhaseLabel("p", 3, "memory", "modelled", 1e-3, 0.0).hook is None
    with pytest.raises(ValueError, match="not outside phases"):
        tail_phases((("backward", 0.01),))


# ------------------------------------------------------------------------- measured tail -> plan -> runner


def test_measured_outside_phases_are_the_stock_steps_means_longest_over_ranks() -> None:
    row = ProfileRow(
        work=pipeline_orders(1, 1).stage(0)[0].work, clock_mhz=1980, time_s=1.0, energy_j=1.0, samples=1
    )

    def record(sync: float, optimizer: float, gather: float, synchronised: bool = True) -> StepRecord:
        phases = (("grad-sync", sync), ("param-gather", gather), ("optimizer", optimizer))
        return StepRecord(1980, 1.0, 1.0, 0.2, 1.0, synchronised, phases)

    gathered = [
        (
            [row],
            [record(0.02, 0.05, 0.01), record(0.04, 0.07, 0.01), record(9.0, 9.0, 9.0, synchronised=False)],
        ),
        ([row], [record(0.01, 0.08, 0.02)]),
    ]
    measured = tail_phases_from_profiling(gathered)
    assert [name for name, _ in measured] == ["grad-sync", "optimizer", "param-gather"]
    values = dict(measured)
    assert values["grad-sync"] == pytest.approx(0.03)
    assert values["param-gather"] == pytest.approx(0.02)
    assert values["optimizer"] == pytest.approx(0.08 - 0.02)  # the all-gather is nested in the optimizer
    assert tail_phases_from_profiling([([row], [StepRecord(1980, 1.0, 1.0)])]) == ()


@pytest.fixture(scope="module")
def kernel_plan():
    return gpt3_kernel_plan(LATENCY_S)


@pytest.mark.slow
def test_the_runner_requests_tail_clocks_at_their_hooks_and_reports_what_it_cannot_hook(kernel_plan) -> None:
    plan, job = kernel_plan
    for stage in range(2):
        runner = PlanRunner(plan, stage, job.orders.stage(stage))
        phase_actions = [a for a in plan.target_point.ranks[stage].actions if a.at.phase]
        tail = [
            a.at.phase
            for a in phase_actions
            if isinstance(a.at.phase, PhaseLabel) and a.at.phase.scope.startswith("tail")
        ]
        assert tail and all(label.provenance == "measured" for label in tail)
        assert runner.outside_clocks("optimizer", end=True) == (1980,)  # the restore after the tail
        assert runner.outside_clocks("grad-sync") + runner.outside_clocks(
            "optimizer"
        )  # the tail's own clocks
        assert runner.outside_clocks("param-gather") == ()
        inside = len(phase_actions) - len(tail)
        report = runner.hook_report() or ""
        assert "requested at outside-phase hooks (grad-sync" in report
        assert (f"{inside} inside instructions applied time-anchored" in report) == (inside > 0)


def test_the_runner_takes_typed_labels_at_their_exact_times_through_the_file() -> None:
    forward, backward = Instruction(0, 0, 0, "forward"), Instruction(0, 0, 0, "backward")
    inside = PhaseLabel("p", 1, "memory", "modelled", 1.2345678e-3, 1e-3)
    restore = PhaseLabel("tail-restore", 2, "restore", "measured", 0.07, 0.0, OutsideHook("optimizer", True))
    actions = (
        ClockAction(Boundary(forward), 1980),
        ClockAction(Boundary(forward, inside), 1200),
        ClockAction(Boundary(backward), 1500),
        ClockAction(Boundary(backward, restore), 1980),
        ClockAction(Boundary(backward, END), 1400),  # a launch point: no clock is switched there
    )
    point = PlanPoint("iso-time", 1.0, 1.0, 1.0, (RankPlan(actions, 2.0, 0.5),))
    made = Plan(
        "f" * 16, "h100-sxm", "modelled", "iso-time", ("kernel",), 0.01, Baseline(1.0, 2.0), (point,), 0
    )
    for plan in (made, read_plan(plan_text(made))):
        runner = PlanRunner(plan, 0, (forward, backward))
        # the planner's float, not the microsecond a label string kept (0.235 ms)
        assert runner.inside_requests(forward) == (InsideRequest(1.2345678e-3 - 1e-3, 1200),)
        assert runner.inside_requests(backward) == ()
        assert runner.outside_clocks("optimizer", end=True) == (1980,)
        assert runner.outside_clocks("optimizer") == ()
        assert runner.clock_at(forward) == 1980 and runner.clock_at(forward, inside) == 1200
        report = runner.hook_report() or ""
        assert "1 requested at outside-phase hooks (optimizer.end)" in report
        assert "1 at a point the runtime does not switch clocks at" in report


@pytest.mark.slow
def test_the_runner_gives_every_instruction_its_own_inside_requests_in_plan_order() -> None:
    """Llama-70B stages under a 1 ms switch latency: many instructions with phase clocks inside them."""
    profile = Profile.synthetic(TransformerShape.from_name("llama-70b"), SPEC, 2, clocks_mhz=GRID)
    orders = pipeline_orders(2, 4)
    job = PlanningJob(orders, "0123456789abcdef", EnergyTarget("iso-time"), switch_latency_s=1e-3)
    plan = resolve("kernel").plan(profile, job)
    total = 0
    for stage in range(2):
        runner = PlanRunner(plan, stage, orders.stage(stage))
        planned: dict[Any, list[InsideRequest]] = {}
        for action in plan.target_point.ranks[stage].actions:
            label = action.at.phase
            if isinstance(action, ClockAction) and isinstance(label, PhaseLabel) and label.inside:
                offset_s = max(0.0, label.at_s - label.lead_s)
                planned.setdefault(action.at.instruction, []).append(
                    InsideRequest(offset_s, action.clock_mhz)
                )
        classes = {instruction.work for instruction in planned}
        # every instruction of a class with phase clocks has its own (not the first instruction's, repeated)
        assert set(planned) == {i for i in orders.stage(stage) if i.work in classes}
        for instruction in orders.stage(stage):
            requests = runner.inside_requests(instruction)
            assert list(requests) == planned.get(instruction, [])
            assert [r.offset_s for r in requests] == sorted(r.offset_s for r in requests)
        inside = sum(len(requests) for requests in planned.values())
        total += inside
        if inside:
            assert f"{inside} inside instructions applied time-anchored" in (runner.hook_report() or "")
            assert "not applied (--energy-phase-switching off)" in (
                runner.hook_report(inside_switched=False) or ""
            )
    assert total
