"""Planning off the critical path: the plan is computed in a planner process while training goes on.

Two gloo worlds (PP=2 of GPT-3 1.3B stage work on simulated H100s, ``session_world``) plan in the
background (``--energy-planning background``: simulated GPUs would wait for the planner by default) with toy
optimisers installed as an entry-point plugin (``plugin_site``, ``tests/optimiser_plugin/toy_planners.py``),
which the planner process finds on the ranks' path: one plans for a few seconds, while the steps keep
their pace at stock clocks, and every rank switches to the plan at the same step; the other's process exits
with status 3, and every rank trains on at stock clocks. The unit tests start the planner's ``ChildProcess``
directly, with the toys registered by import path: the plan it computes is the one planned in process, every
way its process can fail is a fallback that says why, and it ends (and cleans up) when its parent dies.
"""

from __future__ import annotations

import os
import pickle
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path

import pytest
from plugin_site import PLUGIN_SOURCE, install_plugin
from session_world import RankReport, SessionSettings, run_world

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers import registry
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.runtime.child_process import ChildProcess
from megatron_energy.runtime.planning_round.planner_process import PlannerInput
from megatron_energy.runtime.planning_round.planning import Fallback, PlanRelease, plan_on_root
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.runtime.session_phase import SessionPhase
from megatron_energy.target import EnergyTarget

GRID_MHZ = (1980, 1005)
TOYS = {
    "toy-slow": "toy_planners:SlowFixedClocks",
    "toy-hangs": "toy_planners:HangingPlanner",
    "toy-exits": "toy_planners:ExitingPlanner",
    "toy-killed": "toy_planners:KilledPlanner",
    "toy-raises": "toy_planners:RaisingPlanner",
    "toy-corrupts": "toy_planners:CorruptingPlanner",
}
FALLBACK_LINE = "not optimising, training continues at stock clocks: planning failed: "
TOOK_EFFECT = re.compile(
    r"^\[energy\] plan took effect at iteration (\d+): computed in ([\d.]+) s while (\d+) iteration\(s\) ran "
    r"at stock clocks; adopting it took ([\d.]+) ms of the training thread \(measured\)$"
)


def _world(tmp_path_factory: pytest.TempPathFactory, mode: str) -> list[RankReport]:
    root = tmp_path_factory.mktemp(mode)
    install_plugin(root / "site", TOYS)
    settings = SessionSettings(
        pipeline_size=2,
        num_microbatches=4,
        freq_grid=GRID_MHZ,
        profile_iters=1,
        run_steps=3,
        log_interval=4,
        energy_dir=root / "energy",
        mode=mode,
        planning="background",
        sys_path=(root / "site", PLUGIN_SOURCE),
    )
    return run_world(settings, root / "results")


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> list[RankReport]:
    return _world(tmp_path_factory, "toy-slow")


@pytest.fixture(scope="module")
def exits(tmp_path_factory: pytest.TempPathFactory) -> list[RankReport]:
    return _world(tmp_path_factory, "toy-exits")


def _phases(report: RankReport) -> list[str]:
    return [step.phase for step in report.steps]


def _runs(phases: list[str]) -> list[tuple[str, int]]:
    """The phases in the order they ran, each with how many steps ran in it."""
    return [(phase, len(list(steps))) for phase, steps in groupby(phases)]


@pytest.mark.world
def test_training_keeps_its_pace_while_planning_and_every_rank_switches_at_the_same_step(
    slow, plan_sleep_s
) -> None:
    runs = [_runs(_phases(report)) for report in slow]
    assert runs[0] == runs[1]  # the same phases, switched at the same steps
    (profiling, profiled), (planning, planned_while), (planned, _) = runs[0]
    assert (profiling, planning, planned) == ("profiling", SessionPhase.PLANNING, "planned")
    for report in slow:
        stock = [step.wall_s for step in report.steps if step.phase == "profiling"][1:]  # after the first
        during = [step.wall_s for step in report.steps if step.phase == SessionPhase.PLANNING]
        # the planner's seconds passed while these steps ran, none of them waited for it
        assert sum(during) >= plan_sleep_s
        assert max(during) < plan_sleep_s / 3
        assert statistics.median(during) < 3 * statistics.median(stock) + 0.05
        # at stock clocks (the first step may still switch up from the last profiled clock)
        modelled_s = [step.iteration_s for step in report.steps if step.phase == SessionPhase.PLANNING]
        assert statistics.median(modelled_s) == pytest.approx(report.stock_time_s, rel=1e-9)
    (line,) = [line for line in slow[0].lines if line.startswith("[energy] plan took effect")]
    took = TOOK_EFFECT.match(line)
    assert took is not None, line
    assert int(took[1]) == profiled + planned_while + 1  # 1-based: the first planned step
    assert int(took[3]) == planned_while
    assert float(took[2]) >= plan_sleep_s
    assert not any(line.startswith("[energy] plan took effect") for line in slow[1].lines)
    logged = [line for line in slow[0].lines if f"| {SessionPhase.PLANNING} |" in line]
    assert logged, slow[0].lines  # the energy log says which steps ran while planning


@pytest.mark.world
def test_a_planner_process_that_dies_leaves_every_rank_at_stock_clocks_with_one_line(exits) -> None:
    for report in exits:
        runs = _runs(_phases(report))
        assert [phase for phase, _ in runs] == ["profiling", SessionPhase.PLANNING, "stock (planning failed)"]
        (line,) = [line for line in report.lines if FALLBACK_LINE in line]
        assert line == (
            f"[energy] rank {report.rank}: {FALLBACK_LINE}the planner process exited with status 3 "
            "(toy planner: giving up)"
        )
    assert _runs(_phases(exits[0])) == _runs(_phases(exits[1]))


# ---------------------------------------------------------------------------------- the process alone


@pytest.fixture
def toys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy planners registered by import path, their folder on the path (the planner process's too)."""
    monkeypatch.syspath_prepend(str(PLUGIN_SOURCE))
    for name, factory in TOYS.items():
        registry.register(name, factory)
    yield
    for name in TOYS:
        registry.unregister(name)


@pytest.fixture
def plan_sleep_s(toys) -> float:
    """How long the slow toy plans."""
    import toy_planners

    return toy_planners.PLAN_SLEEP_S


def _inputs(mode: str) -> PlannerInput:
    spec = load_gpu_spec("h100-sxm")
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=1)
    profile = Profile.synthetic(shape, spec, 2, clocks_mhz=GRID_MHZ)
    job = PlanningJob(
        orders=pipeline_orders(2, 4), fingerprint="background-planning-test", target=EnergyTarget("iso-time")
    )
    return PlannerInput(mode, registry.registered(), profile, job, StockBaseline(iteration_s=0.1))


@pytest.mark.slow
def test_the_planner_process_plans_exactly_what_planning_in_process_would(toys) -> None:
    inputs = _inputs("perseus")
    outcome = ChildProcess(inputs).wait()
    assert isinstance(outcome, PlanRelease)
    expected = plan_on_root(registry.resolve("perseus"), inputs.profile, inputs.job, inputs.baseline)
    assert outcome == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("toy-exits", "the planner process exited with status 3 (toy planner: giving up)"),
        ("toy-killed", "the planner process was killed by SIGKILL"),
        ("toy-raises", "RuntimeError: toy solver failure"),
        ("toy-corrupts", "the planner process left no readable result (UnpicklingError: "),
        ("no-such-mode", "UnknownModeError: unknown --energy-mode 'no-such-mode'"),
    ],
)
def test_every_way_the_planner_process_fails_is_a_fallback_that_says_why(toys, mode, reason) -> None:
    planner = ChildProcess(_inputs(mode))
    outcome = planner.wait()
    assert isinstance(outcome, Fallback)
    assert outcome.reason.startswith(f"planning failed: {reason}"), outcome.reason
    assert not planner.folder.exists()


@pytest.mark.slow
def test_a_planner_still_running_is_terminated_and_its_folder_removed(toys) -> None:
    planner = ChildProcess(_inputs("toy-hangs"))
    assert planner.poll() is None  # at once, while it plans
    planner.terminate()
    assert not planner.folder.exists()
    outcome = planner.poll()
    assert isinstance(outcome, Fallback) and "killed by SIGTERM" in outcome.reason


PARENT = """
import os, pickle, sys
from megatron_energy.runtime.child_process import ChildProcess

planner = ChildProcess(pickle.loads(open(sys.argv[1], "rb").read()))
print(planner.folder, planner._child.pid, flush=True)
os._exit(0)  # as a SIGKILL ends a rank: no close, no cleanup
"""


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (an exited child nobody reaped yet is a zombie: not running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
def test_a_planner_process_whose_parent_dies_removes_its_folder_and_ends(toys, tmp_path) -> None:
    (tmp_path / "input.pkl").write_bytes(pickle.dumps(_inputs("toy-hangs")))
    parent = subprocess.run(
        [sys.executable, "-c", PARENT, str(tmp_path / "input.pkl")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        check=True,
    )
    folder, pid = parent.stdout.split()
    deadline = time.monotonic() + 30
    while (Path(folder).exists() or _running(int(pid))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(folder).exists() and not _running(int(pid))  # long before the toy's ten minutes
