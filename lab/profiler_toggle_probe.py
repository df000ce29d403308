"""Can torch's profiler toggle its operator collection on this machine, as the recorded step does?

The recorded step (``runtime/profiling/torch_recorder.py``) starts ``torch.profiler.profile`` with CPU and
CUDA activities and ``profile_all_threads``, then turns operator collection off and on around each recorded
instance (``toggle_collection_dynamic``). On one H100 with torch 2.11 a toggle raised "Expected profiler
state set" mid-run (2026-12-06). This probe runs each combination of activities and thread scope once, with
a small matrix product between toggles, and prints which toggles raise. Read-only; sets nothing.

    python lab/profiler_toggle_probe.py
"""

from __future__ import annotations

import itertools

import torch


def probe(cuda: bool, all_threads: bool) -> str:
    """Start a profile, toggle collection off then on twice around forward and backward passes; one line."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    device = "cuda" if cuda and torch.cuda.is_available() else "cpu"
    weight = torch.randn(512, 512, device=device, requires_grad=True)
    config = torch.profiler._ExperimentalConfig(profile_all_threads=all_threads)
    steps = []
    profiler = torch.profiler.profile(activities=activities, record_shapes=True, experimental_config=config)
    with profiler as prof:
        for enable in (False, True, False, True):
            (torch.randn(64, 512, device=device) @ weight).relu().sum().backward()  # autograd's thread too
            try:
                prof.toggle_collection_dynamic(enable, [torch.profiler.ProfilerActivity.CPU])
                steps.append(f"{'on' if enable else 'off'}:ok")
            except RuntimeError as problem:
                steps.append(f"{'on' if enable else 'off'}:RAISED({str(problem).strip().splitlines()[-1]})")
                break
        if device == "cuda":
            torch.cuda.synchronize()
    return " ".join(steps)


def main() -> None:
    """Print torch's version and one line per combination."""
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    for cuda, all_threads in itertools.product((False, True), (False, True)):
        print(f"cuda={cuda} profile_all_threads={all_threads}: {probe(cuda, all_threads)}")


if __name__ == "__main__":
    main()
