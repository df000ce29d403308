"""Phases of an instruction from a *modelled* per-class split, until kernel timelines are measured.

An instruction's :class:`~megatron_energy.dvfs.model.WorkProfile` (fitted to its profile rows, or from the
workload model) says how much of its time is compute-bound, memory-bound and fixed, but not in which order.
A transformer layer runs them interleaved; :data:`LAYER_PATTERN` is one layer's order in a pre-norm GPT
layer (norm, attention block, tensor-parallel all-reduce, residual + norm, FC1, activation, FC2, all-reduce,
residual), with each run's share of its class's time per layer. The instruction's work is split evenly over
its layers and laid out in that order; adjacent runs of one class (a layer's last residual and the next
layer's first norm) form one phase. The shares are assumptions (provenance ``modelled``): a measured kernel
timeline (:func:`~megatron_energy.pipeline.phase_timeline.group_phases`) replaces them.

The iteration tail's phases (:func:`tail_phases`), one per outside phase the runtime hooks
(``events.OUTSIDE_PHASES``), each of a modelled class (:data:`OUTSIDE_CLASSES`): the data-parallel gradient
sync and the parameter all-gather are communication, the optimizer step memory-bound (Adam streams
parameters, gradients and moments). Their durations are measured (the session's profiling steps) or modelled
(a job description's tail).
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.pipeline.phase_timeline import Phase, PhaseClass, class_work

LAYER_PATTERN: tuple[tuple[PhaseClass, float], ...] = (
    ("memory", 0.25),  # input layer norm
    ("compute", 0.45),  # QKV GEMM, attention, output projection
    ("communication", 0.5),  # tensor-parallel all-reduce (and launch gaps)
    ("memory", 0.35),  # bias/dropout/residual add, pre-MLP layer norm
    ("compute", 0.275),  # FC1
    ("memory", 0.25),  # activation (GELU / SwiGLU)
    ("compute", 0.275),  # FC2
    ("communication", 0.5),  # tensor-parallel all-reduce (and launch gaps)
    ("memory", 0.15),  # bias/dropout/residual add
)
"""One layer's runs in order: (class, share of the layer's time of that class). Shares per class sum to 1."""


def _class_time(work: WorkProfile, kind: PhaseClass) -> float:
    """The time of one class in ``work``."""
    return {"compute": work.compute_s, "memory": work.memory_s}.get(kind, work.fixed_s)


def coalesce(runs: list[Phase]) -> list[Phase]:
    """Adjacent runs of one class as one phase; empty runs dropped; starts recomputed."""
    phases: list[Phase] = []
    start_s = 0.0
    for run in runs:
        if run.duration_s <= 0:
            continue
        if phases and phases[-1].kind == run.kind:
            last = phases[-1]
            phases[-1] = Phase(last.kind, last.start_s, last.work + run.work, last.kernels + run.kernels)
        else:
            phases.append(Phase(run.kind, start_s, run.work, run.kernels))
        start_s += run.duration_s
    return phases


def modelled_phases(work: WorkProfile, layers: int) -> list[Phase]:
    """The instruction's phases, ``work`` split evenly over ``layers`` layers of :data:`LAYER_PATTERN`.

    Args:
        work: The instruction's work at the maximum clock.
        layers: Transformer layers the instruction runs (1 when unknown: the coarsest split).

    Raises:
        ValueError: If ``layers`` is not positive.
    """
    if layers <= 0:
        raise ValueError(f"an instruction runs at least one layer, got {layers}")
    per_layer = work.scaled(1.0 / layers)
    runs = [
        Phase(kind, 0.0, class_work(kind, share * _class_time(per_layer, kind)))
        for _ in range(layers)
        for kind, share in LAYER_PATTERN
    ]
    return coalesce(runs)


OUTSIDE_CLASSES: dict[str, PhaseClass] = {
    "grad-sync": "communication",
    "optimizer": "memory",
    "param-gather": "communication",
}
"""The class of each outside phase (modelled: assigned by what the phase does, not measured)."""


def tail_phases(durations: Sequence[tuple[str, float]]) -> tuple[list[Phase], list[str]]:
    """The iteration tail's phases from its outside phases' durations, and the hook each phase starts at.

    Args:
        durations: ``(name, seconds at the maximum clock)`` of each outside phase in the order they run
            (names from :data:`OUTSIDE_CLASSES`).

    Returns:
        The phases (adjacent ones of one class as one, empty ones dropped) and, per phase, the name of the
        outside phase at its start.

    Raises:
        ValueError: If a name is not an outside phase.
    """
    unknown = [name for name, _ in durations if name not in OUTSIDE_CLASSES]
    if unknown:
        raise ValueError(f"not outside phases: {unknown}; known: {sorted(OUTSIDE_CLASSES)}")
    named = [(name, seconds) for name, seconds in durations if seconds > 0]
    phases = coalesce([Phase(OUTSIDE_CLASSES[n], 0.0, class_work(OUTSIDE_CLASSES[n], s)) for n, s in named])
    hooks = []
    for phase in phases:
        start_s = 0.0
        for name, seconds in named:
            if start_s >= phase.start_s - 1e-12:
                hooks.append(name)
                break
            start_s += seconds
    return phases, hooks
