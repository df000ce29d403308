"""Phases of an instruction from a *modelled* per-class split, until kernel timelines are measured.

An instruction's :class:`~megatron_energy.dvfs.model.WorkProfile` (fitted to its profile rows, or from the
workload model) says how much of its time is compute-bound, memory-bound and fixed, but not in which order.
A transformer layer runs them interleaved; :data:`LAYER_PATTERN` is one layer's order in a pre-norm GPT
layer (norm, attention block, tensor-parallel all-reduce, residual + norm, FC1, activation, FC2, all-reduce,
residual), with each run's share of its class's time per layer. The instruction's work is split evenly over
its layers and laid out in that order; adjacent runs of one class (a layer's last residual and the next
layer's first norm) form one phase. The shares are assumptions (provenance ``modelled``): a measured kernel
timeline (:func:`~megatron_energy.pipeline.phase_timeline.group_phases`) replaces them.

An MoE layer (:func:`layer_pattern` of a shape with ``moe``) runs, after attention: the router (compute),
permute (memory), the dispatch all-to-all (communication), the experts' FC1 (compute), activation (memory),
FC2 (compute), the combine all-to-all (communication) and unpermute (memory). Its shares are not assumed but
derived from the workload model's parts (``pipeline.workload``, ``pipeline.moe``): each run's FLOPs over the
efficiency of its kernel kind and its GEMM class's peak (``pipeline.precision``), bytes, or seconds, over its
class's total per layer.

The iteration tail's phases (:func:`tail_phases`), one per outside phase the runtime hooks
(``events.OUTSIDE_PHASES``), each of a modelled class (:data:`OUTSIDE_CLASSES`): the data-parallel gradient
sync and the parameter all-gather are communication, the optimizer step memory-bound (Adam streams
parameters, gradients and moments). Their durations are measured (the session's profiling steps) or modelled
(a job description's tail).
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron_energy.dvfs.kernel_classes import ClassMix, KernelClass
from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.moe import (
    ALL_TO_ALLS_PER_LAYER_PASS,
    activation_bytes,
    expert_flops,
    permute_bytes,
    router_bytes,
    router_flops,
)
from megatron_energy.pipeline.phase_timeline import Phase, PhaseClass, class_work
from megatron_energy.pipeline.precision import PEAK_OVER_BF16
from megatron_energy.pipeline.workload import (
    ATTENTION_EFFICIENCY,
    BF16_BYTES,
    GEMM_EFFICIENCY,
    KERNELS_PER_LAYER,
    LAUNCH_GAP_S,
    TransformerShape,
    tp_all_reduce_s,
)

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

LayerPattern = tuple[tuple[PhaseClass, float], ...]
"""A layer's runs in order, as :data:`LAYER_PATTERN`."""

ELEMENTWISE_SHARES = (0.25, 0.35, 0.15)
"""How :data:`LAYER_PATTERN` splits a layer's elementwise bytes: input norm, residual + norm, residual."""


def layer_pattern(shape: TransformerShape, spec: GpuSpec) -> LayerPattern:
    """The runs of one of ``shape``'s layers: :data:`LAYER_PATTERN`, or an MoE layer's (module docstring).

    Args:
        shape: The model shape (with ``moe`` for an MoE model).
        spec: The GPU (the communication runs' latency and bandwidths).
    """
    moe = shape.moe
    if moe is None:
        return LAYER_PATTERN
    b, s, h = shape.micro_batch_size, shape.seq_length, shape.hidden_size
    attention_flops = shape.layer_forward_gemm_flops() - router_flops(shape, moe) - expert_flops(shape, moe)
    matrices = 3 if shape.gated_mlp else 2
    layer_gemm = GEMM_EFFICIENCY * PEAK_OVER_BF16[shape.layer_gemm_class]
    router_gemm = GEMM_EFFICIENCY * PEAK_OVER_BF16[shape.params_gemm_class]
    compute = {
        "attention": attention_flops / layer_gemm
        + shape.layer_forward_attention_flops() / ATTENTION_EFFICIENCY,
        "router": router_flops(shape, moe) / router_gemm,
        "fc1": expert_flops(shape, moe) * (matrices - 1) / matrices / layer_gemm,
        "fc2": expert_flops(shape, moe) / matrices / layer_gemm,
    }
    elementwise = BF16_BYTES * 16 * b * s * h / sum(ELEMENTWISE_SHARES)
    norm, residual_norm, residual = (share * elementwise for share in ELEMENTWISE_SHARES)
    memory = {
        "norm": norm,
        "residual_norm": residual_norm,
        "permute": router_bytes(shape, moe) + permute_bytes(shape, moe),
        "activation": activation_bytes(shape, moe),
        "unpermute": permute_bytes(shape, moe),
        "residual": residual,
    }
    gaps_s = KERNELS_PER_LAYER["forward"] * LAUNCH_GAP_S
    exchange_s = shape.layer_all_to_all_s(spec) / ALL_TO_ALLS_PER_LAYER_PASS  # one all-to-all, exposed
    communication = {"tp": tp_all_reduce_s(shape, spec) + gaps_s / 2, "exchange": exchange_s}
    c, m = sum(compute.values()), sum(memory.values())
    k = 2 * communication["tp"] + 2 * communication["exchange"]
    return (
        ("memory", memory["norm"] / m),
        ("compute", compute["attention"] / c),
        ("communication", communication["tp"] / k),  # TP all-reduce (SP: reduce-scatter), launch gaps
        ("memory", memory["residual_norm"] / m),
        ("compute", compute["router"] / c),
        ("memory", memory["permute"] / m),  # router softmax / top-k and permute
        ("communication", communication["exchange"] / k),  # dispatch all-to-all
        ("compute", compute["fc1"] / c),
        ("memory", memory["activation"] / m),
        ("compute", compute["fc2"] / c),
        ("communication", communication["exchange"] / k),  # combine all-to-all
        ("memory", memory["unpermute"] / m),
        ("communication", communication["tp"] / k),  # TP all-gather before the next layer, launch gaps
        ("memory", memory["residual"] / m),
    )


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


def run_mixes(mix: ClassMix | None, pattern: LayerPattern) -> list[ClassMix | None]:
    """Each run's class mix, so that the layer's compute runs together hold ``mix``.

    A layer's first compute run is its attention block (both patterns'): it holds the attention time, up to
    its share of the layer's compute time (what does not fit is spread over the other compute runs by their
    shares); the rest of every run is the mix's GEMM classes in their proportions. Runs of other classes,
    and every run of work without a mix or without attention, keep ``mix``.
    """
    attention = 0.0 if mix is None else dict(mix.shares).get(KernelClass.ATTENTION, 0.0)
    compute = [share for kind, share in pattern if kind == "compute"]
    if mix is None or attention <= 0.0 or attention >= 1.0 or sum(compute[1:]) <= 0.0:
        return [mix] * len(pattern)
    block = min(attention, compute[0])
    overflow = (attention - block) / sum(compute[1:])
    gemms = [(k, share / (1.0 - attention)) for k, share in mix.shares if k != KernelClass.ATTENTION]
    mixes: list[ClassMix | None] = []
    first = True
    for kind, share in pattern:
        if kind != "compute" or share <= 0.0:
            mixes.append(mix)
            continue
        held = block if first else overflow * share
        first = False
        rest = max(0.0, share - held)
        mixes.append(ClassMix.of([*((k, rest * g) for k, g in gemms), (KernelClass.ATTENTION, held)]))
    return mixes


def modelled_phases(work: WorkProfile, layers: int, pattern: LayerPattern = LAYER_PATTERN) -> list[Phase]:
    """The instruction's phases, ``work`` split evenly over ``layers`` layers of ``pattern``.

    Compute phases carry the instruction's class mix as :func:`run_mixes` splits it over a layer's runs.

    Args:
        work: The instruction's work at the maximum clock.
        layers: Transformer layers the instruction runs (1 when unknown: the coarsest split).
        pattern: One layer's runs (:func:`layer_pattern`); a dense layer's by default.

    Raises:
        ValueError: If ``layers`` is not positive.
    """
    if layers <= 0:
        raise ValueError(f"an instruction runs at least one layer, got {layers}")
    per_layer = work.scaled(1.0 / layers)
    mixes = run_mixes(work.compute_mix, pattern)
    runs = [
        Phase(kind, 0.0, class_work(kind, share * _class_time(per_layer, kind), mix))
        for _ in range(layers)
        for (kind, share), mix in zip(pattern, mixes, strict=True)
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
