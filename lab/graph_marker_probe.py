"""Whether markers captured in a CUDA graph time its replays (read-only; one GPU, a few seconds).

``megatron.full_iteration`` times replayed training steps by CUDA events recorded with ``external=True``
while the step is captured; each becomes an event-record node of the graph. This probe checks that on the
GPU at hand, with the mechanism the runtime uses (``runtime.cuda_timer``: a plain start event before the
replay, the captured markers, a plain event after it):

1. four segments of bf16 matmuls (1, 2, 3 and 4 products of 4096^3) are timed eagerly with plain events;
2. the same segments are captured into one graph with an external marker at each boundary, and the graph is
   replayed ``--replays`` times; after each replay (and before the next), every segment's time is read from
   the markers, and its start offset from the plain start event;
3. prints, per segment, the eager time and the median replayed time (measured, CUDA events) and their ratio,
   and whether a replay's markers were all read as completed with increasing offsets.

    python lab/graph_marker_probe.py --replays 20
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()
    import torch

    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    segments = (1, 2, 3, 4)

    def run(marker: Callable[[], Any]) -> list[Any]:
        marks = [marker()]
        for count in segments:
            for _ in range(count):
                torch.matmul(a, b, out=out)
            marks.append(marker())
        return marks

    def plain() -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def external() -> Any:
        event = torch.cuda.Event(enable_timing=True, external=True)
        event.record()
        return event

    for _ in range(3):
        run(plain)
    torch.cuda.synchronize()
    eager: list[list[float]] = [[] for _ in segments]
    for _ in range(args.replays):
        marks = run(plain)
        marks[-1].synchronize()
        for i in range(len(segments)):
            eager[i].append(marks[i].elapsed_time(marks[i + 1]))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = run(external)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    replayed: list[list[float]] = [[] for _ in segments]
    ordered = True
    for _ in range(args.replays):
        start = plain()
        graph.replay()
        done = plain()
        done.synchronize()
        offsets = [start.elapsed_time(mark) for mark in captured]
        ordered = ordered and offsets == sorted(offsets) and offsets[0] >= 0.0
        for i in range(len(segments)):
            replayed[i].append(captured[i].elapsed_time(captured[i + 1]))
    print(
        f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.replays} replays (measured)"
    )
    for i, count in enumerate(segments):
        e, r = statistics.median(eager[i]), statistics.median(replayed[i])
        print(f"segment {i} ({count} matmuls): eager {e:.3f} ms, replayed {r:.3f} ms, ratio {r / e:.3f}")
    print(f"replay offsets from the plain start event increase and are non-negative: {ordered}")
    return 0 if ordered else 1


if __name__ == "__main__":
    raise SystemExit(main())
