"""The in-process overhead check: which steps reach the session, and the paired change it reports."""

from __future__ import annotations

import argparse
import json
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from log_lines import capture_lines

from megatron_energy.config import EnergyConfig, add_energy_args
from megatron_energy.dvfs.meter import EnergyWindow
from megatron_energy.megatron.session_factory import DeferredSession
from megatron_energy.runtime.energy_log.overhead_check import OverheadCheck, OverheadResult, pooled

PLANNED_AT = 3
"""The first step the fake session runs its plan."""


@dataclass
class FakeSession:
    """Records what reaches it; its steps take 1.0 s suspended and ``active_s`` active (a fake clock), and
    draw ``energy_j`` per step (``active_j`` active)."""

    active_s: float
    noise: float = 0.0
    active_j: float = 100.0
    phase: str = "profiling"
    calls: list[str] = field(default_factory=list)
    seen_steps: list[int] = field(default_factory=list)
    suspended: bool = False
    now_s: float = 0.0
    last_j: float = 0.0
    disturbed: frozenset[int] = frozenset()
    """Steps slowed by 20 % from outside the job, whatever the block."""
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def suspend(self) -> None:
        self.calls.append("suspend")
        self.suspended = True

    def resume(self) -> None:
        self.calls.append("resume")
        self.suspended = False

    def energy_window(self) -> Future[EnergyWindow | None]:
        done: Future[EnergyWindow | None] = Future()
        joules = self.last_j
        done.set_result(EnergyWindow("check", 0.0, 1.0, {0: joules}, joules, None, True, False, "measured"))
        return done

    def run_step(self, step: int) -> None:
        if not self.suspended:
            self.seen_steps.append(step)
        self.phase = "planned" if step >= PLANNED_AT else "profiling"
        seconds = 1.0 if self.suspended else self.active_s
        outside = 1.2 if step in self.disturbed else 1.0
        self.now_s += seconds * outside * (1 + self.noise * self.rng.standard_normal())
        self.last_j = 100.0 if self.suspended else self.active_j


def drive(check: OverheadCheck, session: FakeSession, steps: int) -> list[bool]:
    taking_part = []
    for step in range(steps):
        taking_part.append(check.before_step(step, session))
        session.run_step(step)
    check.before_step(steps, session)  # the next step's start closes the last one
    return taking_part


def test_blocks_alternate_in_pairs_of_swapped_order_after_one_settling_block() -> None:
    session = FakeSession(active_s=1.0)
    check = OverheadCheck(4, measured_energy=False, clock=lambda: session.now_s)
    taking_part = drive(check, session, PLANNED_AT + 4 + 16)
    first = PLANNED_AT + 1 + 4  # planned from step 3 (seen at step 4's start), then one active block
    assert all(taking_part[:first])
    blocks = [taking_part[first + 4 * b : first + 4 * b + 4] for b in range(4)]
    assert [set(b) for b in blocks] == [{False}, {True}, {True}, {False}]  # off on | on off
    assert session.calls == ["suspend", "resume", "suspend"]
    assert set(session.seen_steps).isdisjoint(range(first, first + 4))


def test_a_known_slowdown_is_recovered_with_an_interval_that_holds_it() -> None:
    session = FakeSession(active_s=1.02, noise=0.002)
    check = OverheadCheck(5, measured_energy=False, clock=lambda: session.now_s)
    drive(check, session, 4 + 5 + 2 * 2 * 5 * 4)  # settle, then 8 pairs
    result = check.result()
    assert result is not None and result.pairs == 8
    assert result.time.low < 0.02 < result.time.high
    assert result.time.excludes_zero and result.time.halfwidth < 0.005
    assert result.time_median.low < 0.02 < result.time_median.high and result.time_median.excludes_zero
    assert result.energy is None and result.energy_median is None  # the counter is not read: not measured
    line = result.describe(clocks_set=False)
    assert line.startswith("overhead check, in process, the training-thread hooks' cost (clocks not set): ")
    assert "8 pairs of 5-iteration blocks (the plugin's background threads keep running in both; " in line
    assert "lab/bench_overhead.py compares against Megatron itself" in line
    assert "iteration time median of pairs +" in line


def test_no_change_reads_within_noise_and_too_short_a_run_gives_no_result() -> None:
    session = FakeSession(active_s=1.0, noise=0.01)
    check = OverheadCheck(3, measured_energy=False, clock=lambda: session.now_s)
    drive(check, session, 4 + 3 + 2 * 2 * 3 * 5)
    result = check.result()
    assert result is not None and not result.time.excludes_zero
    assert "within noise" in result.describe(clocks_set=False)
    short = OverheadCheck(3, measured_energy=False, clock=lambda: session.now_s)
    drive(short, FakeSession(active_s=1.0), 4 + 3 + 6)
    assert short.result() is None


@pytest.mark.parametrize("value", ["1", "-2", "x"])
def test_the_flag_takes_zero_or_a_block_of_two_or_more(value: str) -> None:
    parser = add_energy_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit):
        parser.parse_args(["--energy-optimise", "--energy-overhead-check", value])
    args = parser.parse_args(["--energy-optimise", "--energy-overhead-check", "6"])
    assert EnergyConfig.from_args(args).overhead_check == 6


def test_the_launcher_listener_keeps_suspended_steps_from_the_session(tmp_path: Path) -> None:
    listener = DeferredSession(EnergyConfig(optimise=True, overhead_check=2, dir=tmp_path))
    session = RecordingSession()
    listener.session = session
    listener.overhead_check = OverheadCheck(2, measured_energy=False)
    for step in range(12):
        listener.on_step_begin(step)
        listener.on_instruction_begin("forward", 0, 0)
        listener.on_step_end(step)
    listener.close()
    # planned from the start: 0-1 settle, then blocks of 2: 2-3 off, 4-5 on | 6-7 on, 8-9 off | 10-11 off
    assert session.begun == [0, 1, 4, 5, 6, 7]
    assert session.instructions == len(session.begun)
    assert session.closed and "overhead check" in session.lines[-1]
    kept = tmp_path / "overhead-check-rank0.json"
    assert f"pairs in {kept}" in session.lines[-1]
    assert OverheadResult.from_json(json.loads(kept.read_text())) == listener.overhead_check.result()


@dataclass
class RecordingSession:
    phase: str = "planned"
    can_set_clocks: bool = False
    begun: list[int] = field(default_factory=list)
    instructions: int = 0
    closed: bool = False
    lines: list[str] = field(default_factory=list)

    class context:  # noqa: N801 - what the listener reads of a JobContext
        global_rank = 0

    def __post_init__(self) -> None:
        capture_lines(self.lines)

    def on_step_begin(self, step: int) -> None:
        self.begun.append(step)

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        self.instructions += 1

    def on_step_end(self, step: int) -> None:
        """Nothing to record."""

    def suspend(self) -> None:
        """The listener's call; the steps it then keeps away are what the test checks."""

    def resume(self) -> None:
        """See ``suspend``."""

    def energy_window(self) -> Future[EnergyWindow | None]:
        done: Future[EnergyWindow | None] = Future()
        done.set_result(None)
        return done

    def close(self) -> None:
        self.closed = True


def test_the_energy_counter_windows_are_compared_pair_by_pair_when_measured() -> None:
    session = FakeSession(active_s=1.0, active_j=97.0)
    check = OverheadCheck(4, measured_energy=True, clock=lambda: session.now_s)
    drive(check, session, 4 + 4 + 2 * 2 * 4 * 3)
    result = check.result()
    assert result is not None and result.energy is not None
    assert result.energy.change == pytest.approx(-0.03)
    assert result.energy_median is not None and result.energy_median.change == pytest.approx(-0.03)
    assert "energy per iteration median of pairs -3.00 %" in result.describe(clocks_set=True)


def test_a_few_disturbed_pairs_widen_the_mean_but_the_median_still_resolves_a_small_slowdown() -> None:
    first = PLANNED_AT + 1 + 2  # as in the first test, blocks of 2
    disturbed = frozenset(first + 4 * pair + 1 for pair in (3, 8, 15, 20))  # two pairs each way
    session = FakeSession(active_s=1.003, noise=0.001, disturbed=disturbed)
    check = OverheadCheck(2, measured_energy=False, clock=lambda: session.now_s)
    drive(check, session, first + 4 * 30)
    result = check.result()
    assert result is not None and result.pairs == 30
    median, mean = result.time_median, result.time
    assert median.low < 0.003 < median.high and median.excludes_zero and median.halfwidth < 0.002
    assert not mean.excludes_zero  # four pairs off by 20 % set the mean's interval
    line = result.describe(clocks_set=False)
    assert "iteration time median of pairs +0.2" in line and ", mean +" in line and "within noise" in line


def test_pooled_runs_resolve_what_each_alone_cannot_and_only_runs_of_one_block_size_pool() -> None:
    runs = []
    for seed in range(3):
        session = FakeSession(active_s=1.003, noise=0.004, rng=np.random.default_rng(seed))
        check = OverheadCheck(2, measured_energy=True, clock=lambda session=session: session.now_s)
        drive(check, session, PLANNED_AT + 1 + 2 + 4 * 12)
        result = check.result()
        assert result is not None and result.pairs == 12
        runs.append(OverheadResult.from_json(json.loads(json.dumps(result.to_json()))))
    assert all(not run.time.excludes_zero for run in runs)  # 12 pairs at 0.4 % noise: 0.3 % not resolved
    both = pooled(runs)
    assert both.pairs == 36 and both.time_pairs_s == sum((run.time_pairs_s for run in runs), ())
    assert both.time.excludes_zero and both.time.low < 0.003 < both.time.high
    assert both.energy is not None and both.energy.change == pytest.approx(0.0)
    with pytest.raises(ValueError, match="different blocks"):
        pooled([runs[0], OverheadResult(4, runs[1].time_pairs_s, None)])
    assert pooled([runs[0], OverheadResult(2, runs[1].time_pairs_s, None)]).energy is None


@pytest.mark.parametrize(
    "document",
    [
        {},
        {"block_steps": 2, "time_pairs_s": [[1.0]], "energy_pairs_j": None},
        {"block_steps": 2, "time_pairs_s": [[1.0, -1.0]], "energy_pairs_j": None},
        {"block_steps": 2, "time_pairs_s": [[1.0, 1.0]], "energy_pairs_j": []},
    ],
)
def test_a_malformed_pairs_file_is_refused_with_what_is_wrong(document: dict) -> None:
    with pytest.raises(ValueError, match=r"overhead-check result|pair|energy pairs"):
        OverheadResult.from_json(document)
