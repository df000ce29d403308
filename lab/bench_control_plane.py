"""The plugin's control plane at scale: its collectives measured over gloo on 2-32 ranks, modelled at 1k-16k.

Forks a gloo world of N ranks on this machine (loopback only) for each N of ``--ranks`` (at most 32) and
times, on the session's own comms object (``runtime.control_plane.comms.TorchComms``) over a data-parallel
group of all N ranks, the median over ``--repeats`` barrier-aligned rounds (measured, ``perf_counter`` on
rank 0):

- ``pace link``: one link of the exchange of paces, a 2-float max all-reduce
(``runtime.control_plane.staged_exchange``);
- ``energy line``: one link of the energy line, its two fixed-size vectors, a sum and a max in flight together
  (``runtime.energy_log.log_aggregate``, ``runtime.control_plane.group_chain.reduce_over``);
- ``before: world gather+broadcast``: what the energy line ran before (every rank's figures and window
  gathered on rank 0 as objects, the scalars broadcast back), with ``torch.distributed`` directly.

Each is fitted as ``t = b x hops``, ``hops = 2 (N - 1)`` (a ring; least squares through the origin over the
measured medians): ``b`` is its cost per hop. Here, with up to 32 processes on a few shared cores, a hop is
mostly a context switch, so ``b`` is far above a datacenter network's 20-75 µs, and a vector of more than a
few floats takes every hop of the ring (a 2-float one skips most: gloo splits a vector into one segment per
rank). The modelled table prices the control plane at 1k, 4k and 16k ranks (Megatron-like shapes) with the
hop costs fitted here and with the 75 µs per hop the session assumes for K
(``runtime.control_plane.exchange_period.HOP_S``): an exchange of paces is one link over each of the
pipeline, tensor and data-parallel groups every K steps (K by the session's rule at that hop cost and
``--iteration-s``, each exchange held to half the millisecond), so its cost per step is the exchange's over
K; the energy line's chain over the same three groups costs more than its half at these sizes, so it runs
staged too, at most every K steps of its own (``runtime.energy_log.energy_logger``), whatever the log
interval. The table's last column of ours is the control plane's cost per step, both exchanges together.
Before, each step ran one all-reduce over the world and each log interval a world gather and broadcast. Every
figure says measured or modelled.

    python lab/bench_control_plane.py [--ranks 2,4,8,16,32] [--repeats 30] [--iteration-s 1.0]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from megatron_energy.runtime.control_plane.comms import GROUPS, TorchComms
from megatron_energy.runtime.control_plane.exchange_period import (
    EXCHANGE_BUDGET_S,
    HOP_S,
    all_reduce_hops,
    exchange_cost_s,
    exchange_period,
)
from megatron_energy.runtime.control_plane.group_chain import reduce_over
from megatron_energy.runtime.energy_log.energy_line import StageEnergy
from megatron_energy.runtime.energy_log.log_aggregate import interval_vectors
from megatron_energy.runtime.energy_log.log_window import WINDOW_ITERS, RankWindow

MAX_RANKS = 32
"""The most ranks one world may fork here (the machine's cores are shared)."""
TIMEOUT_S = 120
"""Longest wait of one gloo collective, and of one world's whole run."""
OPERATIONS = ("pace link", "energy line", "before: world gather+broadcast")
SHAPES = ((8, 8, 16), (8, 8, 64), (16, 8, 128))
"""(PP, TP, DP) of the modelled jobs: 1,024, 4,096 and 16,384 ranks."""


def _window_figures(rank: int) -> StageEnergy:
    """A rank's figures at a log interval with a full window (what the energy line carries)."""
    window = RankWindow(0, tuple([300.0 + rank] * WINDOW_ITERS), tuple([1.0] * WINDOW_ITERS))
    return StageEnergy(0, 300.0, 290.0, 1.0, window)


def _operations(comms: TorchComms, rank: int) -> dict[str, Callable[[], Any]]:
    """The timed operations of one rank (see the module docstring)."""
    figures = _window_figures(rank)

    def before() -> None:
        gathered: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(figures, gathered, dst=0)
        dist.broadcast_object_list([{"energy/j_per_iter_total": 1.0} if rank == 0 else None], src=0)

    return {
        "pace link": lambda: comms.start_all_reduce([1.0, -1.0], "max", "data").wait(),
        "energy line": lambda: reduce_over(comms, GROUPS, *interval_vectors(figures, 1, WINDOW_ITERS - 1)),
        "before: world gather+broadcast": before,
    }


def _rank(rank: int, world: int, port: int, repeats: int, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    alone = dist.new_group([rank], use_local_synchronization=True)
    comms = TorchComms({"pipeline": alone, "tensor": alone, "data": dist.group.WORLD})
    medians: dict[str, float] = {}
    for name, operation in _operations(comms, rank).items():
        operation()  # warm the connections
        samples = []
        for _ in range(repeats):
            dist.barrier()
            began = time.perf_counter()
            operation()
            samples.append(time.perf_counter() - began)
        medians[name] = statistics.median(samples)
    if rank == 0:
        Path(out).write_text(json.dumps(medians))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure(world: int, repeats: int) -> dict[str, float]:
    """The medians of rank 0 in a forked gloo world of ``world`` ranks (seconds, measured)."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "medians.json")
        context = mp.start_processes(
            _rank, args=(world, _free_port(), repeats, out), nprocs=world, join=False, start_method="fork"
        )
        deadline = time.monotonic() + TIMEOUT_S
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"the {world}-rank world ran past {TIMEOUT_S} s")
        return json.loads(Path(out).read_text())


def fit_hop_s(worlds: Sequence[int], times_s: Sequence[float]) -> float:
    """Seconds per hop: least squares of ``times_s`` against ``2 (N - 1)`` hops, through the origin."""
    hops = [all_reduce_hops(world) for world in worlds]
    return sum(t * h for t, h in zip(times_s, hops, strict=True)) / sum(h * h for h in hops)


def modelled_rows(hops_s: dict[str, float], iteration_s: float) -> list[str]:
    """The modelled table: per shape and hop cost, the exchange, K, per step, the energy line, and before.

    At 75 µs every operation takes 75 µs a hop; with this machine's fit each takes its own fitted cost.
    """
    rows = []
    for pipeline, tensor, data in SHAPES:
        world, sizes = pipeline * tensor * data, (pipeline, tensor, data)
        for label, hop_of in (
            ("fitted here", hops_s),
            (f"{1e6 * HOP_S:.0f} µs", dict.fromkeys(hops_s, HOP_S)),
        ):
            exchange_s = exchange_cost_s(sizes, hop_of["pace link"])
            period = exchange_period(sizes, iteration_s, hop_s=hop_of["pace link"])
            line_s = exchange_cost_s(sizes, hop_of["energy line"])
            # at a log interval of 1: every step when the chain fits its share, else staged every K steps
            staged = line_s > EXCHANGE_BUDGET_S
            line_period = exchange_period(sizes, iteration_s, hop_s=hop_of["energy line"]) if staged else 1
            per_step_s = exchange_s / period + line_s / line_period
            before_step_s = exchange_cost_s([world], hop_of["pace link"])
            before_line_s = exchange_cost_s([world], hop_of[OPERATIONS[2]])
            rows.append(
                f"  {world:>6} PP{pipeline:<2} TP{tensor} DP{data:<4} {label:>11} | "
                f"{1e3 * exchange_s:8.2f} ms {period:>4} {1e3 * exchange_s / period:8.3f} ms | "
                f"{1e3 * line_s:8.2f} ms {line_period:>4} {1e3 * line_s / line_period:8.3f} ms | "
                f"{1e3 * per_step_s:8.3f} ms | "
                f"{1e3 * before_step_s:9.1f} ms {1e3 * before_line_s:9.1f} ms"
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ranks", default="2,4,8,16,32", help=f"world sizes to measure (at most {MAX_RANKS})"
    )
    parser.add_argument("--repeats", type=int, default=30, help="timed rounds per operation and world")
    parser.add_argument("--iteration-s", type=float, default=1.0, help="the modelled job's iteration time")
    args = parser.parse_args(argv)
    worlds = sorted({int(size) for size in args.ranks.split(",")})
    if not worlds or worlds[0] < 2 or worlds[-1] > MAX_RANKS or len(worlds) < 2:
        parser.error(f"--ranks needs at least two sizes between 2 and {MAX_RANKS}")
    print(f"measured over gloo on this machine (loopback, forked ranks, median of {args.repeats} rounds):")
    print("   ranks " + "".join(f"{name:>32}" for name in OPERATIONS))
    measured = {}
    for world in worlds:
        measured[world] = measure(world, args.repeats)
        print(f"  {world:>6} " + "".join(f"{1e3 * measured[world][name]:>29.3f} ms" for name in OPERATIONS))
        sys.stdout.flush()
    hops_s = {name: fit_hop_s(worlds, [measured[world][name] for world in worlds]) for name in OPERATIONS}
    print("fit of the measured points, t = b x 2(N-1) hops:")
    for name, hop_s in hops_s.items():
        print(f"  {name:>32}: b = {1e6 * hop_s:.1f} µs per hop")
    print(
        f"modelled at scale ({args.iteration_s:g} s iterations; K by the session's rule, "
        "runtime.control_plane.exchange_period, at that hop cost: the session assumes "
        f"{1e6 * HOP_S:.0f} µs; the energy line at --log-interval 1; all modelled):"
    )
    print(
        "   ranks shape             hop cost |  paces: exchange K  per step | energy line: chain K  per step"
        " | ours per step | before: per step, per log interval"
    )
    for row in modelled_rows(hops_s, args.iteration_s):
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
