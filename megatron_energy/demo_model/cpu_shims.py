"""What megatron-core needs to run its pipeline schedules on CPU, installed only where asked for.

:func:`install_cpu_shims` changes torch in the calling process only; the demo's ranks and the tests call it,
nothing on the library's import path does. Each shim names the megatron-core 0.19.2 line it works around:

- ``torch.zeros(..., device="cuda")`` -> CPU: ``pipeline_parallel/schedules.py:749/1121/2292`` allocate the
  token counter on CUDA.
- ``torch.cuda.current_device()`` -> ``cpu``: ``pipeline_parallel/p2p_communication.py:334/342`` allocate
  receive buffers on the current CUDA device.
- ``torch.set_num_threads(1)``: not a megatron workaround; N processes on 2 cores otherwise oversubscribe
  and the interleaved schedule's first step takes seconds.

:func:`install_moe_cpu_shims` (MoE models only) stands a no-op CPU stream in for CUDA streams and events:
``transformer/moe/token_dispatcher.py:469`` creates a ``torch.cuda.Stream`` for the all-to-all dispatcher's
device-to-host copies and ``:922-946`` copies the token counts on it (a plain copy on CPU) and syncs its
event;
``moe_utils.py:1184`` (``maybe_move_tensor_to_cpu``) turns the all-to-all's split sizes into numpy arrays only
for CUDA tensors, so on CPU they reach ``all_to_all_single`` as tensors, which it refuses: the shim converts
CPU tensors too.

Two more workarounds live where the model is built (``tiny_gpt.PipelineWorld``): ``batch_p2p_sync=False``
(``p2p_communication.py:419`` calls ``torch.cuda.synchronize()`` after batched p2p) and
``initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)`` (``tensor_parallel/random.py:446``
``model_parallel_cuda_manual_seed`` needs CUDA; the inference tracker's ``fork()`` is a no-op context).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch


def install_cpu_shims() -> None:
    """Let megatron-core's schedules and p2p communication run without CUDA (see the module docstring)."""
    if getattr(torch.zeros, "cpu_shim", False):
        return
    cuda_zeros = torch.zeros

    # megatron/core/pipeline_parallel/schedules.py:749/1121/2292: torch.zeros([], ..., device="cuda")
    @functools.wraps(cuda_zeros)
    def zeros_on_cpu(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return cuda_zeros(*args, **kwargs)

    zeros_on_cpu.cpu_shim = True  # type: ignore[attr-defined]
    torch.zeros = zeros_on_cpu
    # megatron/core/pipeline_parallel/p2p_communication.py:334/342: device=torch.cuda.current_device()
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    torch.set_num_threads(1)


class _CpuStream:
    """A CUDA stream's stand-in on CPU: work runs in order on the host, so waits and syncs are no-ops."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def wait_stream(self, _stream: object) -> None:
        """Nothing to wait for: CPU work is already in order."""

    def wait_event(self, _event: object) -> None:
        """Nothing to wait for: CPU work is already in order."""

    def record_event(self, _event: object = None) -> _CpuStream:
        """An event that is already complete (this stand-in serves as its own event)."""
        return self

    def synchronize(self) -> None:
        """Already complete."""


_CPU_STREAM = _CpuStream()


def install_moe_cpu_shims() -> None:
    """Let megatron-core's all-to-all token dispatcher run without CUDA (see the module docstring)."""
    torch.cuda.Stream = _CpuStream  # type: ignore[assignment,misc]
    torch.cuda.current_stream = lambda *_args, **_kwargs: _CPU_STREAM  # type: ignore[assignment]
    torch.cuda.stream = lambda _stream: contextlib.nullcontext()  # type: ignore[assignment,return-value]
    from megatron.core.transformer.moe import token_dispatcher

    def split_sizes_on_cpu(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        del record_stream  # no side stream on CPU
        return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = split_sizes_on_cpu


@contextlib.contextmanager
def warnings_silenced() -> Iterator[None]:
    """Hide megatron-core's deprecation chatter (``GPTModel IS DEPRECATED`` and friends)."""
    logger = logging.getLogger("megatron.core")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logger.setLevel(level)
