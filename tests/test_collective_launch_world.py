"""DDP gradient reductions launched at a plan's launch points, on real megatron-core schedules over gloo.

One world (pipeline 2 x virtual pipeline 2 x data parallel 2, the tiny GPT with two layers per chunk in
megatron-core's DDP with ``--overlap-grad-reduce``, ``--align-grad-reduce`` and 40-element buckets) runs every
case, see ``ddp_world.launch_world_worker``; the collectives are observed by wrapping
``torch.distributed.all_reduce`` inside the worker, in one record with the hook events and the start of every
layer's backward (observed by the worker's own hooks, not the launcher's).
"""

from __future__ import annotations

from typing import Any

import pytest
from ddp_world import NUM_MICROBATCHES, grad_ready_world_worker, launch_world_worker
from megatron_harness import spawn_world

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.collective_names import END
from megatron_energy.pipeline.collectives import build_collectives
from megatron_energy.pipeline.job_collectives import CollectiveSetup
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import TransformerShape

pytestmark = pytest.mark.world


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return spawn_world(launch_world_worker, 4, tmp_path_factory.mktemp("launch-world"))


def _steps(events: list[tuple]) -> list[list[tuple]]:
    """The events of each step, step markers dropped and the step number ignored."""
    steps: list[list[tuple]] = []
    for event in events:
        if event[0] == "step_begin":
            steps.append([])
        elif event[0] != "step_end":
            steps[-1].append(event)
    return steps


def _without_groups(events: list[tuple]) -> list[tuple]:
    return [event[:2] if event[0] == "collective" else event for event in events]


def _hook_event(at: Any) -> tuple:
    """The recorded event a launch at ``at`` must follow, with the instruction running then (for layers)."""
    ins = at.instruction
    ids = (ins.kind, ins.microbatch, ins.chunk)
    if at.phase is None:
        return ("instruction_begin", *ids), None
    if at.phase == END:
        return ("instruction_end", *ids), None
    done = at.phase.layers_done(LAYERS)
    return ("layer_backward", ins.chunk, LAYERS - 1 - done), ids


LAYERS = 2


def _launched_after(step: list[tuple]) -> dict[str, tuple]:
    """Each collective of the step: the event right before it, and the instruction running (layer events)."""
    seen: dict[str, tuple] = {}
    last: tuple = (("step_begin",), None)
    running = None
    for event in step:
        if event[0] == "collective":
            assert event[1] not in seen, f"{event[1]} launched twice in one step"
            seen[event[1]] = last
            continue
        if event[0] == "instruction_begin":
            running = event[1:]
        elif event[0] == "instruction_end":
            running = None
        last = (event, running if event[0] == "layer_backward" else None)
    return seen


def test_every_bucket_group_is_reduced_once_per_step_without_a_plan(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        names = {name for name, _, _, _ in report["layout"]}
        for step in _steps(report["baseline"]):
            assert set(_launched_after(step)) == names
    # megatron-core buckets only pipeline rank 0's first chunk
    assert [len(r["layout"]) for r in reports][2:] == [2, 2]
    assert len(reports[0]["layout"]) > 2


def test_the_measured_bucket_layout_gives_the_planner_megatrons_buckets_and_earliest_points(
    reports: list[dict[str, Any]],
) -> None:
    """The layout the session hands the planner names every bucket group megatron-core made, and the
    planner's earliest launch point of each is the one the runtime accepts as earliest (the early plan)."""
    shape = TransformerShape(8, 16, 64, 2, 8, 1, 128)  # layer count as the world's: 2 per chunk, 2 x 2 chunks
    orders = pipeline_orders(2, NUM_MICROBATCHES, 2)
    buckets = tuple(bucket for report in reports[::2] for bucket in report["measured"])
    setup = CollectiveSetup(2, distributed_optimizer=False, buckets=buckets)
    workload = setup.workload(shape, orders, load_gpu_spec("h100-sxm"))
    for report in reports:
        planned = {
            c.name: c for c in build_collectives(workload) if c.stage == report["stage"] and c.cls.per_bucket
        }
        assert set(planned) == {name for name, *_ in report["layout"]}
        earliest = {action.collective: action.at for action in report["early"]["plan"]}
        assert {name: c.launch_points[0] for name, c in planned.items()} == earliest


def test_a_plan_without_collective_actions_leaves_megatron_unchanged(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert _steps(report["empty"]) == _steps(report["baseline"])
        assert report["empty_same_grads"]
        assert not any(report["empty_patched"])


@pytest.mark.parametrize("label", ["late", "early"])
def test_collectives_launch_at_the_planned_boundaries(reports: list[dict[str, Any]], label: str) -> None:
    for report in reports:
        planned = report[label]
        expected = {action.collective: _hook_event(action.at) for action in planned["plan"]}
        if label == "early" and report["stage"] == 0:
            # the contract's earliest points include layer boundaries inside a backward here
            assert any(marker[0][0] == "layer_backward" for marker in expected.values())
        steps = _steps(planned["events"])
        assert len(steps) == 2
        for step in steps:
            assert _launched_after(step) == expected
        assert planned["same_grads"], "retiming the reductions changed the gradients"
        assert [launch.collective for launch in planned["launches"]].count(planned["plan"][0].collective) == 2
        assert not any("missed" in launch.where for launch in planned["launches"])


def test_the_plans_move_launches_relative_to_megatron(reports: list[dict[str, Any]]) -> None:
    """The late plan defers chunk 1's reduction past Megatron's launch; the early plan forces it before
    ``--align-grad-reduce`` would launch it on pipeline rank 1 (so the test shows movement, not a replay)."""
    for report in reports:
        chunk1 = next(name for name, chunk, _, _ in report["layout"] if chunk == 1)
        megatron, _ = _launched_after(_steps(report["baseline"])[0])[chunk1]
        late, _ = _launched_after(_steps(report["late"]["events"])[0])[chunk1]
        assert _index_of(late, report["order"]) > _index_of(megatron, report["order"])
    rank1 = reports[2]
    chunk1 = next(name for name, chunk, _, _ in rank1["layout"] if chunk == 1)
    megatron, _ = _launched_after(_steps(rank1["baseline"])[0])[chunk1]
    early, _ = _launched_after(_steps(rank1["early"]["events"])[0])[chunk1]
    assert early == ("instruction_end", "backward", 3, 1)
    assert _index_of(early, rank1["order"]) < _index_of(megatron, rank1["order"])


def _index_of(hook: tuple, order: list) -> float:
    """Position of a hook event in the order (an end counts half an instruction later)."""
    kind, microbatch, chunk = hook[1:]
    index = next(
        i for i, ins in enumerate(order) if (ins.kind, ins.microbatch, ins.chunk) == (kind, microbatch, chunk)
    )
    return index + (0.5 if hook[0] == "instruction_end" else 0.0)


def test_a_cta_budget_reaches_the_options_megatron_builds_and_picks_its_communicator(
    reports: list[dict[str, Any]],
) -> None:
    for rank, report in enumerate(reports):
        (made,) = report["budget_groups"]
        replica_ranks = [rank - rank % 2, rank - rank % 2 + 1]
        assert made == {
            "ranks": replica_ranks,
            "backend": "nccl",
            "max_ctas": 8,
            "min_ctas": 8,
            "high_priority": True,
            "desc": "dp_cp.ctas8",
        }
        (step,) = _steps(report["budget_events"])
        groups = {event[1]: event[3] for event in step if event[0] == "collective"}
        assert groups.pop(report["budget_collective"]) == report["budget_group_id"]
        assert set(groups.values()) == {report["base_group_id"]}


REFUSALS = {
    "before_gradients": ("CollectivePlanError", "before its gradients exist"),
    "gloo_budget": ("BudgetError", "runs on gloo"),
    "pipeline_p2p_moved": ("CollectivePlanError", "their launch is no choice"),
    "pipeline_p2p_budget": ("BudgetError", "add 'pp: {'max_ctas': 8, 'min_ctas': 8}'"),
    "no_such_bucket": ("CollectivePlanError", "bucket group(s)"),
    "no_chunk": ("CollectivePlanError", "names carry .chunk<c> exactly when there is a virtual pipeline"),
    "wrong_op": ("CollectivePlanError", "reduces gradients by all_reduce"),
    "param_gather": ("CollectivePlanError", "without --use-distributed-optimizer"),
    "overlap_off": ("CollectivePlanError", "add --overlap-grad-reduce"),
    "twice": ("CollectivePlanError", "more than once"),
    "gemm_overlap": ("CollectivePlanError", "add --tp-comm-overlap"),
    "not_ddp": ("CollectivePlanError", "not megatron-core's DistributedDataParallel"),
}


def test_plans_the_job_cannot_honour_are_refused_with_the_fix(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert set(report["refusals"]) == set(REFUSALS)
        for case, (kind, phrase) in REFUSALS.items():
            message = report["refusals"][case]
            assert message.startswith(kind + ":"), message
            assert phrase in message, message
        assert report["untouched_after_refusals"]
        assert report["overlap_off_accepted"]


def test_the_runner_follows_the_sessions_plan_point(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        runner = report["runner"]
        steps = {label: _steps(events)[0] for label, events in runner["steps"].items()}
        for label, plan in (
            ("point0", runner["early"]),
            ("point1", runner["late"]),
            ("rearmed", runner["early"]),
        ):
            expected = {action.collective: _hook_event(action.at) for action in plan}
            assert _launched_after(steps[label]) == expected, label
        megatron = _launched_after(_steps(report["baseline"])[0])
        assert _launched_after(steps["stopped"]) == megatron
        assert _launched_after(steps["refused"]) == megatron
        assert report["chunks_from_config"], (
            "the patched path finds the DDP chunks behind config.no_sync_func"
        )
        (line,) = runner["lines"]
        assert "collective actions are not applied (its clocks are)" in line
        assert "bucket group(s)" in line


@pytest.fixture(scope="module")
def grad_ready(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return spawn_world(grad_ready_world_worker, 2, tmp_path_factory.mktemp("grad-ready-world"))


def _inside(step: list[tuple], name: str) -> tuple | None:
    """The instruction running when ``name`` was launched (``None``: between instructions)."""
    running = None
    for event in step:
        if event[0] == "instruction_begin":
            running = event[1:]
        elif event[0] == "instruction_end":
            running = None
        elif event[0] == "collective" and event[1] == name:
            return running
    raise AssertionError(f"{name} was not launched")


def test_launches_megatron_makes_inside_the_backward_are_held_or_moved(
    grad_ready: list[dict[str, Any]],
) -> None:
    """Without a pipeline, from the second step on megatron-core launches every bucket inside the last
    backward, as its gradients become ready; a plan holds them to the backward's end, or launches them at the
    contract's earliest layer boundaries; the reduced gradients do not change."""
    for report in grad_ready:
        last = report["order"][-1]
        ids = (last.kind, last.microbatch, last.chunk)
        names = [name for name, *_ in report["layout"]]
        assert len(names) > 2
        baseline = _steps(report["baseline"])
        for step in baseline[1:]:  # the first batch launches in finish_grad_sync (no golden counts yet)
            assert all(_inside(step, name) == ids for name in names)
        for label in ("end", "earliest"):
            planned = report[label]
            expected = {action.collective: _hook_event(action.at) for action in planned["plan"]}
            for step in _steps(planned["events"]):
                assert _launched_after(step) == expected, label
            assert planned["same_grads"], label
        held = _steps(report["end"]["events"])[1]
        assert all(_inside(held, name) is None for name in names)
        assert any(
            marker[0][0] == "layer_backward"
            for marker in map(_hook_event, (a.at for a in report["earliest"]["plan"]))
        )
