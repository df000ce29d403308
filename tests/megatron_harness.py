"""Run megatron-core's real pipeline schedules on CPU in the tests: gloo worlds of forked ranks.

``spawn_world`` starts one process, the world's zygote (``zygote.start_zygote``: forked from the session's
forkserver, which imported torch and megatron-core once; against another megatron tree it imports that
tree's megatron instead), that installs the CPU shims and forks N ranks (a free ``MASTER_PORT`` per world);
each rank joins the gloo world (or leaves that to its worker, as a training script does), runs a worker
function, and its (picklable) result comes back to the parent; the ranks leave the world together. Inside a
worker, ``PipelineWorld`` builds megatron-core's parallel state and a tiny ``GPTModel`` split into pipeline
stages and virtual-pipeline chunks.

The tiny GPT, its CPU shims and its pretrain script live in ``megatron_energy.demo_model`` (the demo's
training job); this module re-exports them for the tests, and the launcher tests run that script
(``launcher_world``).

Workers must live in modules that do not import ``megatron`` at import time: a worker may run against a
patched copy of megatron-core that the zygote imports in place of the installed one.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from zygote import start_zygote

from megatron_energy.demo_model import TRAINING_SCRIPT
from megatron_energy.demo_model.cpu_shims import install_cpu_shims, warnings_silenced
from megatron_energy.demo_model.tiny_gpt import PipelineWorld, TinyGpt, gpt_forward_step

TINY_GPT_SCRIPT = TRAINING_SCRIPT
"""The CPU pretrain script the demo runs under ``torchrun`` and the launcher tests on forked ranks."""

__all__ = [
    "COLLECTIVE_TIMEOUT_S",
    "TINY_GPT_SCRIPT",
    "PipelineWorld",
    "RecordingListener",
    "TinyGpt",
    "free_port",
    "gpt_forward_step",
    "install_cpu_shims",
    "spawn_world",
    "warnings_silenced",
]

Worker = Callable[[int, int, Any], Any]

COLLECTIVE_TIMEOUT_S = 180
"""Longest wait of a gloo collective in the test worlds."""


def free_port() -> int:
    """A TCP port that was free a moment ago, for ``MASTER_PORT``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(
    rank: int, world_size: int, port: int, worker: Worker, payload: Any, result_dir: str, join_group: bool
) -> None:
    os.environ.update(  # the rendezvous torch.distributed.run gives each rank
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    if join_group:
        # a short collective timeout turns a rank that stopped joining a collective into a failure, not a hang
        torch.distributed.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        )
    try:
        result = worker(rank, world_size, payload)
        (Path(result_dir) / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
        if torch.distributed.is_initialized():
            # gloo fails a peer's group set-up when a rank tears its groups down meanwhile: leave together
            torch.distributed.barrier()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _zygote(
    _index: int, world_size: int, worker: str, payload: Any, result_dir: str, join_group: bool
) -> None:
    """Import megatron-core (a patched tree's; else the forkserver's import), then fork the ranks."""
    install_cpu_shims()
    with warnings_silenced():  # warm the imports the forked ranks inherit
        import megatron.core.models.gpt
        import megatron.core.pipeline_parallel.schedules  # noqa: F401

    module_name, _, function_name = worker.partition(":")
    function = getattr(__import__(module_name, fromlist=[function_name]), function_name)
    mp.start_processes(
        _rank_main,
        args=(world_size, free_port(), function, payload, result_dir, join_group),
        nprocs=world_size,
        join=True,
        start_method="fork",
    )


def spawn_world(
    worker: Worker,
    world_size: int,
    result_dir: Path,
    payload: Any = None,
    megatron_root: Path | None = None,
    join_group: bool = True,
) -> list[Any]:
    """Run ``worker(rank, world_size, payload)`` on ``world_size`` gloo processes; return every rank's result.

    One zygote process is started (``zygote.start_zygote``), forked from the session's forkserver, which
    imported torch and megatron-core already; it installs the CPU shims and forks the ranks. Against
    ``megatron_root`` the zygote imports that tree's megatron in place of the installed one (only
    megatron's own modules: torch stays imported). An exception on any rank is re-raised here with its
    traceback.

    Args:
        worker: A module-level function; its module must not import megatron at import time.
        world_size: Number of processes.
        result_dir: An empty folder where each rank leaves its pickled result.
        payload: A picklable argument passed to every rank.
        megatron_root: A folder containing ``megatron/`` to import instead of the installed megatron-core.
        join_group: Join the gloo world before the worker runs (and leave it after); ``False`` leaves that
            to the worker, as a training script started by ``torch.distributed.run`` does.

    Returns:
        The workers' return values, by rank.
    """
    result_dir.mkdir(parents=True, exist_ok=True)
    reference = f"{worker.__module__}:{worker.__qualname__}"
    start_zygote(_zygote, (world_size, reference, payload, str(result_dir), join_group), megatron_root)
    return [pickle.loads((result_dir / f"rank{rank}.pkl").read_bytes()) for rank in range(world_size)]


class RecordingListener:
    """A ``ScheduleListener`` that keeps every event as a tuple, for assertions in the parent process."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_step_begin(self, step: int) -> None:
        self.events.append(("step_begin", step))

    def on_step_end(self, step: int) -> None:
        self.events.append(("step_end", step))

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        self.events.append(("instruction_begin", kind, microbatch, chunk))

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        self.events.append(("instruction_end", kind, microbatch, chunk))

    def on_p2p_begin(self, op: str) -> None:
        self.events.append(("p2p_begin", op))

    def on_p2p_end(self, op: str) -> None:
        self.events.append(("p2p_end", op))
