"""Megatron modes whose pipeline instructions cannot be observed, refused with the flag and what to do.

Per-instruction clocks need every forward and backward pass of a training step to be reported with its
microbatch. These Megatron settings break that, so ``--energy-optimise`` (and ``--energy-trace``) refuse them:

- ``--overlap-moe-expert-parallel-comm`` runs the combined 1F1B schedule (``combined_1f1b.py``), which fuses
  the forward of one microbatch with the backward of another and starts no per-instruction timers.
- ``--cuda-graph-impl full_iteration`` (also spelled ``--cuda-graph-modules full_iteration``) captures the
  whole forward-backward step in one CUDA graph (``FullCudaGraphWrapper``); Python hooks run only at capture.
- ``--hybrid-context-parallel`` runs the hybrid-CP schedule, which splits microbatches into a variable
  number of sub-samples, so passes no longer correspond to microbatches.

The launcher checks Megatron's command line (``refused_in_argv``); the patched ``train()`` checks the parsed
arguments (``refused_in_args``). Settings coming from ``--yaml-cfg`` files are seen only by the latter.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from megatron_energy.errors import EnergyRuntimeError

FULL_ITERATION = "full_iteration"


@dataclass(frozen=True)
class RefusedMode:
    """One Megatron setting that hides the instructions, with the reason and the way out."""

    flag: str
    reason: str
    remedy: str

    def message(self) -> str:
        """The sentence shown to the user."""
        return f"megatron_energy cannot be used with {self.flag}: {self.reason}. {self.remedy}"


class UnsupportedModeError(EnergyRuntimeError):
    """Megatron runs in a mode whose pipeline instructions cannot be observed."""


def _modes(args: Any) -> list[RefusedMode]:
    refused = []
    if getattr(args, "overlap_moe_expert_parallel_comm", False):
        refused.append(
            RefusedMode(
                "--overlap-moe-expert-parallel-comm",
                "it runs the combined 1F1B schedule, which fuses the forward and backward passes of "
                "different microbatches and reports no per-instruction boundaries",
                "Drop --overlap-moe-expert-parallel-comm to optimise energy, or drop the --energy-* flags.",
            )
        )
    graph_modules = [str(m) for m in (getattr(args, "cuda_graph_modules", None) or [])]
    graph_scope = [str(m) for m in (getattr(args, "cuda_graph_scope_deprecated", None) or [])]
    if (
        getattr(args, "cuda_graph_impl", None) == FULL_ITERATION
        or FULL_ITERATION in graph_modules + graph_scope
    ):
        refused.append(
            RefusedMode(
                "--cuda-graph-impl full_iteration",
                "the whole forward-backward step replays as one CUDA graph, so hooks run only while it is "
                "captured",
                "Use --cuda-graph-impl local or transformer_engine (per-layer graphs work), or none.",
            )
        )
    if getattr(args, "hybrid_context_parallel", False):
        refused.append(
            RefusedMode(
                "--hybrid-context-parallel",
                "its schedule splits microbatches into a varying number of sub-samples, so passes no longer "
                "correspond to pipeline microbatches",
                "Drop --hybrid-context-parallel (plain --context-parallel-size works).",
            )
        )
    return refused


def megatron_settings_parser() -> argparse.ArgumentParser:
    """A parser for the few Megatron flags that matter here; everything else in the command is ignored."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--overlap-moe-expert-parallel-comm", action="store_true")
    parser.add_argument("--cuda-graph-impl", default="none")
    parser.add_argument("--cuda-graph-modules", nargs="+", default=[])
    parser.add_argument("--cuda-graph-scope", nargs="+", dest="cuda_graph_scope_deprecated", default=[])
    parser.add_argument("--hybrid-context-parallel", action="store_true")
    parser.add_argument("--microbatch-group-size-per-virtual-pipeline-stage", type=int, default=None)
    return parser


def read_megatron_settings(argv: Sequence[str]) -> argparse.Namespace:
    """Read the flags of ``megatron_settings_parser`` from a Megatron command line.

    Args:
        argv: Megatron's arguments (without the script name).

    Returns:
        The settings; Megatron's defaults where a flag is absent.
    """
    settings, _ = megatron_settings_parser().parse_known_args(list(argv))
    return settings


def refused_in_argv(argv: Sequence[str]) -> list[RefusedMode]:
    """The refused modes a Megatron command line asks for."""
    return _modes(read_megatron_settings(argv))


def refused_in_args(args: argparse.Namespace) -> list[RefusedMode]:
    """The refused modes in Megatron's parsed (and validated) arguments."""
    return _modes(args)


def require_supported(refused: Sequence[RefusedMode]) -> None:
    """Raise when any mode is refused.

    Raises:
        UnsupportedModeError: With one line per refused mode.
    """
    if refused:
        raise UnsupportedModeError("\n".join(mode.message() for mode in refused))
