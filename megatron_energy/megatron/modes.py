"""Megatron modes whose pipeline instructions cannot be observed, refused with the flag and what to do.

Per-instruction clocks need every forward and backward pass of a training step to be reported with its
microbatch. These Megatron settings break that, so ``--energy-optimise`` (and ``--energy-trace``) refuse them:

- ``--overlap-moe-expert-parallel-comm`` (the combined 1F1B schedule, ``combined_1f1b.py``) is supported
  through the launcher, whose hooks wrap ``combined_forward_backward_step`` (one node per fused step), with
  ``--energy-mode perseus``. Refused: on the patched path (the patch set's hooks sit in ``forward_step`` and
  ``backward_step``, which that schedule bypasses); with pipelining but no virtual stages (megatron-core
  itself runs no combined schedule there); with an energy mode whose planner knows single passes only
  (Kareus collectives, kernel phases).
- ``--cuda-graph-impl full_iteration`` (also spelled ``--cuda-graph-modules full_iteration``) captures the
  whole forward-backward step in one CUDA graph (``FullCudaGraphWrapper``); Python hooks run only at capture.
  The launcher follows it (``megatron.full_iteration``: markers captured in the graph, clocks by time from
  each replay's start) with ``--energy-mode perseus``, ``kernel`` or ``all``. Refused: on the patched path
  (its hooks cannot tell a capture from a step); with ``--energy-mode kareus`` (a collective's launch point
  and its communicator's SM budget are fixed in the graph when it is captured, before any plan exists, so
  that mode would have nothing left to plan); for an ``--energy-trace`` alone (a trace records the host
  time of hooks, which a replay does not run).
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


COMBINED_FLAG = "--overlap-moe-expert-parallel-comm"
COMBINED_MODES = ("perseus",)
"""The ``--energy-mode`` values whose planners know the combined 1F1B schedule's fused steps."""


def _combined_modes(args: Any, patched: bool, energy_mode: str | None) -> list[RefusedMode]:
    """What of the combined 1F1B schedule cannot be followed (see the module docstring)."""
    if not getattr(args, "overlap_moe_expert_parallel_comm", False):
        return []
    if patched:
        return [
            RefusedMode(
                COMBINED_FLAG + " on the patched path",
                "the combined 1F1B schedule bypasses forward_step and backward_step, where the patch set's "
                "hooks sit",
                "Start the job through `python -m megatron_energy.launch` (its hooks wrap "
                "combined_forward_backward_step), or drop the flag.",
            )
        ]
    refused = []
    pipeline_size = getattr(args, "pipeline_model_parallel_size", 1) or 1
    virtual = any(
        getattr(args, name, None) is not None
        for name in (
            "num_layers_per_virtual_pipeline_stage",
            "num_virtual_stages_per_pipeline_rank",
            "virtual_pipeline_model_parallel_size",
        )
    )
    if pipeline_size > 1 and not virtual:
        refused.append(
            RefusedMode(
                f"{COMBINED_FLAG} with --pipeline-model-parallel-size {pipeline_size} and no virtual stages",
                "megatron-core runs the combined 1F1B schedule with pipelining only when it is interleaved",
                "Use --num-virtual-stages-per-pipeline-rank (or --num-layers-per-virtual-pipeline-stage), or "
                "--pipeline-model-parallel-size 1.",
            )
        )
    if energy_mode is not None and energy_mode not in COMBINED_MODES:
        refused.append(
            RefusedMode(
                f"{COMBINED_FLAG} with --energy-mode {energy_mode}",
                "only the perseus planner clocks the combined 1F1B schedule's fused forward-backward steps; "
                "Kareus collectives and kernel phases are planned per single pass",
                "Use --energy-mode perseus, or drop the flag.",
            )
        )
    return refused


def uses_full_iteration_graph(args: Any) -> bool:
    """Whether Megatron's settings capture the whole training step as one CUDA graph."""
    graph_modules = [str(m) for m in (getattr(args, "cuda_graph_modules", None) or [])]
    graph_scope = [str(m) for m in (getattr(args, "cuda_graph_scope", None) or [])]
    graph_scope += [str(m) for m in (getattr(args, "cuda_graph_scope_deprecated", None) or [])]
    return (
        getattr(args, "cuda_graph_impl", None) == FULL_ITERATION
        or FULL_ITERATION in graph_modules + graph_scope
    )


GRAPH_FLAG = "--cuda-graph-impl full_iteration"
GRAPH_MODES = ("perseus", "kernel", "all")
"""The ``--energy-mode`` values that plan what a replayed graph lets the plugin carry out: clocks by time."""


def _graph_modes(args: Any, patched: bool, energy_mode: str | None) -> list[RefusedMode]:
    """What of a full-iteration CUDA graph cannot be followed (see the module docstring)."""
    if not uses_full_iteration_graph(args):
        return []
    if patched:
        return [
            RefusedMode(
                GRAPH_FLAG + " on the patched path",
                "the patch set's hooks cannot tell the step that captures the graph from a training step, "
                "and no hook runs in a replay",
                "Start the job through `python -m megatron_energy.launch` (it follows the capture and the "
                "replays), or use --cuda-graph-impl local.",
            )
        ]
    if energy_mode is None:
        return [
            RefusedMode(
                GRAPH_FLAG + " with --energy-trace alone",
                "a trace records the host time of every hook, and a replayed graph runs none",
                "Trace a run without the flag, or add --energy-optimise.",
            )
        ]
    if energy_mode not in GRAPH_MODES:
        return [
            RefusedMode(
                f"{GRAPH_FLAG} with --energy-mode {energy_mode}",
                "collective launch points and communicator SM budgets are fixed in the graph when it is "
                "captured, before a plan exists",
                "Use --energy-mode all (clocks by time, no collective retiming) or perseus, or per-layer "
                "graphs (--cuda-graph-impl local).",
            )
        ]
    return []


def _modes(args: Any, patched: bool, energy_mode: str | None = None) -> list[RefusedMode]:
    refused = _combined_modes(args, patched, energy_mode) + _graph_modes(args, patched, energy_mode)
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
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1)
    parser.add_argument("--context-parallel-size", type=int, default=1)
    parser.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    parser.add_argument("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
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


def refused_in_argv(argv: Sequence[str], energy_mode: str | None = None) -> list[RefusedMode]:
    """The refused modes a Megatron command line asks for, started through the launcher.

    Args:
        argv: Megatron's arguments (without the script name).
        energy_mode: ``--energy-mode`` when energy is optimised; ``None`` for a trace only.
    """
    return _modes(read_megatron_settings(argv), patched=False, energy_mode=energy_mode)


def refused_in_args(args: argparse.Namespace) -> list[RefusedMode]:
    """The refused modes in Megatron's parsed (and validated) arguments, on the patched path."""
    return _modes(args, patched=True)


def require_supported(refused: Sequence[RefusedMode]) -> None:
    """Raise when any mode is refused.

    Raises:
        UnsupportedModeError: With one line per refused mode.
    """
    if refused:
        raise UnsupportedModeError("\n".join(mode.message() for mode in refused))
