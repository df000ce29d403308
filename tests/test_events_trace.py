"""``ListenerFanout`` and the ``--energy-trace`` writer."""

from __future__ import annotations

from pathlib import Path

from megatron_harness import RecordingListener

from megatron_energy.events import (
    ListenerFanout,
    ScheduleListener,
    TraceWriter,
    read_trace,
    trace_path_for_rank,
)


def _one_step(listener: ScheduleListener) -> None:
    listener.on_step_begin(3)
    listener.on_p2p_begin("recv_prev")
    listener.on_p2p_end("recv_prev")
    listener.on_instruction_begin("forward", 1, 0)
    listener.on_instruction_end("forward", 1, 0)
    listener.on_step_end(3)


def test_fanout_forwards_every_event_to_every_listener_in_order() -> None:
    first, second = RecordingListener(), RecordingListener()
    fanout = ListenerFanout([first, second])
    assert isinstance(fanout, ScheduleListener)
    _one_step(fanout)
    assert first.events == second.events
    assert [event[0] for event in first.events] == [
        "step_begin", "p2p_begin", "p2p_end", "instruction_begin", "instruction_end", "step_end"
    ]  # fmt: skip


def test_each_rank_of_a_multi_process_job_gets_its_own_file() -> None:
    assert trace_path_for_rank(Path("out/trace.jsonl"), 0, 1) == Path("out/trace.jsonl")
    assert trace_path_for_rank(Path("out/trace.jsonl"), 3, 8) == Path("out/trace.jsonl.rank3")


def test_trace_writer_writes_one_json_line_per_event(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "sub" / "trace.jsonl", rank=1, world_size=2)
    _one_step(writer)
    # line-buffered: complete on disk before close (a crashed run keeps its events)
    events = read_trace(tmp_path / "sub" / "trace.jsonl.rank1")
    writer.close()
    writer.on_step_begin(4)
    assert read_trace(writer.path) == events, "events after close() are dropped"
    assert [e["event"] for e in events] == [
        "step_begin", "p2p_begin", "p2p_end", "instruction_begin", "instruction_end", "step_end"
    ]  # fmt: skip
    assert all(e["rank"] == 1 and e["step"] == 3 for e in events)
    assert events[1]["op"] == "recv_prev" and events[1]["kind"] is None
    assert (events[3]["kind"], events[3]["microbatch"], events[3]["chunk"]) == ("forward", 1, 0)
    assert [e["host_time_s"] for e in events] == sorted(e["host_time_s"] for e in events)
