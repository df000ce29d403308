"""At 1k-16k GPUs: every collective of the session, per step and per log interval, on emulated jobs.

Each job runs its planning replica's pipeline for real, the rest of the job emulated, every collective
recorded (``emulated_world``): PP16 x TP8 x DP128 and PP8 x TP8 x DP256 (16,384 ranks each), and PP8 x TP8
x DP2 (128 ranks) to set the log's bytes against. Each profiles, plans (the real optimiser, in its planner
process) and runs the plan for two exchanges of paces and more. The tests assert what the runtime's rules
ask (``runtime.control_plane.staged_exchange``, ``runtime.control_plane.exchange_period``):

- no collective of the session, from set-up to close, spans more than a data-parallel or pipeline group;
- per run-phase step, each group carries at most one of the session's collectives every K steps (the
  exchange of paces, a few floats), K as the session printed it, its modelled cost amortised within budget;
- the energy line, at these sizes, is a staged exchange too (its chain costs more than its share of the
  budget): one link a step, a new exchange at most every K steps, so the two exchanges together stay within
  the control plane's millisecond a step (modelled), whatever the log interval;
- per exchange of the energy line, the bytes a rank moves stay within a small fixed bound, about the same at
  16,384 ranks as at 128;
- the planning inputs come from the planning replica alone (one gather over its pipeline), the plan reaches
  every rank down the groups' tree; the power-cap check's reads come from it too, in one more gather over its
  pipeline, once.

The simulated timer's own exchange over the pipeline (the simulated GPUs standing in for the pipeline) is
not the session's and is left out. Marked ``world``: it takes as long as one.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict

import pytest
from emulated_world import Collective, EmulatedRun, Shape, run_emulated

from megatron_energy.runtime.control_plane.comms import GROUPS
from megatron_energy.runtime.control_plane.exchange_period import (
    BUDGET_S,
    EXCHANGE_BUDGET_S,
    EXCHANGES,
    exchange_cost_s,
    exchange_period,
)

pytestmark = pytest.mark.world

LARGE = (Shape(16, 8, 128), Shape(8, 8, 256))
SMALL = Shape(8, 8, 2)
LOG_INTERVAL = 10
PROFILING_STEPS = 8  # a settling step, the 4-step baseline pilot, a synchronous step; then 1005 MHz: 2 steps
RUN_PHASES = {"planned", "following straggler", "stock (safety net)"}
PERIOD_LINE = re.compile(r"exchange their pace every (\d+) step\(s\)")


def _steps(shape: Shape) -> int:
    """Profiling, then two exchanges of paces and a few steps more (K as the exchange's rule gives it)."""
    period = exchange_period([shape.pipeline, shape.tensor, shape.data], None)
    return PROFILING_STEPS + 2 * period + 5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[Shape, EmulatedRun]:
    shapes = (*LARGE, SMALL)
    return {
        shape: run_emulated(shape, _steps(shape), tmp_path_factory.mktemp("energy"), LOG_INTERVAL)
        for shape in shapes
    }


def _session_collectives(run: EmulatedRun) -> list[Collective]:
    return [record for record in run.collectives if record.origin != "timing"]


def _period(run: EmulatedRun) -> int:
    (period,) = {int(match[1]) for line in run.lines[0] if (match := PERIOD_LINE.search(line))}
    return period


@pytest.mark.parametrize("shape", LARGE, ids=str)
def test_the_planning_replica_profiles_plans_and_runs_the_plan(runs, shape):
    run = runs[shape]
    assert run.phases == ("profiling",) * PROFILING_STEPS + ("planned",) * (_steps(shape) - PROFILING_STEPS)
    assert shape.world == 16384
    logged = [line for line in run.lines[0] if line.startswith("[energy] iteration") and "J/iter" in line]
    # the energy line's exchange begins at the first interval's end, then at the first one K steps later;
    # each line covers the iterations since the one before it and is printed when its last link completes
    period = exchange_period([shape.pipeline, shape.tensor, shape.data], None)
    second = next(end for end in range(19, _steps(shape), LOG_INTERVAL) if end - 9 >= period)
    assert [line.split(" | ")[0] for line in logged] == [
        "[energy] iteration 10",
        f"[energy] iterations 11-{second + 1}",
    ]
    assert all("J/iter modelled: " in line and "predicted (modelled)" in line for line in logged[1:])
    unlogged = f"[energy] iterations {second + 2}-{_steps(shape)}: no job-wide energy line"
    assert sum(line.startswith(unlogged) for line in run.lines[0]) == 1  # said once, by rank 0, at close


@pytest.mark.parametrize("shape", LARGE, ids=str)
def test_no_collective_spans_more_than_a_data_parallel_or_pipeline_group(runs, shape):
    collectives = _session_collectives(runs[shape])
    assert collectives
    assert {record.group for record in collectives} == set(GROUPS)
    assert max(record.size for record in collectives) == max(shape.data, shape.pipeline) < shape.world


@pytest.mark.parametrize("shape", LARGE, ids=str)
def test_per_run_phase_step_each_group_carries_one_small_collective_every_k_steps(runs, shape):
    run = runs[shape]
    sizes = [shape.pipeline, shape.tensor, shape.data]
    period = exchange_period(sizes, None)
    assert period > 1 and exchange_cost_s(sizes) / period <= EXCHANGE_BUDGET_S  # modelled, over K steps
    assert EXCHANGES * exchange_cost_s(sizes) / period <= BUDGET_S  # the paces and the energy line: 1 ms
    per_step = [
        record
        for record in _session_collectives(run)
        if record.phase in RUN_PHASES and record.origin != "energy_logger"
    ]
    assert {record.size for record in per_step} <= set(sizes)  # never the world's
    for stage in range(shape.pipeline):
        for group in GROUPS:
            steps = [record.step for record in per_step if record.stage == stage and record.group == group]
            assert len(steps) >= 2, (stage, group)  # two exchanges at least: the test is not vacuous
            assert all(later - earlier >= period for earlier, later in itertools.pairwise(steps))
    assert {(record.kind, record.origin) for record in per_step} == {("all_reduce", "staged_exchange")}
    assert max(record.bytes for record in per_step) <= 4 * 16  # a pace and its negation, out and in
    # the energy line: one link a step (a max and a sum over one group), a new exchange at most every K
    # steps, begun at an interval's end
    logging = [record for record in _session_collectives(run) if record.origin == "energy_logger"]
    for stage in range(shape.pipeline):
        mine = [record for record in logging if record.stage == stage]
        for step, records in itertools.groupby(mine, key=lambda record: record.step):
            assert len({record.group for record in records}) == 1, (stage, step)
        for group in GROUPS:
            steps = sorted({record.step for record in mine if record.group == group})
            assert len(steps) >= 2 and all(b - a >= period for a, b in itertools.pairwise(steps)), group
        begun = sorted({record.step for record in mine if record.group == "pipeline"})
        assert all((step + 1) % LOG_INTERVAL == 0 for step in begun)
    assert _period(run) == period  # as rank 0 says it


def _bytes_per_exchange(run: EmulatedRun) -> set[float]:
    """The bytes each rank moved in each exchange of the energy line (its three links)."""
    moved: dict[int, list[int]] = defaultdict(list)
    for record in _session_collectives(run):
        if record.origin == "energy_logger":
            moved[record.stage].append(record.bytes)
    per_link = 2  # a max and a sum
    return {sum(found) / (len(found) / (per_link * len(GROUPS))) for found in moved.values()}


def _moved_bytes(run: EmulatedRun, origin: str, kind: str | None = None) -> set[int]:
    """The bytes each rank moved in ``origin``'s collectives (of ``kind``) at each step it ran some."""
    moved: dict[tuple[int, int], int] = defaultdict(int)
    for record in _session_collectives(run):
        if record.origin == origin and kind in (None, record.kind):
            moved[(record.stage, record.step)] += record.bytes
    return set(moved.values())


def test_per_exchange_of_the_energy_line_the_bytes_per_rank_do_not_grow_with_the_job(runs):
    small, large = runs[SMALL], runs[LARGE[1]]
    assert small.shape.pipeline == large.shape.pipeline and large.shape.world == 128 * small.shape.world
    (per_exchange,) = _bytes_per_exchange(small)  # every rank, every exchange: the same
    (at_scale,) = _bytes_per_exchange(large)
    # a ring moves 2 (n-1)/n of a vector each way: at most twice as much over 256 ranks as over 2
    assert per_exchange <= at_scale <= 2 * per_exchange
    assert at_scale < 16 * 1024  # two fixed-size vectors over each of the three groups
    kinds = {record.kind for record in large.collectives if record.origin == "energy_logger"}
    assert kinds == {"all_reduce"}  # no gather, no broadcast
    # the planning's reductions (its check of the other replicas, the job's stock steps) do not grow either
    planning = max(_moved_bytes(large, "replica_profile", kind="all_reduce"))
    assert planning <= 2 * max(_moved_bytes(small, "replica_profile", kind="all_reduce"))


@pytest.mark.parametrize("shape", LARGE, ids=str)
def test_the_planning_replica_alone_sends_its_profile_and_the_plan_comes_down_the_groups(runs, shape):
    collectives = _session_collectives(runs[shape])
    gathers = [record for record in collectives if record.kind in ("gather", "all_gather")]
    for origin in ("replica_profile", "profile_steps"):  # the profile; the power-cap check's reads
        mine = [record for record in gathers if record.origin == origin]
        assert {record.group for record in mine} == {"pipeline"}, origin
        assert sorted(record.stage for record in mine) == list(range(shape.pipeline)), origin  # once a stage
    assert len(gathers) == 2 * shape.pipeline
    broadcasts = [record for record in collectives if record.kind == "broadcast"]
    # the cache look-up's answer at start, then the plan: each once over every group, down the tree
    for stage in range(shape.pipeline):
        mine = [record.group for record in broadcasts if record.stage == stage]
        assert mine == ["pipeline", "data", "tensor"] * 2, stage
