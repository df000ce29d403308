"""``megatron-energy patch {check,apply,revert}``: the megatron-core patch set on a Megatron tree.

The patch set makes ``--energy-*`` ordinary flags of every Megatron pretrain script and has the schedule
report exact microbatch and chunk ids. Without it, ``python -m megatron_energy.launch`` does the same job
on an unpatched tree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from megatron_energy.megatron import patching


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``patch`` command.

    Args:
        subparsers: The ``megatron-energy`` subcommand registry.
    """
    parser = subparsers.add_parser(
        "patch",
        help="check, apply or revert the megatron-core patch set",
        description=(
            f"Check, apply or revert patches/megatron-core-{patching.PATCHED_SERIES} on a Megatron tree. "
            "git apply is used: exact context or nothing, never fuzz."
        ),
    )
    parser.add_argument(
        "action",
        choices=("check", "apply", "revert"),
        help="check: report whether the set applies or is applied; apply/revert: all patches or none",
    )
    parser.add_argument(
        "--megatron-root",
        type=Path,
        default=None,
        metavar="DIR",
        help="the folder containing megatron/ (a Megatron-LM checkout); default: the installed megatron-core",
    )
    parser.set_defaults(func=run)


def _summary(action: str, status: patching.PatchStatus) -> str:
    where = f"megatron-core {status.version} at {status.root}"
    if status.fully_applied:
        if action == "check":
            return f"patch set already applied to {where}"
        return f"patch set applied to {where}"
    if status.nothing_applied and status.patches_in("conflict"):
        return (
            f"patch set not applied to {where} (nothing applied): {', '.join(status.conflict_files)} "
            "differ from the pinned release"
        )
    if status.nothing_applied:
        if action == "check":
            return f"patch set applies cleanly to {where}"
        return f"patch set not applied to {where}"
    return f"patch set partly applied to {where}"


def _advice(status: patching.PatchStatus) -> str | None:
    """What to do about a tree the set does not fully fit, or None when nothing needs doing."""
    if status.patches_in("conflict"):
        return (
            f"{', '.join(status.conflict_files)} neither take nor give back the patches cleanly; restore "
            f"them (reinstall megatron-core {status.version}, or `git checkout` them in a Megatron-LM "
            "checkout), then run `megatron-energy patch apply`"
        )
    if not status.nothing_applied and not status.fully_applied:
        return (
            "only part of the set is applied; run `megatron-energy patch apply` to complete it or "
            "`megatron-energy patch revert` to take it out"
        )
    return None


def run(args: argparse.Namespace) -> int:
    """Run ``patch check|apply|revert``.

    Args:
        args: The parsed command line.

    Returns:
        0 when the action succeeded (for ``check``: the set applies cleanly or is already applied), else 1.
    """
    try:
        root = args.megatron_root if args.megatron_root is not None else patching.installed_megatron_root()
        action = {"check": patching.check, "apply": patching.apply, "revert": patching.revert}[args.action]
        status = action(root)
    except patching.PatchError as error:
        print(f"megatron-energy patch {args.action}: {error}", file=sys.stderr)
        return 1
    print(_summary(args.action, status))
    print(status.describe())
    advice = _advice(status)
    if advice is not None:
        print(advice, file=sys.stderr)
        return 1
    return 0
