"""Run a Megatron pretrain script with the ``--energy-*`` flags, on an unpatched megatron-core.

Usage (one process, or one per rank under torchrun)::

    python -m megatron_energy.launch pretrain_gpt.py <Megatron args> --energy-optimise [--energy-* ...]
    torchrun --nproc-per-node 8 -m megatron_energy.launch pretrain_gpt.py <Megatron args> --energy-optimise

The launcher takes its own flags out of the command line (anywhere after the launcher; the first other
argument is the script), refuses Megatron modes whose instructions cannot be observed (``megatron.modes``),
installs the unpatched-path hooks (``megatron.hooks.install_hooks``: timers proxy and P2P communicator swap;
with ``--cuda-graph-impl full_iteration`` also ``megatron.full_iteration``, which follows the graph's capture
and replays) feeding the listeners of ``build_listeners`` (with ``--energy-optimise`` also a
``megatron.collective_runner.CollectiveRunner``, which applies the running plan's collective actions to the
model captured from ``setup_model_and_optimizer``), and runs the script as ``__main__`` with ``sys.argv`` =
the script and Megatron's arguments, the script's folder first on ``sys.path`` (as ``python SCRIPT`` would,
and before megatron is imported, so a Megatron-LM checkout next to the script is the megatron that runs).
Without ``--energy-optimise`` and ``--energy-trace`` it only runs the script.

A command line it cannot run is refused before Megatron starts, in one line printed once
(``launch_errors``: a bad or misspelt ``--energy-*`` flag with the nearest one named, a missing script, a
refused mode, tensor or context parallelism without a GPU). With its flags, the launcher sets up the
package's logging (``megatron_energy.log``: ``--energy-log-level``, ``--energy-log-ranks``) and runs the
script with whole-line output and Megatron's argument list and known warnings in a file
(``launch_output``, unless ``--energy-show-megatron-log``).

A tree patched with ``patches/megatron-core-X.Y`` instead calls ``attach_to_training`` from Megatron's
``train()`` when the (then ordinary) ``--energy-*`` flags ask for it, with the exact ids from the patch.
"""

from __future__ import annotations

import argparse
import atexit
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from megatron_energy.config import ENERGY_FLAGS, EnergyArgumentParser, EnergyConfig, add_energy_args
from megatron_energy.energy_dir import megatron_output_path
from megatron_energy.events import ListenerFanout, ScheduleListener, TraceWriter
from megatron_energy.launch_errors import (
    PROG,
    LaunchError,
    missing_script,
    parallelism_without_gpu,
    refuse,
    unknown_energy_flag,
)
from megatron_energy.launch_output import rank_output
from megatron_energy.log import configure_logging
from megatron_energy.megatron.modes import UnsupportedModeError


class LauncherParser(EnergyArgumentParser):
    """The launcher's parser: a bad ``--energy-*`` flag raises :class:`LaunchError` (reported once)."""

    def error(self, message: str) -> NoReturn:
        """Raise the problem, for ``launch_errors.refuse`` to report, in place of usage and exit."""
        raise LaunchError(message)


def energy_parser() -> LauncherParser:
    """The launcher's parser: only the ``--energy-*`` flags (``--help`` after the script is Megatron's)."""
    parser = LauncherParser(
        prog=f"python -m {PROG}",
        usage="%(prog)s SCRIPT [Megatron args] [--energy-* flags]",
        description="Run a Megatron pretrain script with megatron_energy's hooks (no patch needed).",
        allow_abbrev=False,
        add_help=False,
    )
    add_energy_args(parser)
    return parser


def process_rank() -> tuple[int, int]:
    """This process's ``(rank, world_size)``: from torch.distributed once initialised, else torchrun's env."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank(), distributed.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def build_listeners(
    config: EnergyConfig, model_chunks: Callable[[], Sequence[Any] | None] | None = None
) -> list[ScheduleListener]:
    """The listeners this rank's hooks feed: the trace writer and the energy session, as the flags ask.

    Called before torch.distributed and Megatron are initialised on the launcher path, and from ``train()``
    after model setup on the patched path.

    Args:
        config: The ``--energy-*`` settings.
        model_chunks: Returns this rank's DDP model chunks: with the session, a
            ``megatron.collective_runner.CollectiveRunner`` after it applies the running plan's collective
            actions to them. ``None``: no collective runner.

    Returns:
        The listeners, possibly none.
    """
    listeners: list[ScheduleListener] = []
    if config.trace is not None:
        rank, world_size = process_rank()
        listeners.append(TraceWriter(config.trace, rank, world_size))
    if config.optimise:
        from megatron_energy.megatron.session_factory import create_session

        session = create_session(config)
        listeners.append(session)
        if model_chunks is not None:
            from megatron_energy.megatron.collective_runner import follow_session

            listeners.append(follow_session(session, model_chunks))
    return listeners


def close_listeners(listeners: Sequence[ScheduleListener]) -> None:
    """Call ``close()`` on every listener that has one (the trace file, the session's clock reset)."""
    for listener in listeners:
        close = getattr(listener, "close", None)
        if callable(close):
            close()


def attach_to_training(args: argparse.Namespace, model_config: Any) -> None:
    """Patched path: what the patched ``train()`` calls for ``--energy-optimise`` or ``--energy-trace``.

    Args:
        args: Megatron's parsed arguments, which carry the ``--energy-*`` flags on a patched tree.
        model_config: The config of model chunk 0 that the schedules read.

    Raises:
        UnsupportedModeError: Megatron runs in a mode whose instructions cannot be observed.
    """
    from megatron_energy.megatron.collective_runner import chunks_from_config
    from megatron_energy.megatron.console_log import leave_energy_records_to_their_handler
    from megatron_energy.megatron.hooks import attach_hooks
    from megatron_energy.megatron.modes import refused_in_args, require_supported

    require_supported(refused_in_args(args))
    config = EnergyConfig.from_args(args)
    configure_logging(config.log_level, config.log_ranks)
    leave_energy_records_to_their_handler()
    listeners = build_listeners(config, lambda: chunks_from_config(model_config))
    if listeners:
        attach_hooks(model_config, ListenerFanout(listeners))
        atexit.register(close_listeners, listeners)


def split_command(argv: Sequence[str]) -> tuple[EnergyConfig, str, list[str]]:
    """Split the launcher's command line into our settings, the script and Megatron's arguments.

    Args:
        argv: Everything after ``-m megatron_energy.launch``.

    Returns:
        ``(config, script, megatron_args)``.

    Raises:
        LaunchError: A bad or unknown ``--energy-*`` flag (naming the nearest known one), or no script.
    """
    parser = energy_parser()
    if not argv or argv[0] in ("-h", "--help"):
        if process_rank()[0] == 0:  # once per job, not once per rank
            parser.print_help()
        parser.exit(0 if argv else 2)
    namespace, rest = parser.parse_known_args(list(argv))
    unknown = unknown_energy_flag(rest, [option for flag in ENERGY_FLAGS.values() for option in flag.options])
    if unknown is not None:
        raise unknown
    if not rest or rest[0].startswith("-"):
        raise LaunchError("give the pretrain script first, e.g. pretrain_gpt.py, then its arguments")
    return EnergyConfig.from_args(namespace), rest[0], rest[1:]


def put_script_folder_first(script: str) -> None:
    """Put the script's folder first on ``sys.path``, as ``python SCRIPT`` does.

    Done before anything imports megatron, so a Megatron-LM checkout next to ``pretrain_gpt.py`` (its
    ``megatron/``, ``gpt_builders.py``, ``model_provider.py``) wins over an installed megatron-core exactly as
    it would without the launcher.
    """
    sys.path.insert(0, str(Path(script).resolve().parent))


def run_script(script: str, script_args: Sequence[str]) -> None:
    """Run ``script`` as ``__main__`` with ``sys.argv`` = the script and ``script_args``."""
    sys.argv = [script, *script_args]
    runpy.run_path(script, run_name="__main__")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m megatron_energy.launch``.

    Args:
        argv: The launcher's arguments; ``sys.argv[1:]`` when ``None``.

    Returns:
        The exit status (the script's own ``sys.exit`` propagates unchanged); 2 for a command line it
        refuses (``launch_errors``).
    """
    rank, _ = process_rank()
    try:
        config, script, megatron_args = split_command(sys.argv[1:] if argv is None else argv)
        if not (config.optimise or config.trace is not None):
            _require_script(script)
            put_script_folder_first(script)
            run_script(script, megatron_args)
            return 0
        settings = _runnable_settings(config, script, megatron_args)
    except (LaunchError, UnsupportedModeError) as problem:
        return refuse(problem, rank)
    configure_logging(config.log_level, config.log_ranks)
    aside = None if config.show_megatron_log else megatron_output_path(config.dir, rank)
    with rank_output(aside):
        _run_with_hooks(config, script, megatron_args, settings)
    return 0


def _require_script(script: str) -> None:
    """Raise the launcher's refusal of a training script that is not there."""
    problem = missing_script(script)
    if problem is not None:
        raise problem


def _runnable_settings(config: EnergyConfig, script: str, megatron_args: list[str]) -> argparse.Namespace:
    """Megatron's settings the launcher reads, once the command line is one it can run (else raise).

    Raises:
        UnsupportedModeError: Megatron runs in a mode whose instructions cannot be observed.
        LaunchError: No script there, or tensor or context parallelism without a GPU.
    """
    from megatron_energy.megatron.modes import read_megatron_settings, refused_in_argv, require_supported

    require_supported(refused_in_argv(megatron_args, config.mode if config.optimise else None))
    _require_script(script)
    settings = read_megatron_settings(megatron_args)
    if settings.tensor_model_parallel_size > 1 or settings.context_parallel_size > 1:
        import torch

        problem = parallelism_without_gpu(
            settings.tensor_model_parallel_size, settings.context_parallel_size, torch.cuda.is_available()
        )
        if problem is not None:
            raise problem
    return settings


def _run_with_hooks(
    config: EnergyConfig, script: str, megatron_args: list[str], settings: argparse.Namespace
) -> None:
    """Install the hooks and listeners the flags ask for, run the script, and take them out again."""
    from megatron_energy.megatron.console_log import leave_energy_records_to_their_handler
    from megatron_energy.megatron.modes import uses_full_iteration_graph

    put_script_folder_first(script)
    from megatron_energy.megatron.collective_runner import CapturedModel, capture_model
    from megatron_energy.megatron.hooks import install_hooks

    model: CapturedModel | None = None
    restore_model_setup: Callable[[], None] = lambda: None  # noqa: E731
    if config.optimise:  # the collective runner applies the plan to the model megatron-training builds
        model, restore_model_setup = capture_model()
    listeners = build_listeners(config, model)
    installation = install_hooks(
        ListenerFanout(listeners),
        microbatch_group_size=settings.microbatch_group_size_per_virtual_pipeline_stage,
        combined=settings.overlap_moe_expert_parallel_comm,
    )
    if uses_full_iteration_graph(settings):
        from megatron_energy.megatron.full_iteration import follow_full_iteration_graphs

        installation.on_uninstall(follow_full_iteration_graphs(installation.hooks))
    leave_energy_records_to_their_handler()  # megatron-training's root handler is set up by now
    try:
        run_script(script, megatron_args)
    finally:
        installation.uninstall()
        restore_model_setup()
        close_listeners(listeners)


if __name__ == "__main__":
    sys.exit(main())
