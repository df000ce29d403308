"""The port between the session and the collective runner: the session's state tells which plan point runs.

The runner is told (``runtime.parts.PlanFollower``) when a plan is adopted, moved to another point, reverted
and re-armed; it searches no listener list for the session and polls nothing. Its launches on real
megatron-core DDP chunks are tested in ``test_collective_launch_world``; here a recording launcher stands in
for ``CollectiveLauncher``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from log_lines import capture_lines

from megatron_energy import launch
from megatron_energy.config import EnergyConfig
from megatron_energy.errors import EnergyRuntimeError
from megatron_energy.megatron import collective_runner, session_factory
from megatron_energy.megatron.collective_runner import CollectiveRunner
from megatron_energy.megatron.session_factory import DeferredSession
from megatron_energy.pipeline.collective_names import CollectiveName
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.plan import (
    Action,
    Baseline,
    Boundary,
    ClockAction,
    CollectiveAction,
    Plan,
    PlanPoint,
    RankPlan,
)
from megatron_energy.runtime import assembly
from megatron_energy.runtime.parts import RunningPoint
from megatron_energy.runtime.running.plan_runner import PlanRunner
from megatron_energy.runtime.session_state import SessionState

F = Instruction(0, 0, 0, "forward")
B = Instruction(0, 0, 0, "backward")
ORDER = (F, B)


def _plan(points: Sequence[Sequence[Action]], fingerprint: str = "f" * 16) -> Plan:
    """A one-stage plan with one point per entry of ``points`` (their actions), the first the target."""
    return Plan(
        fingerprint,
        "h100-sxm",
        "modelled",
        "iso-time",
        ("kareus",),
        0.0,
        Baseline(1.0, 10.0),
        tuple(
            PlanPoint(f"p{i}", 1.0 + i, 1.0 + i, 1.0, (RankPlan(tuple(actions), 5.0, 0.5),))
            for i, actions in enumerate(points)
        ),
        0,
    )


EARLY = (CollectiveAction(Boundary(B), CollectiveName("dp", "all_reduce", bucket=0)),)
LATE = (CollectiveAction(Boundary(B), CollectiveName("dp", "all_reduce", bucket=0), max_ctas=8),)


class Told:
    """A plan follower that keeps what it is told."""

    def __init__(self) -> None:
        self.told: list[RunningPoint | None] = []

    def follow(self, running: RunningPoint | None) -> None:
        self.told.append(running)


class RecordingLauncher:
    """Stands in for ``CollectiveLauncher``: what each launcher was built with, and whether it was removed."""

    built: ClassVar[list[RecordingLauncher]] = []

    def __init__(self, chunks: Any, actions: Any, order: Any, stage: int, **_: Any) -> None:
        self.actions, self.order, self.stage = tuple(actions), tuple(order), stage
        self.installed = True
        self.steps: list[int] = []
        RecordingLauncher.built.append(self)

    def uninstall(self) -> None:
        self.installed = False

    def on_step_begin(self, step: int) -> None:
        self.steps.append(step)


@pytest.fixture
def launchers(monkeypatch: pytest.MonkeyPatch) -> list[RecordingLauncher]:
    monkeypatch.setattr(RecordingLauncher, "built", [])
    monkeypatch.setattr(collective_runner, "CollectiveLauncher", RecordingLauncher)
    return RecordingLauncher.built


def test_the_state_tells_its_followers_each_adoption_point_switch_and_revert() -> None:
    plan = _plan([EARLY, LATE])
    state, told = SessionState(), Told()
    state.follow(told)
    state.run(PlanRunner(plan, 0, ORDER))  # adopted
    state.select(1)  # a straggler's pace
    state.select(1)  # the same point: nothing to tell
    state.stop()  # the safety net
    state.run(PlanRunner(plan, 0, ORDER))  # re-armed
    assert told.told == [
        None,
        RunningPoint(plan, 0, 0, ORDER),
        RunningPoint(plan, 1, 0, ORDER),
        None,
        RunningPoint(plan, 0, 0, ORDER),
    ]
    assert told.told[2] is not None and told.told[2].actions == LATE
    late = Told()
    state.follow(late)  # a follower that joins later is told what runs now
    assert late.told == [RunningPoint(plan, 0, 0, ORDER)]
    state.stop()
    with pytest.raises(EnergyRuntimeError, match="no plan runs"):
        state.select(1)
    assert state.runner is None and late.told[-1] is None


def test_the_runner_builds_swaps_and_removes_its_launcher_at_the_step_after_it_is_told(
    launchers: list[RecordingLauncher],
) -> None:
    plan = _plan([EARLY, LATE])
    lines = capture_lines()
    runner = CollectiveRunner(lambda: ["chunk"])
    state = SessionState()
    state.follow(runner)
    runner.on_step_begin(0)
    state.run(PlanRunner(plan, 0, ORDER))
    assert launchers == []  # applied from the next step's start, not mid-step
    runner.on_step_begin(1)
    runner.on_step_begin(2)
    (first,) = launchers
    assert (first.actions, first.order, first.stage, first.steps) == (EARLY, ORDER, 0, [1, 2])
    state.select(1)
    runner.on_step_begin(3)
    assert not first.installed and launchers[1].actions == LATE and launchers[1].steps == [3]
    state.stop()
    runner.on_step_begin(4)
    assert not launchers[1].installed and runner.launcher is None and len(launchers) == 2
    assert lines == []  # nothing refused
    state.run(PlanRunner(plan, 0, ORDER))
    runner.on_step_begin(5)
    assert launchers[2].actions == EARLY and launchers[2].installed
    clocks_only = _plan([(ClockAction(Boundary(F), 1500),)], fingerprint="e" * 16)
    state.run(PlanRunner(clocks_only, 0, ORDER))
    runner.on_step_begin(6)  # nothing Megatron does changes: no launcher
    assert not launchers[2].installed and runner.launcher is None and len(launchers) == 3


def test_a_plan_the_job_cannot_honour_is_reported_once_through_its_point_switches(
    launchers: list[RecordingLauncher],
) -> None:
    lines = capture_lines()
    runner = CollectiveRunner(lambda: None)  # the model chunks were not captured
    state = SessionState()
    state.follow(runner)
    plan = _plan([EARLY, LATE])
    state.run(PlanRunner(plan, 0, ORDER))
    runner.on_step_begin(0)
    state.select(1)
    runner.on_step_begin(1)
    (line,) = lines
    assert line.startswith("[energy] pipeline rank 0: the plan's collective actions are not applied")
    assert "model chunks were not captured" in line
    state.run(PlanRunner(_plan([EARLY], fingerprint="e" * 16), 0, ORDER))
    runner.on_step_begin(2)  # another plan is another report
    assert len(lines) == 2 and launchers == []


def test_the_launcher_wires_the_runner_to_the_session_it_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launchers: list[RecordingLauncher]
) -> None:
    def chunks() -> list[str]:
        return ["chunk"]

    monkeypatch.setattr(collective_runner, "megatron_communicator_config", lambda: None)
    assert [type(x) for x in launch.build_listeners(EnergyConfig(optimise=True, dir=tmp_path))] == [
        DeferredSession
    ]
    deferred, runner = launch.build_listeners(EnergyConfig(optimise=True, dir=tmp_path), chunks)
    assert isinstance(deferred, DeferredSession) and isinstance(runner, CollectiveRunner)
    assert deferred.plan_followers == [runner] and deferred.model_chunks is chunks
    # a plan taken from the cache is adopted while the session is built: the runner is told at its start
    state = SessionState()
    state.run(PlanRunner(_plan([EARLY]), 0, ORDER))
    session = SimpleNamespace(
        state=state, on_step_begin=lambda step: None, context=SimpleNamespace(global_rank=1)
    )
    monkeypatch.setattr(session_factory, "graph_settling_steps", lambda: 0)
    monkeypatch.setattr(session_factory, "megatron_job_context", lambda model_chunks: (None, None))
    monkeypatch.setattr(assembly, "build_session", lambda config, context, comms: session)
    deferred.on_step_begin(0)
    runner.on_step_begin(0)
    (launcher,) = launchers
    assert launcher.actions == EARLY and launcher.steps == [0]
