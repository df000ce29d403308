"""Run megatron-core's real pipeline schedules on CPU: gloo process groups and a tiny real ``GPTModel``.

``spawn_world`` spawns one fresh process (``torch.multiprocessing.spawn``) that installs the CPU shims
below, imports megatron-core once and forks N ranks (a free ``MASTER_PORT`` per world); each rank runs a
worker function and its (picklable) result comes back to the parent. Inside a worker, ``PipelineWorld``
builds megatron-core's parallel state and a tiny ``GPTModel`` (``get_gpt_layer_local_spec``: no
Transformer Engine, no apex, fusions off) split into pipeline stages and virtual-pipeline chunks, and
runs ``get_forward_backward_func()`` on it.

Every CPU workaround lives here and only here (the package never patches torch or megatron); each names
the megatron-core 0.19.2 line it works around:

- ``torch.zeros(..., device="cuda")`` -> CPU: ``pipeline_parallel/schedules.py:749/1121/2292`` allocate the
  token counter on CUDA.
- ``torch.cuda.current_device()`` -> ``cpu``: ``pipeline_parallel/p2p_communication.py:334/342`` allocate
  receive buffers on the current CUDA device.
- ``batch_p2p_sync=False`` in the model config: ``p2p_communication.py:419`` calls
  ``torch.cuda.synchronize()`` after batched p2p.
- ``initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)``: ``tensor_parallel/random.py:446``
  ``model_parallel_cuda_manual_seed`` needs CUDA; without a tracker, dropout regions fail with "cuda rng
  state model-parallel-rng is not added"; the inference tracker's ``fork()`` is a no-op context.
- ``torch.set_num_threads(1)``: not a megatron workaround; N processes on 2 cores otherwise oversubscribe
  and the interleaved schedule's first step takes seconds.

Workers must live in modules that do not import ``megatron`` at import time: a worker may run against a
patched copy of megatron-core that ``spawn_world`` puts first on ``sys.path`` before anything imports it.

Run as a script (``python -m megatron_energy.launch tests/megatron_harness.py <megatron args>``, one
process per rank under ``torchrun``), it is a tiny pretrain loop on Megatron's own argument parsing and
global timers: the target of the launcher tests.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import pickle
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

Worker = Callable[[int, int, Any], Any]

COLLECTIVE_TIMEOUT_S = 180
"""Longest wait of a gloo collective in the test worlds."""


def free_port() -> int:
    """A TCP port that was free a moment ago, for ``MASTER_PORT``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.set_num_threads(1)


def _rank_main(rank: int, world_size: int, port: int, worker: Worker, payload: Any, result_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    # a short collective timeout turns a rank that stopped joining a collective into a failure, not a hang
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    try:
        result = worker(rank, world_size, payload)
        (Path(result_dir) / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    finally:
        torch.distributed.destroy_process_group()


def _zygote(
    _index: int, world_size: int, worker: str, payload: Any, result_dir: str, megatron_root: str | None
) -> None:
    """Import megatron-core once, then fork the ranks: N processes share one import instead of paying N."""
    if megatron_root is not None:
        sys.path.insert(0, megatron_root)
    install_cpu_shims()
    with warnings_silenced():  # warm the imports the forked ranks inherit
        import megatron.core.models.gpt
        import megatron.core.pipeline_parallel.schedules  # noqa: F401

    module_name, _, function_name = worker.partition(":")
    function = getattr(__import__(module_name, fromlist=[function_name]), function_name)
    mp.start_processes(
        _rank_main,
        args=(world_size, free_port(), function, payload, result_dir),
        nprocs=world_size,
        join=True,
        start_method="fork",
    )


def spawn_world(
    worker: Worker,
    world_size: int,
    result_dir: Path,
    payload: Any = None,
    megatron_root: Path | None = None,
) -> list[Any]:
    """Run ``worker(rank, world_size, payload)`` on ``world_size`` gloo processes; return every rank's result.

    One fresh process is spawned (``torch.multiprocessing.spawn``); it puts ``megatron_root`` first on
    ``sys.path``, installs the CPU shims, imports megatron-core and forks the ranks, so the import (seconds
    per process) is paid once per world. An exception on any rank is re-raised here with its traceback.

    Args:
        worker: A module-level function; its module must not import megatron at import time.
        world_size: Number of processes.
        result_dir: An empty folder where each rank leaves its pickled result.
        payload: A picklable argument passed to every rank.
        megatron_root: A folder containing ``megatron/`` to import instead of the installed megatron-core.

    Returns:
        The workers' return values, by rank.
    """
    result_dir.mkdir(parents=True, exist_ok=True)
    reference = f"{worker.__module__}:{worker.__qualname__}"
    root = None if megatron_root is None else str(megatron_root)
    mp.spawn(_zygote, args=(world_size, reference, payload, str(result_dir), root), nprocs=1, join=True)
    return [pickle.loads((result_dir / f"rank{rank}.pkl").read_bytes()) for rank in range(world_size)]


@dataclass(frozen=True)
class TinyGpt:
    """The shape of the test model: small enough that a schedule step takes milliseconds on CPU."""

    layers_per_chunk: int = 1
    hidden_size: int = 16
    num_attention_heads: int = 2
    vocab_size: int = 64
    seq_length: int = 8
    micro_batch_size: int = 2


def _batches(shape: TinyGpt, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """An endless deterministic stream of GPT microbatches (tokens, next-token labels, causal mask)."""
    generator = torch.Generator().manual_seed(seed)
    batch, seq = shape.micro_batch_size, shape.seq_length
    causal_mask = torch.ones(batch, 1, seq, seq, dtype=torch.bool).tril().logical_not()
    while True:
        tokens = torch.randint(0, shape.vocab_size, (batch, seq), generator=generator)
        yield {
            "tokens": tokens,
            "labels": torch.roll(tokens, -1, dims=1),
            "position_ids": torch.arange(seq).expand(batch, seq),
            "attention_mask": causal_mask,
            "loss_mask": torch.ones(batch, seq),
        }


def _loss(loss_mask: torch.Tensor, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    loss = torch.sum(output.float().view(-1) * loss_mask.view(-1))
    num_tokens = loss_mask.sum().to(torch.int)
    return loss, num_tokens, {"lm loss": (loss / num_tokens).detach()}


def gpt_forward_step(data_iterator: Iterator[dict], model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
    """The ``forward_step_func`` of the tiny GPT: per-token losses and the loss function."""
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return output, functools.partial(_loss, batch["loss_mask"])


class PipelineWorld:
    """megatron-core parallel state plus a tiny ``GPTModel`` split over the pipeline, inside one worker."""

    def __init__(
        self,
        pipeline_size: int,
        virtual_size: int | None = None,
        shape: TinyGpt = TinyGpt(),
        microbatch_group_size: int | None = None,
    ):
        """Initialise model parallelism (data parallel = world / pipeline) and build this rank's chunks.

        Args:
            pipeline_size: Pipeline stages.
            virtual_size: Model chunks per rank (interleaved schedule), ``None`` for plain 1F1B.
            shape: Model and batch sizes.
            microbatch_group_size: ``microbatch_group_size_per_vp_stage``; ``None`` = pipeline size.
        """
        from megatron.core import parallel_state
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.tensor_parallel.random import initialize_rng_tracker
        from megatron.core.transformer import TransformerConfig

        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=1,
            pipeline_model_parallel_size=pipeline_size,
            virtual_pipeline_model_parallel_size=virtual_size,
        )
        # megatron/core/tensor_parallel/random.py:446: model_parallel_cuda_manual_seed needs CUDA
        initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        torch.manual_seed(1234)
        self.shape = shape
        self.num_chunks = virtual_size or 1
        self.config = TransformerConfig(
            num_layers=shape.layers_per_chunk * pipeline_size * self.num_chunks,
            hidden_size=shape.hidden_size,
            num_attention_heads=shape.num_attention_heads,
            use_cpu_initialization=True,
            pipeline_model_parallel_size=pipeline_size,
            virtual_pipeline_model_parallel_size=virtual_size,
            microbatch_group_size_per_vp_stage=microbatch_group_size,
            pipeline_dtype=torch.float32,
            # megatron/core/pipeline_parallel/p2p_communication.py:419: torch.cuda.synchronize()
            batch_p2p_sync=False,
            bias_dropout_fusion=False,
            masked_softmax_fusion=False,
            bias_activation_fusion=False,
            gradient_accumulation_fusion=False,
            persist_layer_norm=False,
            apply_rope_fusion=False,
        )
        with warnings_silenced():
            self.chunks = [
                GPTModel(
                    self.config,
                    get_gpt_layer_local_spec(),
                    vocab_size=shape.vocab_size,
                    max_sequence_length=shape.seq_length,
                    pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=chunk),
                    post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=chunk),
                    vp_stage=chunk,
                )
                for chunk in range(self.num_chunks)
            ]
        self.pipeline_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.is_last_stage = parallel_state.is_pipeline_last_stage()

    def run(self, num_microbatches: int, forward_only: bool = False, seed: int = 0) -> list[float]:
        """Run one step of megatron-core's schedule for this configuration.

        Args:
            num_microbatches: Microbatches in the step.
            forward_only: Evaluation mode (no backward passes).
            seed: Seed of the data stream.

        Returns:
            The per-microbatch ``lm loss`` on the last pipeline stage, empty elsewhere.
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        interleaved = self.num_chunks > 1
        iterators = [_batches(self.shape, seed) for _ in self.chunks]
        losses = get_forward_backward_func()(
            forward_step_func=gpt_forward_step,
            data_iterator=iterators if interleaved else iterators[0],
            model=self.chunks if interleaved else self.chunks[0],
            num_microbatches=num_microbatches,
            seq_length=self.shape.seq_length,
            micro_batch_size=self.shape.micro_batch_size,
            forward_only=forward_only,
        )
        return [float(report["lm loss"]) for report in losses]

    def zero_grads(self) -> None:
        """Drop the gradients accumulated so far."""
        for chunk in self.chunks:
            chunk.zero_grad(set_to_none=True)

    def grad_norms(self) -> list[float]:
        """The gradient norm of every model chunk on this rank (0 where no gradient exists)."""
        return [
            sum(float(p.grad.norm()) ** 2 for p in chunk.parameters() if p.grad is not None) ** 0.5
            for chunk in self.chunks
        ]


@contextlib.contextmanager
def warnings_silenced() -> Iterator[None]:
    """Hide megatron-core's deprecation chatter (``GPTModel IS DEPRECATED`` and friends)."""
    import logging
    import warnings

    logger = logging.getLogger("megatron.core")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logger.setLevel(level)


class RecordingListener:
    """A ``ScheduleListener`` that keeps every event as a tuple, for assertions in the parent process."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_step_begin(self, step: int) -> None:
        self.events.append(("step_begin", step))

    def on_step_end(self, step: int) -> None:
        self.events.append(("step_end", step))

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        self.events.append(("instruction_begin", kind, microbatch, chunk))

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        self.events.append(("instruction_end", kind, microbatch, chunk))

    def on_p2p_begin(self, op: str) -> None:
        self.events.append(("p2p_begin", op))

    def on_p2p_end(self, op: str) -> None:
        self.events.append(("p2p_end", op))


def pretrain_main() -> None:
    """A tiny pretrain loop on Megatron's own argument parsing, microbatch calculator and global timers.

    Run one process per rank under ``torchrun`` (gloo over its ``env://``). Each of ``--train-iters`` steps
    is one training schedule followed by one evaluation schedule (``forward_only`` under ``no_grad``).
    """
    install_cpu_shims()
    torch.distributed.init_process_group("gloo")
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.training.arguments import parse_and_validate_args
    from megatron.training.global_vars import get_timers

    args = parse_and_validate_args()
    world = PipelineWorld(
        args.pipeline_model_parallel_size,
        args.virtual_pipeline_model_parallel_size,
        microbatch_group_size=args.microbatch_group_size_per_vp_stage,
    )
    world.config.timers = get_timers()
    for _ in range(args.train_iters):
        world.run(get_num_microbatches())
        with torch.no_grad():
            world.run(get_num_microbatches(), forward_only=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    pretrain_main()
