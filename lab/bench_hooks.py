"""Host cost of the unpatched-path hooks: Megatron's timers call with and without our timers proxy.

Replays the timer calls one training step of Megatron makes (``'forward-backward'`` around the step,
``'forward-compute'`` / ``'backward-compute'`` start and stop per instruction) at the default
``--timing-log-level 0``, in the same process, on three timer objects:

- ``bare``: Megatron's ``Timers``;
- ``hooked``: ``HookedTimers`` around it feeding an empty ``ListenerFanout``, as the launcher installs it
  (the hooks' own cost);
- ``hooked+trace``: the same fanout holding a ``TraceWriter`` (the ``--energy-trace`` cost).

An *event* is one timer call plus its ``start()`` or ``stop()``. Reported figures are *measured* host
wall-clock time (``time.perf_counter_ns``), median over repeats. CPU only; no GPU is touched.

    python lab/bench_hooks.py [--instructions 512] [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from megatron.core.timers import Timers

from megatron_energy.events import ListenerFanout, TraceWriter
from megatron_energy.megatron.expected_order import ExpectedOrder
from megatron_energy.megatron.hooked_timers import HookedTimers
from megatron_energy.megatron.schedule_hooks import ScheduleHooks
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.pipeline.schedule_orders import pipeline_orders


def replay_step(timers: Any, order: Sequence[Instruction]) -> None:
    """Make the timer calls Megatron's schedule makes for one step with this instruction order."""
    timers("forward-backward", log_level=1).start(barrier=False)
    for *_, kind in order:
        name = "forward-compute" if kind == "forward" else "backward-compute"
        timers(name, log_level=2).start()
        timers(name).stop()
    timers("forward-backward").stop()


def median_event_us(timers: Any, order: Sequence[Instruction], repeats: int) -> float:
    """Median host time of one event, in microseconds, over ``repeats`` replayed steps."""
    events = 2 * len(order) + 2
    replay_step(timers, order)  # warm caches and the proxy's per-name wrappers
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        replay_step(timers, order)
        samples.append((time.perf_counter_ns() - start) / events / 1000.0)
    return statistics.median(samples)


def hooked(listener: Any, order: Sequence[Instruction]) -> HookedTimers:
    """Megatron's timers behind our proxy, walking ``order`` for ids."""
    return HookedTimers(Timers(0, "minmax"), ScheduleHooks(listener), ExpectedOrder(lambda: order))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--instructions", type=int, default=512, help="instructions per replayed step")
    parser.add_argument("--repeats", type=int, default=200, help="replayed steps per measurement")
    args = parser.parse_args()
    order = pipeline_orders(1, args.instructions // 2).stage(0)
    with tempfile.TemporaryDirectory() as folder:
        trace = TraceWriter(Path(folder) / "trace.jsonl")
        candidates: dict[str, Callable[[], Any]] = {
            "bare": lambda: Timers(0, "minmax"),
            "hooked": lambda: hooked(ListenerFanout([]), order),
            "hooked+trace": lambda: hooked(ListenerFanout([trace]), order),
        }
        medians = {name: median_event_us(make(), order, args.repeats) for name, make in candidates.items()}
        trace.close()
    bare = medians["bare"]
    print(
        f"per-event host cost, measured (perf_counter), median of {args.repeats} steps x {len(order)} instr."
    )
    for name, median in medians.items():
        print(
            f"  {name:<13} {median:8.3f} us/event   {median / bare:5.2f} x bare   (+{median - bare:.3f} us)"
        )


if __name__ == "__main__":
    main()
