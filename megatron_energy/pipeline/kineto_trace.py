"""Kernel records from a ``torch.profiler`` (Kineto) Chrome trace: times, FLOPs and bytes per kernel.

Pure JSON reading, so it is tested without a GPU. A trace holds ``kernel`` events (GPU start ``ts`` and
``dur`` in µs, ``args.correlation``), ``cuda_runtime`` or ``cuda_driver`` launch events on the CPU thread
that launched them (same correlation) and ``cpu_op`` events (aten operators, nested by time on their
thread; with ``record_shapes=True`` their ``args`` hold ``Input Dims`` and ``Input type``). Each kernel is
attributed to the innermost operator enclosing its launch; the operator's work is estimated from its shapes
(:func:`op_flops`, :func:`op_bytes`: *estimates*, stated as such) and shared over its kernels by duration
(:func:`~megatron_energy.pipeline.phase_timeline.split_op_work`). :func:`kernels_by_annotation` also groups
the kernels by the ``record_function`` range (``user_annotation`` event) that enclosed their launch, which is
how the session's profiling steps tell the instructions' kernels apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from megatron_energy.pipeline.phase_timeline import KernelRecord, split_op_work

DTYPE_BYTES: dict[str, int] = {
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "float": 4,
    "double": 8,
    "long int": 8,
    "int": 4,
    "bool": 1,
    "unsigned char": 1,
}
"""Element sizes of the dtype names Kineto writes in ``Input type``."""

LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
"""Categories of the CPU-side launch events: runtime API calls, and driver API calls (``cuLaunchKernelEx``:
cuBLAS launches its Hopper GEMM kernels this way)."""


def _numel(dims: Sequence[Any]) -> int:
    """Elements of one input: a shape, or a list of shapes (a ``TensorList`` input); 0 for a scalar."""
    if not dims:
        return 0
    if all(isinstance(d, int) for d in dims):
        return math.prod(dims)
    return sum(_numel(d) for d in dims if isinstance(d, list))


def op_flops(name: str, dims: Sequence[Sequence[int]]) -> float:
    """Estimated FLOPs of one operator from its input shapes (0 for operators without a rule).

    Rules: ``aten::mm`` / ``aten::addmm`` / ``aten::bmm`` / ``aten::baddbmm`` / ``aten::matmul`` /
    ``aten::linear``: 2 x the product's multiply-adds; scaled-dot-product (flash, efficient, cuDNN)
    attention (``aten::_flash_attention_*`` too): 4·B·H·S²·D forward, twice that backward (causal masking,
    which halves the work, is not visible in the shapes: an upper estimate).
    """
    shapes = [list(d) for d in dims if d]
    try:
        if name in ("aten::mm", "aten::matmul") and len(shapes) >= 2 and len(shapes[0]) == 2:
            (m, k), (_, n) = shapes[0], shapes[1]
            return 2.0 * m * k * n
        if name == "aten::addmm" and len(shapes) >= 3:
            (m, k), (_, n) = shapes[1], shapes[2]
            return 2.0 * m * k * n
        if name in ("aten::bmm", "aten::baddbmm") and len(shapes) >= 2:
            a, b = shapes[-2], shapes[-1]
            return 2.0 * a[0] * a[1] * a[2] * b[2]
        if name == "aten::linear" and len(shapes) >= 2:
            rows = _numel(shapes[0][:-1])
            n, k = shapes[1]
            return 2.0 * rows * k * n
        if "scaled_dot_product" in name and shapes:  # query [B, H, S, D]
            batch, heads, seq, head_dim = shapes[0][:4]
            forward = 4.0 * batch * heads * seq * seq * head_dim
            return 2.0 * forward if "backward" in name else forward
        if (
            "flash_attention" in name and shapes
        ):  # aten::_flash_attention_forward/backward: query [B, S, H, D]
            batch, seq, heads, head_dim = shapes[0][:4]
            forward = 4.0 * batch * heads * seq * seq * head_dim
            return 2.0 * forward if "backward" in name else forward
    except (ValueError, IndexError):
        return 0.0
    return 0.0


def op_bytes(dims: Sequence[Sequence[Any]], types: Sequence[str]) -> float:
    """Estimated bytes an operator moves: its inputs read once, and an output the size of its first input."""
    sizes = [_numel(d) * DTYPE_BYTES.get(t, 0) for d, t in zip(dims, types, strict=False) if d]
    return float(sum(sizes) + (sizes[0] if sizes else 0))


def kernels_from_trace(trace: Mapping[str, Any]) -> list[KernelRecord]:
    """Every GPU kernel of a Kineto Chrome trace, with its operator's estimated work shared to it.

    Args:
        trace: The parsed JSON of ``prof.export_chrome_trace(path)``.

    Returns:
        Kernel records, seconds from the first kernel's start, in start order.
    """
    return _from_origin([record for record, _ in _records(trace)])


def kernels_by_annotation(trace: Mapping[str, Any], prefix: str) -> dict[str, list[KernelRecord]]:
    """The kernels launched inside each ``record_function`` range whose name starts with ``prefix``.

    A kernel belongs to the innermost such range (a ``user_annotation`` event) of the launching process that
    encloses its launch, on any of its threads: the ranges mark work that runs one at a time, and a backward
    pass's kernels are launched by autograd's own thread while the range's thread waits for it. Kernels
    launched outside every such range are left out.

    Args:
        trace: The parsed JSON of ``prof.export_chrome_trace(path)``.
        prefix: The names' common start (e.g. ``energy:``).

    Returns:
        Range name -> its kernels, seconds from its first kernel's start, in start order.
    """
    ranges: dict[Any, list[dict[str, Any]]] = {}
    for event in _complete_events(trace):
        if event.get("cat") == "user_annotation" and str(event.get("name", "")).startswith(prefix):
            ranges.setdefault(event.get("pid"), []).append(event)
    groups: dict[str, list[KernelRecord]] = {}
    for record, launch in _records(trace):
        if launch is None:
            continue
        enclosing = _innermost(ranges.get(launch.get("pid"), []), launch["ts"])
        if enclosing is not None:
            groups.setdefault(enclosing["name"], []).append(record)
    return {name: _from_origin(records) for name, records in groups.items()}


def _complete_events(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]


def _records(trace: Mapping[str, Any]) -> list[tuple[KernelRecord, dict[str, Any] | None]]:
    """Every kernel (absolute times, its operator's work shared to it) with the event that launched it."""
    events = _complete_events(trace)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
    }
    ops_by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for event in events:
        if event.get("cat") == "cpu_op":
            ops_by_thread.setdefault((event.get("pid"), event.get("tid")), []).append(event)
    launches_by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for launch_event in launches.values():
        thread = (launch_event.get("pid"), launch_event.get("tid"))
        launches_by_thread.setdefault(thread, []).append(launch_event)
    op_of_launch: dict[int, dict[str, Any] | None] = {}
    for thread, thread_launches in launches_by_thread.items():
        op_of_launch.update(_innermost_ops(ops_by_thread.get(thread, []), thread_launches))
    groups: dict[int, list[dict[str, Any]]] = {}
    owner: dict[int, dict[str, Any] | None] = {}
    launch_of: dict[int, dict[str, Any] | None] = {}
    for kernel in kernels:
        launch = launches.get(kernel.get("args", {}).get("correlation"))
        launch_of[id(kernel)] = launch
        op = None if launch is None else op_of_launch.get(id(launch))
        key = id(op) if op is not None else id(kernel)
        groups.setdefault(key, []).append(kernel)
        owner[key] = op
    records = []
    for key, members in groups.items():
        op = owner[key]
        args = {} if op is None else op.get("args", {})
        dims = args.get("Input Dims", [])
        flops = 0.0 if op is None else op_flops(op.get("name", ""), dims)
        num_bytes = op_bytes(dims, args.get("Input type", []))
        shares = split_op_work(flops, num_bytes, [k["dur"] * 1e-6 for k in members])
        for kernel, (k_flops, k_bytes) in zip(members, shares, strict=True):
            record = KernelRecord(kernel["name"], kernel["ts"] * 1e-6, kernel["dur"] * 1e-6, k_flops, k_bytes)
            records.append((record, launch_of[id(kernel)]))
    return records


def _from_origin(records: Sequence[KernelRecord]) -> list[KernelRecord]:
    """The records in start order, seconds from the first one's start."""
    ordered = sorted(records, key=lambda r: r.start_s)
    origin = ordered[0].start_s if ordered else 0.0
    return [KernelRecord(r.name, r.start_s - origin, r.duration_s, r.flops, r.bytes) for r in ordered]


def _innermost_ops(
    ops: Sequence[dict[str, Any]], launches: Sequence[dict[str, Any]]
) -> dict[int, dict[str, Any] | None]:
    """The innermost operator enclosing each launch of one thread (keyed by ``id(launch)``).

    Operators on a thread nest by time, so one sweep in time order with a stack of the open operators finds
    them all (a trace holds ~10^5 operators and ~10^4 kernels per step: a scan per launch would be too slow).
    """
    ordered_ops = sorted(ops, key=lambda op: (op["ts"], -op.get("dur", 0)))
    found: dict[int, dict[str, Any] | None] = {}
    open_ops: list[dict[str, Any]] = []
    next_op = 0
    for launch in sorted(launches, key=lambda e: e["ts"]):
        ts = launch["ts"]
        while next_op < len(ordered_ops) and ordered_ops[next_op]["ts"] <= ts:
            op = ordered_ops[next_op]
            while open_ops and _end(open_ops[-1]) < op["ts"]:
                open_ops.pop()
            open_ops.append(op)
            next_op += 1
        while open_ops and _end(open_ops[-1]) < ts:
            open_ops.pop()
        found[id(launch)] = open_ops[-1] if open_ops else None
    return found


def _end(op: Mapping[str, Any]) -> float:
    return float(op["ts"]) + float(op.get("dur", 0))


def _innermost(ops: Sequence[dict[str, Any]], ts: float) -> dict[str, Any] | None:
    """The shortest event (operator, annotated range) whose span holds ``ts``."""
    enclosing = [op for op in ops if op["ts"] <= ts <= op["ts"] + op.get("dur", 0)]
    return min(enclosing, key=lambda op: op.get("dur", 0), default=None)
