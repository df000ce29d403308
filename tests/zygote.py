"""Start a world's zygote: the one process that forks a gloo world's ranks, megatron-core already imported.

A world's ranks are forked from one process, its zygote, so that they share one import of torch and
megatron-core (seconds of CPU per process). Against the installed megatron-core, the zygote itself is forked
from the test session's forkserver, whose server imported everything once (``warm_imports``): a world then
costs no import at all. The forkserver's server never runs a torch operation (no OpenMP threads), so forking
from it is safe. Against another megatron tree (``megatron_root``, e.g. a patched copy) the zygote is a fresh
interpreter (``spawn``) that imports that tree.

Either way the zygote runs in this process's environment as it is when the world starts (a forkserver's
children would otherwise inherit the server's, from when it started); ``multiprocessing`` already gives
them this process's working directory and ``sys.path``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from multiprocessing import forkserver
from pathlib import Path

import torch.multiprocessing as mp

WARM_MODULES = ["warm_imports"]
"""What the forkserver's server imports once (``tests/warm_imports.py``)."""

TESTS = Path(__file__).resolve().parent


def _ensure_warm_forkserver() -> None:
    """Start the session's forkserver, if not yet running, with this folder importable by its server.

    The server is a fresh interpreter that finds modules on ``PYTHONPATH`` (Python 3.12's forkserver
    ignores the parent's ``sys.path`` for its preload, and fails a preload silently).
    """
    multiprocessing.get_context("forkserver").set_forkserver_preload(WARM_MODULES)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), before]))
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def _in_parent_environment(
    index: int, function: Callable[..., None], env: dict[str, str], args: tuple
) -> None:
    os.environ.clear()
    os.environ.update(env)
    function(index, *args)


def start_zygote(
    function: Callable[..., None], args: tuple, warm: bool = True, join: bool = True
) -> mp.ProcessContext | None:
    """Run ``function(0, *args)`` in a world's zygote process.

    Args:
        function: A module-level function (pickled by reference).
        args: Its picklable arguments after the process index.
        warm: Fork the zygote from the session's forkserver, which imported the installed megatron-core;
            ``False`` for a fresh interpreter (to import another megatron tree).
        join: Wait for the zygote to end (re-raising its exception) before returning.

    Returns:
        The process context when ``join`` is false (``torch.multiprocessing.start_processes``), else ``None``.
    """
    if warm:
        _ensure_warm_forkserver()
    return mp.start_processes(
        _in_parent_environment,
        args=(function, dict(os.environ), args),
        nprocs=1,
        join=join,
        start_method="forkserver" if warm else "spawn",
    )
