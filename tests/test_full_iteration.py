"""Full-iteration CUDA graphs on CPU: the flag accepted, boundaries from a capture, the refusals that remain.

A CPU cannot capture a CUDA graph, so the capture here runs megatron-core's real 1F1B schedule (PP=2, gloo)
through the launcher's hooks inside :class:`StandInGraphWrapper`, which keeps ``FullCudaGraphWrapper``'s
control flow (warm-up calls run the schedule, the next call captures it, later calls replay it: here they
run nothing) and its class attributes. The GPU run (``docs/results``) shows the same markers timing replays.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from megatron_harness import PipelineWorld, RecordingListener, spawn_world

from megatron_energy.events import CapturedStep
from megatron_energy.megatron.modes import refused_in_args, refused_in_argv
from megatron_energy.pipeline.schedule_orders import pipeline_orders

NUM_MICROBATCHES = 4
WARMUP_STEPS = 2
GRAPH = ["--cuda-graph-impl", "full_iteration"]


@pytest.mark.parametrize("mode", ["perseus", "kernel", "all"])
@pytest.mark.parametrize("spelling", [GRAPH, ["--cuda-graph-modules", "full_iteration"]])
def test_the_launcher_follows_full_iteration_graphs_in_the_clock_modes(
    mode: str, spelling: list[str]
) -> None:
    assert refused_in_argv(spelling, mode) == []


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("kareus", "collective launch points and communicator SM budgets are fixed in the graph"),
        (None, "a replayed graph runs none"),  # --energy-trace alone
    ],
)
def test_what_a_replayed_graph_cannot_carry_out_is_refused_with_the_way_out(
    mode: str | None, reason: str
) -> None:
    (refused,) = refused_in_argv(GRAPH, mode)
    assert reason in refused.reason
    assert refused.message().startswith(
        "megatron_energy cannot be used with --cuda-graph-impl full_iteration"
    )
    assert "Use " in refused.remedy or "Trace " in refused.remedy


def test_the_patched_path_still_refuses_full_iteration_graphs() -> None:
    (refused,) = refused_in_args(argparse.Namespace(cuda_graph_impl="full_iteration"))
    assert "on the patched path" in refused.flag and "python -m megatron_energy.launch" in refused.remedy


def test_following_graphs_wraps_megatrons_wrapper_until_restored() -> None:
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper

    from megatron_energy.megatron.full_iteration import follow_full_iteration_graphs
    from megatron_energy.megatron.schedule_hooks import ScheduleHooks

    original = FullCudaGraphWrapper.__call__
    restore = follow_full_iteration_graphs(ScheduleHooks(RecordingListener()))
    assert FullCudaGraphWrapper.__call__ is not original
    restore()
    assert FullCudaGraphWrapper.__call__ is original


class StandInGraphWrapper:
    """``FullCudaGraphWrapper``'s control flow without CUDA: warm-up calls run, one captures, the rest replay.

    Args:
        schedule: Runs one training (or, with ``forward_only``, evaluation) schedule.
        warmup_steps: Eager calls before the capture.
    """

    cuda_graph: ClassVar[dict[str, Any]] = {"training": None, "validation": None}
    curr_iteration: ClassVar[dict[str, int]] = {"training": 0, "validation": 0}

    def __init__(self, schedule: Callable[[bool], Any], warmup_steps: int) -> None:
        self.schedule = schedule
        self.cuda_graph_warmup_steps = warmup_steps

    def curr_iter(self, stage: str) -> int:
        return self.curr_iteration[stage]

    def __call__(self, forward_only: bool) -> None:
        stage = "validation" if forward_only else "training"
        if self.cuda_graph[stage] is None:
            self.schedule(forward_only)  # a warm-up step, or the capture
            if self.curr_iteration[stage] == self.cuda_graph_warmup_steps:
                self.cuda_graph[stage] = "captured"
        self.curr_iteration[stage] += 1


class GraphRecordingListener(RecordingListener):
    """Also keeps the graph events; the captured markers are kept as the spans' labels."""

    def on_unmeasured_step(self, step: int) -> None:
        self.events.append(("unmeasured_step", step))

    def on_graph_replay(self, captured: CapturedStep) -> None:
        spans = [(s.kind, s.microbatch, s.chunk, s.start, s.end) for s in captured.instructions]
        outside = [(s.kind, s.start, s.end) for s in captured.outside]
        self.events.append(("graph_replay", spans, outside))

    def on_outside_begin(self, name: str) -> None:
        self.events.append(("outside_begin", name))

    def on_outside_end(self, name: str) -> None:
        self.events.append(("outside_end", name))


def capture_and_replay(rank: int, world_size: int, payload: Any) -> dict:
    """Two warm-up steps, the capture, an evaluation and two replays of megatron-core's 1F1B schedule."""
    import torch
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.timers import Timers

    from megatron_energy.megatron.expected_order import ExpectedOrder, current_rank_order
    from megatron_energy.megatron.full_iteration import FullIterationFollower
    from megatron_energy.megatron.hooked_timers import HookedTimers
    from megatron_energy.megatron.schedule_hooks import ScheduleHooks
    from megatron_energy.megatron.traced_calls import traced_p2p_communicator

    world = PipelineWorld(2, None)
    listener = GraphRecordingListener()
    hooks = ScheduleHooks(listener)
    expected = ExpectedOrder(lambda: current_rank_order(NUM_MICROBATCHES))
    timers = HookedTimers(Timers(0, "minmax"), hooks, expected)
    world.config.timers = timers
    schedules.P2PCommunicator = traced_p2p_communicator(P2PCommunicator, hooks)
    counter = itertools.count()

    def schedule(forward_only: bool) -> None:
        if forward_only:
            with torch.no_grad():
                world.run(NUM_MICROBATCHES, forward_only=True)
            return
        world.run(NUM_MICROBATCHES)
        timers("all-grads-sync", log_level=1).start()  # where finalize_model_grads runs, inside the graph
        timers("all-grads-sync").stop()

    wrapper = StandInGraphWrapper(schedule, WARMUP_STEPS)
    follower = FullIterationFollower(hooks, marker=lambda: next(counter))
    calls = [False] * WARMUP_STEPS + [False, True, False, False]  # warm-up, capture, evaluation, 2 replays
    for forward_only in calls:
        with torch.enable_grad():
            follower(wrapper, lambda forward_only=forward_only: wrapper(forward_only), forward_only)
        if not forward_only:
            timers("optimizer", log_level=1).start()  # after the schedule, outside the graph
            timers("optimizer").stop()
    return {"pipeline_rank": world.pipeline_rank, "events": listener.events, "markers": next(counter)}


@pytest.mark.world
def test_a_capture_of_megatrons_schedule_marks_every_instruction_and_replays_hand_the_markers_over(
    tmp_path,
) -> None:
    results = spawn_world(capture_and_replay, 2, tmp_path)
    orders = pipeline_orders(2, NUM_MICROBATCHES)
    for result in results:
        events, rank = result["events"], result["pipeline_rank"]
        expected = [(i.kind, i.microbatch, i.chunk) for i in orders.steps(rank)]
        steps = [event for event in events if event[0] in ("step_begin", "step_end", "unmeasured_step")]
        # two eager steps, the capture (unmeasured, numbered), two replays; the evaluation fires nothing
        assert steps == [
            ("step_begin", 0),
            ("step_end", 0),
            ("step_begin", 1),
            ("step_end", 1),
            ("unmeasured_step", 2),
            ("step_begin", 3),
            ("step_end", 3),
            ("step_begin", 4),
            ("step_end", 4),
        ]
        eager = [event[1:] for event in events if event[0] == "instruction_begin"]
        assert eager == expected * WARMUP_STEPS, "only the warm-up steps fire instruction hooks"
        replays = [event for event in events if event[0] == "graph_replay"]
        assert len(replays) == 2 and replays[0] == replays[1], "every replay hands over the same markers"
        _, spans, outside = replays[0]
        assert [span[:3] for span in spans] == expected, (
            "one marker pair per instruction, in Megatron's order"
        )
        markers = [marker for span in spans for marker in span[3:]] + [
            m for span in outside for m in span[1:]
        ]
        assert len(set(markers)) == 2 * len(expected) + 2 == result["markers"], "markers made at capture only"
        assert all(start < end for *_, start, end in spans)
        assert [span[0] for span in outside] == ["grad-sync"]
        assert outside[0][1] > max(span[4] for span in spans), (
            "the gradient sync follows the last instruction"
        )
        # the optimizer step runs outside the graph: its hooks fire after every training call
        assert events.count(("outside_begin", "optimizer")) == WARMUP_STEPS + 3


@pytest.mark.parametrize(("impl", "settling"), [("none", 0), ("local", 4), ("full_iteration", 4)])
def test_the_session_starts_after_the_graph_warm_up_and_capture(
    impl: str, settling: int, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from megatron.training import global_vars

    from megatron_energy.config import EnergyConfig
    from megatron_energy.megatron.session_factory import DeferredSession

    args = argparse.Namespace(cuda_graph_impl=impl, cuda_graph_warmup_steps=3)
    monkeypatch.setattr(global_vars, "_GLOBAL_ARGS", args)
    listener = DeferredSession(EnergyConfig(optimise=True, dir=tmp_path))
    starts: list[int] = []
    monkeypatch.setattr(listener, "_start", lambda begun: starts.append(begun))
    for step in range(6):
        listener.on_step_begin(step)
    assert starts[:1] == [settling], "the first step that may build the session follows the capture"
