"""Start a world's zygote: the one process that forks a gloo world's ranks, megatron-core already imported.

A world's ranks are forked from one process, its zygote, so that they share one import of torch and
megatron-core (seconds of CPU per process). The zygote itself is forked from the test session's forkserver,
whose server imported everything once (``warm_imports``): a world then costs no import at all. The
forkserver's server never runs a torch operation (no OpenMP threads), so forking from it is safe. Against
another megatron tree (``megatron_root``, e.g. a patched copy) the zygote drops the installed megatron-core's
modules and imports that tree's instead (``use_megatron_tree``): torch and the rest, most of an import's
seconds, stay imported.

Either way the zygote runs in this process's environment as it is when the world starts (a forkserver's
children would otherwise inherit the server's, from when it started); ``multiprocessing`` already gives
them this process's working directory and ``sys.path``.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
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


def use_megatron_tree(root: str) -> None:
    """Import ``megatron`` from ``root`` from now on, in place of the installed megatron-core.

    The installed megatron's modules leave ``sys.modules``; the next ``import megatron...`` finds ``root``
    first on ``sys.path``. ``megatron_energy`` imports megatron inside functions only, so none of its
    modules keeps a reference to the installed tree.
    """
    for name in [name for name in sys.modules if name == "megatron" or name.startswith("megatron.")]:
        del sys.modules[name]
    sys.path.insert(0, root)


def _in_parent_environment(
    index: int, function: Callable[..., None], env: dict[str, str], megatron_root: str | None, args: tuple
) -> None:
    os.environ.clear()
    os.environ.update(env)
    if megatron_root is not None:
        use_megatron_tree(megatron_root)
    function(index, *args)


def start_zygote(
    function: Callable[..., None], args: tuple, megatron_root: Path | None = None, join: bool = True
) -> mp.ProcessContext | None:
    """Run ``function(0, *args)`` in a world's zygote process, forked from the session's forkserver.

    Args:
        function: A module-level function (pickled by reference).
        args: Its picklable arguments after the process index.
        megatron_root: A folder containing ``megatron/`` to import instead of the installed megatron-core.
        join: Wait for the zygote to end (re-raising its exception) before returning.

    Returns:
        The process context when ``join`` is false (``torch.multiprocessing.start_processes``), else ``None``.
    """
    _ensure_warm_forkserver()
    root = None if megatron_root is None else str(megatron_root)
    return mp.start_processes(
        _in_parent_environment,
        args=(function, dict(os.environ), root, args),
        nprocs=1,
        join=join,
        start_method="forkserver",
    )
