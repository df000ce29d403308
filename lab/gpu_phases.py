r"""Kernel timeline and per-class power of a GPT layer on one GPU, read-only (clocks are never touched).

For each model (``--models``: ``demo``, the ``megatron-energy demo`` default GPT-3 1.3B layer at its
microbatch; ``upstream``, the layer of ``scripts/pretrain_gpt.py``'s model: hidden 2048, 16 heads, seq 2048,
micro-batch 1; ``full``, that whole 24-layer model with an Adam step, for an iteration's phases outside the
layers), in bf16:

1. **Timeline** (*measured* times): ``torch.profiler`` records ``--iters`` forward + backward passes (after
   warm-up) and writes the Chrome trace; each kernel gets its operator's FLOPs and bytes, *estimated* from the
   operator's input shapes (``megatron_energy.pipeline.kineto_trace``), and is classified compute-, memory- or
   communication-bound against the spec's roofline (``pipeline.phase_timeline.classify_kernel``). Kernels are
   grouped into phases; the script prints per-class time shares, the phase count and how many phases last
   more than 10 ms (long enough for a Hopper clock switch).
2. **Power per class** (*measured*): replay loops of at least ``--loop-s`` (>= 2) seconds each, a GEMM of
   the layer's FC1 shape (compute), a LayerNorm + residual add over the layer's activations (memory), a
   ``torch.cuda._sleep`` spin (how a communication kernel waits; one GPU has no peer), while a thread polls
   the energy counter and the SM clock: power is the counter's slope, and the median SM clock is the clock the
   GPU chooses by itself under its power limit.

Only read-only NVML calls are made (the sampler of ``megatron-energy calibrate``). Usage on one H200::

    python lab/gpu_phases.py --spec h200 --json gpu_phases.json --trace-dir traces/
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import torch
from torch import nn
from torch.nn import functional
from torch.profiler import ProfilerActivity, profile

from megatron_energy.dvfs.calibration_loops import back_to_back  # the calibration's back-to-back CUDA loop
from megatron_energy.dvfs.calibration_nvml import NvmlSampler, loop_from_samples
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.kineto_trace import kernels_from_trace
from megatron_energy.pipeline.phase_timeline import class_shares, classify_kernel, group_phases, long_phases
from megatron_energy.pipeline.workload import TransformerShape

MIN_LOOP_S = 2.0
POLL_S = 0.01
RAMP_S = 0.3
"""Samples in a loop's first 0.3 s are left out (clock and power settle)."""


@dataclass(frozen=True)
class Model:
    """One model to profile: its layer shape, how many layers, and whether an optimizer step runs."""

    shape: TransformerShape
    layers: int
    optimizer: bool


MODELS: dict[str, Model] = {
    "demo": Model(TransformerShape.from_name("gpt3-1.3b"), 1, False),
    "upstream": Model(TransformerShape.from_name("gpt3-1.3b", seq_length=2048, micro_batch_size=1), 1, False),
    "full": Model(TransformerShape.from_name("gpt3-1.3b", seq_length=2048, micro_batch_size=1), 24, True),
}
"""``demo``: the demo's default model; ``upstream``/``full``: scripts/pretrain_gpt.py's flags (one layer, all
24 with Adam). Today ``demo`` and ``upstream`` share a layer shape (GPT-3 1.3B, seq 2048, micro-batch 1);
both are kept so the table stays right when either changes."""


class GptLayer(nn.Module):
    """A pre-norm GPT layer: LayerNorm, QKV, causal flash attention, projection, LayerNorm, GELU MLP."""

    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        h = shape.hidden_size
        self.heads = shape.num_attention_heads
        self.norm1, self.norm2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, shape.ffn_hidden_size), nn.Linear(shape.ffn_hidden_size, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer on activations ``x`` of shape (batch, sequence, hidden)."""
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attention = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(functional.gelu(self.fc1(self.norm2(x))))


def build(model: Model) -> tuple[nn.Module, torch.Tensor, torch.optim.Optimizer | None]:
    """The model (bf16, on the GPU), one microbatch of activations, and Adam when the model steps."""
    shape = model.shape
    layers = nn.Sequential(*(GptLayer(shape) for _ in range(model.layers))).cuda().to(torch.bfloat16)
    x = torch.randn(
        shape.micro_batch_size, shape.seq_length, shape.hidden_size, device="cuda", dtype=torch.bfloat16
    )
    optimizer = torch.optim.Adam(layers.parameters(), lr=1e-5, fused=True) if model.optimizer else None
    return layers, x.requires_grad_(), optimizer


def step_fn(
    layers: nn.Module, x: torch.Tensor, optimizer: torch.optim.Optimizer | None
) -> Callable[[], None]:
    """One forward + backward (+ optimizer step) of the model."""

    def step() -> None:
        layers(x).float().pow(2).mean().backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def timeline(name: str, model: Model, iters: int, spec_name: str, trace_dir: Path) -> dict[str, object]:
    """Profile ``iters`` steps of ``model``; classify and group the kernels; return the summary."""
    layers, x, optimizer = build(model)
    step = step_fn(layers, x, optimizer)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    trace_dir.mkdir(parents=True, exist_ok=True)
    trace_path = trace_dir / f"{name}.trace.json"
    prof.export_chrome_trace(str(trace_path))
    summary = summarise_trace(json.loads(trace_path.read_text()), spec_name, iters)
    summary.update({"model": name, "shape": str(model.shape), "layers": model.layers})
    summary["trace"] = str(trace_path)
    del layers, x, optimizer
    torch.cuda.empty_cache()
    return summary


def summarise_trace(trace: Mapping[str, Any], spec_name: str, iters: int) -> dict[str, object]:
    """Kernel classes, per-class time shares and phase lengths of a Chrome trace of ``iters`` steps."""
    spec = load_gpu_spec(spec_name)
    kernels = kernels_from_trace(trace)
    phases = group_phases(kernels, spec)
    kinds = [classify_kernel(k, spec) for k in kernels]
    durations = [p.duration_s for p in phases]
    return {
        "iterations": iters,
        "kernels": len(kernels),
        "kernels_by_class": {kind: kinds.count(kind) for kind in set(kinds)},
        "time_shares (measured times, estimated work)": class_shares(phases),
        "phases": len(phases),
        "phases_over_10ms": len(long_phases(phases)),
        "longest_phases_ms": sorted((round(1e3 * d, 3) for d in durations), reverse=True)[:10],
        "median_phase_ms": 1e3 * statistics.median(durations) if durations else 0.0,
    }


def read_trace(path: Path) -> Mapping[str, Any]:
    """A Chrome trace, plain or gzipped (Megatron's ``--use-pytorch-profiler`` writes ``rank-N.json.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def class_power(model: Model, seconds: float, handle: object) -> list[dict[str, object]]:
    """Replay loops per class (>= 2 s each); power from the energy counter, the SM clock the GPU chose."""
    shape = model.shape
    rows, h, f = shape.micro_batch_size * shape.seq_length, shape.hidden_size, shape.ffn_hidden_size
    a = torch.randn(rows, h, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(h, f, device="cuda", dtype=torch.bfloat16)
    norm = nn.LayerNorm(h).cuda().to(torch.bfloat16)
    loops = {
        "compute (FC1 GEMM)": lambda: torch.matmul(a, w),
        "memory (LayerNorm + residual add)": lambda: norm(a).add_(a),
        "communication proxy (spin kernel)": lambda: torch.cuda._sleep(1_000_000),
    }
    results = []
    with NvmlSampler(pynvml, handle, POLL_S) as sampler:
        for name, fn in loops.items():
            began = time.perf_counter()
            duration_s, repetitions = back_to_back(fn)(seconds)
            window = sampler.window(began + RAMP_S, time.perf_counter())
            loop, _ = loop_from_samples(name, window, duration_s, repetitions_text(rows, h, f))
            results.append(
                {
                    "class": name,
                    "seconds": round(loop.duration_s, 3),
                    "power_w (measured, counter slope)": round(loop.power_w, 1),
                    "median_sm_clock_mhz (chosen by the GPU)": loop.median_sm_clock_mhz,
                    "repetitions": repetitions,
                }
            )
    return results


def repetitions_text(rows: int, h: int, f: int) -> str:
    """What the loops replay."""
    return f"GEMM {rows}x{h}x{f} bf16; LayerNorm+add over {rows}x{h} bf16; spin kernel"


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Kernel timeline and per-class power of a GPT layer (read-only)."
    )
    parser.add_argument("--spec", default="h200", help="GPU spec for the roofline (configs/gpus/NAME.yaml)")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--iters", type=int, default=3, help="profiled iterations (a few)")
    parser.add_argument("--loop-s", type=float, default=3.0, help="seconds per power loop (at least 2)")
    parser.add_argument("--json", type=Path, default=Path("gpu_phases.json"))
    parser.add_argument("--trace-dir", type=Path, default=Path(tempfile.gettempdir()) / "gpu_phases")
    parser.add_argument(
        "--trace",
        type=Path,
        nargs="*",
        default=[],
        help="also summarise these Chrome traces (e.g. Megatron's --use-pytorch-profiler rank-0.json.gz)",
    )
    parser.add_argument("--trace-iters", type=int, default=1, help="training iterations each --trace covers")
    args = parser.parse_args()
    if args.loop_s < MIN_LOOP_S:
        parser.error(f"--loop-s must be at least {MIN_LOOP_S} s so the ~100 ms energy counter resolves it")
    report: dict[str, Any] = {"spec": args.spec, "models": []}
    if args.models:
        if not torch.cuda.is_available():
            parser.error(
                "no CUDA GPU: run this on the GPU machine (only --trace files can be read without one)"
            )
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        report["gpu"] = pynvml.nvmlDeviceGetName(handle)
        for name in args.models:
            model = MODELS[name]
            summary = timeline(name, model, args.iters, args.spec, args.trace_dir)
            summary["power_by_class"] = class_power(model, args.loop_s, handle) if name != "full" else []
            print(json.dumps(summary, indent=2))
            report["models"].append(summary)
        pynvml.nvmlShutdown()
    for path in args.trace:
        summary = summarise_trace(read_trace(path), args.spec, args.trace_iters)
        summary["trace"] = str(path)
        print(json.dumps(summary, indent=2))
        report["models"].append(summary)
    args.json.write_text(json.dumps(report, indent=2))
    print(f"written to {args.json}; every time is measured, FLOPs/bytes per kernel are estimated from shapes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
