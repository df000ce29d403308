"""``megatron-energy clocks status|reset``: GPU clocks and leases a killed job left behind, and their reset.

``status`` lists this machine's GPUs with their SM and memory clocks now against their maxima (read-only,
NVML through zeus; on a machine without a GPU library, that there is none) and every clock lease in the run
directory: the GPU, the clocks locked, each owner and whether it still runs. ``reset`` resets what the stale
leases (written here, no owner running) say a dead job left locked, the way the plugin's next start would
(``dvfs.leftover_clocks``): a dry run by default that says what it would reset; ``--apply`` acts, and refuses
without permission to set clocks, saying why, as the plugin does. A lease whose job still runs is never
touched. Exit status 0, or 1 when a reset failed or was refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from megatron_energy.dvfs.lease import RUN_DIR_ENV, lease_path, run_dir
from megatron_energy.dvfs.leftover_clocks import (
    GpuClocks,
    Lease,
    MachineGpus,
    read_gpu_clocks,
    read_leases,
    reset_leftovers,
    simulated_clocks,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``clocks`` subcommand."""
    parser = subparsers.add_parser(
        "clocks",
        help="show (status) or reset (reset) GPU clocks and clock leases a killed job left behind",
    )
    parser.add_argument(
        "action", choices=("status", "reset"), help="status: list; reset: reset the leftovers"
    )
    parser.add_argument(
        "--apply",
        action="store_true",
        help="reset: act (default: a dry run that says what it would reset)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help=f"the folder of the clock leases (default: ${RUN_DIR_ENV}, else the plugin's run directory)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the status, or reset the leftovers; see the module docstring."""
    folder = args.run_dir if args.run_dir is not None else run_dir()
    leases, unreadable = read_leases(folder)
    machine = MachineGpus.open()
    if args.action == "status":
        for line in status_lines(folder, leases, unreadable, machine):
            print(line)
        return 0
    actions = reset_leftovers(leases, machine.gpus, args.apply, folder)
    for action in actions:
        print(action.line())
    if not args.apply and any(action.outcome.startswith("would") for action in actions):
        print("dry run: nothing was changed; `megatron-energy clocks reset --apply` does it")
    if not actions:
        print(f"no clock leases in {folder}: nothing to reset")
    return 1 if any(action.outcome == "failed" for action in actions) else 0


def status_lines(
    folder: Path, leases: list[Lease], unreadable: list[Path], machine: MachineGpus
) -> list[str]:
    """The ``status`` output: the GPUs' clocks, then the leases."""
    lines = ["GPUs (clocks read through NVML, nothing set):"]
    if machine.gpus is None:
        lines.append(f"  no GPUs here ({machine.why_none}); leases only")
    else:
        held = {lease.path: lease for lease in leases}
        for clocks in read_gpu_clocks(machine.gpus):
            lease = held.get(lease_path(machine.gpus, clocks.index, folder))
            state = "no lease" if lease is None else f"lease {lease.path.name}, {_state(lease)}"
            lines.append(f"  {_clocks(clocks)}; {state}")
    lines.append(f"clock leases in {folder}:")
    if not leases and not unreadable:
        lines.append("  none: no job of the plugin holds or left a GPU's clocks locked here")
    for lease in leases:
        lines.append(f"  {lease.path.name}: {lease.backend} GPU {lease.index} ({lease.gpu}): {_state(lease)}")
        lines.append(f"    {lease.describe()}")
        simulated = simulated_clocks(lease)
        if simulated is not None:
            lines.append(f"    {_clocks(simulated)}")
    lines += [f"  {path.name}: unreadable, left alone" for path in unreadable]
    if any(lease.stale for lease in leases):
        lines.append("stale leases: `megatron-energy clocks reset` says what it would reset, --apply resets")
    return lines


def _state(lease: Lease) -> str:
    """Whether the lease's job runs, died (stale) or cannot be checked here."""
    if not lease.on_this_host:
        return f"written on {lease.host}, not checked here"
    return "stale: its job died with the clocks locked" if lease.stale else "held by a running job"


def _clocks(clocks: GpuClocks) -> str:
    """``GPU 0 NVIDIA H200: SM 1980 of 1980 MHz, memory 3201 of 3201 MHz (measured)``."""
    memory = (
        "" if clocks.memory_mhz is None else f", memory {clocks.memory_mhz} of {_mhz(clocks.max_memory_mhz)}"
    )
    locked = "" if clocks.locked_sm_mhz is None else f", SM locked at {clocks.locked_sm_mhz} MHz"
    return (
        f"GPU {clocks.index} {clocks.name}: SM {_mhz(clocks.sm_mhz, unit=False)} of {_mhz(clocks.max_sm_mhz)}"
        f"{memory}{locked} ({clocks.source})"
    )


def _mhz(value: int | None, unit: bool = True) -> str:
    """A clock in MHz, or ``?`` when it could not be read."""
    if value is None:
        return "?"
    return f"{value} MHz" if unit else str(value)
