"""Run the energy launcher on the ranks of a gloo world, as ``torch.distributed.run`` runs it on a cluster.

``torch.distributed.run`` starts every rank as ``python -m megatron_energy.launch ARGS`` with the
rendezvous in its environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``):
each rank is a fresh interpreter that imports torch and megatron-core again (~10 s of CPU). The demo's
test runs that command itself (``demo_run``); the other launcher tests run the same entry point,
``launch.main``, on ranks forked from a world's zygote (``megatron_harness.spawn_world``) with that
environment: the training script joins the gloo world itself, as under ``torch.distributed.run``, and each
rank's output goes to its own log.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from megatron_harness import TINY_GPT_SCRIPT, spawn_world


@dataclass(frozen=True)
class LauncherRun:
    """The exit status of every rank, and where the ranks ran."""

    statuses: tuple[int, ...]
    folder: Path

    def log(self, rank: int) -> Path:
        """Everything ``rank`` printed (standard output and error)."""
        return self.folder / f"rank{rank}.log"

    @property
    def output(self) -> str:
        """Every rank's output, rank after rank."""
        return "".join(self.log(rank).read_text() for rank in range(len(self.statuses)))


def launcher_rank(rank: int, _world_size: int, payload: tuple[list[str], str, list[str]]) -> int:
    """A world's worker: ``python -m megatron_energy.launch ARGV`` in ``folder``, ``sys_path`` put first.

    Returns:
        The launcher's exit status (the script's ``sys.exit`` code included).
    """
    argv, folder, sys_path = payload
    os.chdir(folder)
    sys.path[:0] = sys_path  # as PYTHONPATH puts them first
    with open(Path(folder) / f"rank{rank}.log", "w", buffering=1) as log:
        for stream in (1, 2):  # what torch and gloo print, too
            os.dup2(log.fileno(), stream)
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            from megatron_energy import launch

            try:
                return launch.main(argv)
            except SystemExit as exit_:  # as the interpreter turns it into a status
                return 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1


def run_launcher(
    argv: Sequence[str], world_size: int, folder: Path, sys_path: Sequence[Path] = ()
) -> LauncherRun:
    """Run the launcher with ``argv`` on ``world_size`` forked ranks (see the module docstring).

    Args:
        argv: The launcher's arguments: the training script, Megatron's and the ``--energy-*`` ones.
        world_size: Number of ranks.
        folder: The ranks' working folder, which gets their logs (``rankN.log``).
        sys_path: Folders put first on each rank's ``sys.path`` (where ``PYTHONPATH`` would name them).
    """
    payload = (list(argv), str(folder), [str(path) for path in sys_path])
    statuses = spawn_world(launcher_rank, world_size, folder / "results", payload, join_group=False)
    return LauncherRun(tuple(statuses), folder)


def traced_plan_argv(megatron_args: Sequence[str], folder: Path) -> list[str]:
    """The tiny GPT's launcher command that traces (``folder/trace.jsonl``) and plans on simulated H100s.

    It profiles two clocks (1980 and 1500 MHz, one step each) and keeps the job's files in ``folder/energy``.
    """
    return [
        str(TINY_GPT_SCRIPT), *megatron_args, "--energy-trace", str(folder / "trace.jsonl"),
        "--energy-optimise", "--energy-backend", "simulated", "--energy-gpu-spec", "h100-sxm",
        "--energy-freq-grid", "1980,1500", "--energy-profile-iters", "1",
        "--energy-dir", str(folder / "energy"),
    ]  # fmt: skip
