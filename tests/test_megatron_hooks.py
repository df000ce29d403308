"""Hooks observe megatron-core's real schedules exactly, on the launcher path and on the patched tree.

One 4-process gloo world per path runs no pipelining (DP=4), PP=4 1F1B, PP=2 (x DP=2) 1F1B and
PP=2 x VPP=2 interleaved, each for two training steps, one evaluation step (``forward_only=True`` under
``torch.no_grad()``) and a third training step. Each rank's observed (kind, microbatch, chunk) sequence
must equal ``pipeline_orders``.
"""

from __future__ import annotations

from collections import Counter

import pytest
from megatron_harness import PipelineWorld, RecordingListener, spawn_world

from megatron_energy.events import read_trace
from megatron_energy.pipeline.schedule_orders import pipeline_orders

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

NUM_MICROBATCHES = 8
SCENARIOS = {
    "pp1-no-pipelining": (1, None),
    "pp4-1f1b": (4, None),
    "pp2-1f1b": (2, None),
    "pp2-vpp2": (2, 2),
}


def _observe_with_timers_and_p2p_swap(world: PipelineWorld, listener: RecordingListener) -> None:
    """The launcher path: timers proxy on config.timers and the P2PCommunicator subclass swap."""
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.timers import Timers

    from megatron_energy.megatron.expected_order import ExpectedOrder, current_rank_order
    from megatron_energy.megatron.hooked_timers import HookedTimers
    from megatron_energy.megatron.schedule_hooks import ScheduleHooks
    from megatron_energy.megatron.traced_calls import traced_p2p_communicator

    hooks = ScheduleHooks(listener)
    # timing-log-level 0, Megatron's default: every schedule timer is a DummyTimer behind the proxy
    expected = ExpectedOrder(lambda: current_rank_order(NUM_MICROBATCHES))
    world.config.timers = HookedTimers(Timers(0, "minmax"), hooks, expected)
    schedules.P2PCommunicator = traced_p2p_communicator(P2PCommunicator, hooks)


def _observe_through_patch(world: PipelineWorld, listener: RecordingListener) -> None:
    """The patched path: the patched schedule calls config.instruction_hooks; no timers at all."""
    from megatron.core.pipeline_parallel import schedules

    from megatron_energy.megatron.hooks import attach_hooks

    assert "site-packages" not in schedules.__file__, schedules.__file__
    world.config.timers = None
    attach_hooks(world.config, listener)


def _trace_through_training_entry(trace: str) -> None:
    """What the patched ``train()`` does with ``--energy-trace``: ``attach_to_training(args, config)``."""
    import argparse

    from megatron_energy.launch import attach_to_training

    world = PipelineWorld(2)
    attach_to_training(argparse.Namespace(energy_trace=trace), world.config)
    world.run(NUM_MICROBATCHES)  # the trace file is line-buffered: complete without close()


def _attach_refusal() -> str:
    from megatron_energy.megatron.hooks import attach_hooks

    try:
        attach_hooks(object(), RecordingListener())
    except RuntimeError as refused:
        return str(refused)
    return ""


def observe_schedules(rank: int, world_size: int, payload: dict) -> dict:
    import torch

    path = payload["path"]
    observe = {"launcher": _observe_with_timers_and_p2p_swap, "patched": _observe_through_patch}[path]
    results = {}
    for name, (pipeline_size, virtual_size) in SCENARIOS.items():
        world = PipelineWorld(pipeline_size, virtual_size)
        listener = RecordingListener()
        observe(world, listener)
        world.run(NUM_MICROBATCHES)
        world.run(NUM_MICROBATCHES)
        with torch.no_grad():
            eval_losses = world.run(NUM_MICROBATCHES, forward_only=True)
        world.run(NUM_MICROBATCHES)
        results[name] = {
            "pipeline_rank": world.pipeline_rank,
            "events": listener.events,
            "eval_losses": eval_losses,
        }
    if path == "patched":
        _trace_through_training_entry(payload["trace"])
    else:
        results["attach_refusal"] = _attach_refusal()
    return results


@pytest.fixture(scope="module", params=["launcher", "patched"])
def observed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    root = request.getfixturevalue("patched_megatron_root") if request.param == "patched" else None
    result_dir = tmp_path_factory.mktemp(f"hooks-{request.param}")
    payload = {"path": request.param, "trace": str(result_dir / "trace.jsonl")}
    results = spawn_world(observe_schedules, 4, result_dir, payload=payload, megatron_root=root)
    for rank, result in enumerate(results):
        result["trace_file"] = result_dir / f"trace.jsonl.rank{rank}"
    return results


def _steps(events: list[tuple]) -> list[list[tuple]]:
    """Split a rank's events into steps, checking that nothing happens outside a step."""
    steps: list[list[tuple]] = []
    current: list[tuple] | None = None
    for event in events:
        if event[0] == "step_begin":
            assert current is None and event[1] == len(steps), event
            current = []
        elif event[0] == "step_end":
            assert current is not None and event[1] == len(steps), event
            steps.append(current)
            current = None
        else:
            assert current is not None, f"{event} outside a training step"
            current.append(event)
    assert current is None
    return steps


def _instructions(step: list[tuple]) -> list[tuple]:
    """The (kind, microbatch, chunk) of each instruction, checking begin/end pairing."""
    order = []
    running = None
    for event in step:
        if event[0] == "instruction_begin":
            assert running is None, f"{event} begins inside {running}"
            running = event[1:]
            order.append(running)
        elif event[0] == "instruction_end":
            assert event[1:] == running, f"{event} ends, but {running} is running"
            running = None
    assert running is None
    return order


def _p2p_directions(step: list[tuple]) -> Counter:
    ops = [event[1] for event in step if event[0] == "p2p_begin"]
    assert ops == [event[1] for event in step if event[0] == "p2p_end"]
    return Counter(direction for op in ops for direction in op.split("+"))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_rank_observes_megatrons_order_and_evaluation_fires_nothing(
    observed: list[dict], scenario: str
) -> None:
    pipeline_size, virtual_size = SCENARIOS[scenario]
    expected = pipeline_orders(pipeline_size, NUM_MICROBATCHES, virtual_size or 1)
    for rank, results in enumerate(observed):
        result = results[scenario]
        assert result["pipeline_rank"] == rank // (len(observed) // pipeline_size)
        steps = _steps(result["events"])
        assert len(steps) == 3, "two training steps, evaluation (silent), one more training step"
        for step in steps:
            assert _instructions(step) == [
                (i.kind, i.microbatch, i.chunk) for i in expected.stage(result["pipeline_rank"])
            ]
        if result["pipeline_rank"] == pipeline_size - 1:
            assert len(result["eval_losses"]) == NUM_MICROBATCHES


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_activation_and_gradient_send_and_receive_is_observed(
    observed: list[dict], scenario: str
) -> None:
    pipeline_size, virtual_size = SCENARIOS[scenario]
    num_chunks = virtual_size or 1
    for results in observed:
        result = results[scenario]
        stage = result["pipeline_rank"]
        # the interleaved schedule passes chunk c of the last stage on to chunk c+1 of the first (a ring)
        sent_forward = NUM_MICROBATCHES * (num_chunks - (stage == pipeline_size - 1))
        received_forward = NUM_MICROBATCHES * (num_chunks - (stage == 0))
        expected = {
            "send_next": sent_forward,
            "recv_prev": received_forward,
            "send_prev": received_forward,
            "recv_next": sent_forward,
        }
        for step in _steps(result["events"]):
            directions = _p2p_directions(step)
            assert {d: directions[d] for d in expected} == expected, (stage, directions)


def test_unpatched_tree_refuses_to_attach_patch_hooks(observed: list[dict]) -> None:
    if "attach_refusal" not in observed[0]:
        pytest.skip("only the unpatched (launcher) world checks this")
    assert all("is not patched" in result["attach_refusal"] for result in observed)


def test_patched_training_entry_traces_exact_ids(observed: list[dict]) -> None:
    if "attach_refusal" in observed[0]:
        pytest.skip("only the patched world runs attach_to_training")
    expected = pipeline_orders(2, NUM_MICROBATCHES)
    for rank, result in enumerate(observed):
        events = read_trace(result["trace_file"])
        begins = [
            (e["kind"], e["microbatch"], e["chunk"]) for e in events if e["event"] == "instruction_begin"
        ]
        assert begins == [(i.kind, i.microbatch, i.chunk) for i in expected.stage(rank // 2)]
        assert {e["rank"] for e in events} == {rank}
