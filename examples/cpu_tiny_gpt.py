"""Pretrain a tiny GPT on CPU with megatron-core's real pipeline schedules (`megatron-energy demo`).

Run one process per rank under ``torchrun`` (gloo over its ``env://``), usually through the energy launcher,
exactly as a GPU job would run ``pretrain_gpt.py``::

    torchrun --nproc-per-node 4 -m megatron_energy.launch examples/cpu_tiny_gpt.py \
        --pipeline-model-parallel-size 4 --num-layers 4 --hidden-size 16 --num-attention-heads 2 \
        --seq-length 8 --max-position-embeddings 8 --vocab-size 64 --micro-batch-size 2 \
        --global-batch-size 16 --train-iters 10 --lr 1e-4 --mock-data --tokenizer-type NullTokenizer \
        --energy-optimise --energy-backend simulated --energy-gpu-spec h100-sxm

It parses Megatron's own arguments, sets Megatron's global variables (timers, microbatch calculator,
TensorBoard writer when ``--tensorboard-dir`` is given), builds megatron-core's parallel state and a tiny
``GPTModel`` (``get_gpt_layer_local_spec``: no Transformer Engine, no Apex, fusions off) split into pipeline
stages and virtual-pipeline chunks, and runs ``get_forward_backward_func()`` each iteration, logging like
Megatron (timestamp, ``iteration N/M``, time per iteration, loss).

megatron-core needs a few CPU workarounds to run its schedules without CUDA. They live here, in a training
script outside the package (the package never patches torch or megatron), and the tests reuse them; each
names the megatron-core 0.19.2 line it works around:

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
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
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
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.set_num_threads(1)


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


def _log_iteration(iteration: int, total: int, elapsed_ms: float, losses: list[float]) -> None:
    """One Megatron-style iteration line (printed by the last pipeline stage, as Megatron does)."""
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    loss = f" | lm loss: {sum(losses) / len(losses):.6E}" if losses else ""
    print(
        f" [{stamp}] iteration {iteration:>8d}/{total:>8d} | elapsed time per iteration (ms): "
        f"{elapsed_ms:.1f}{loss} |",
        flush=True,
    )


def pretrain_main() -> None:
    """The tiny pretrain loop on Megatron's own arguments, global variables and timers (see the docstring).

    Each of ``--train-iters`` iterations is one training schedule followed by one evaluation schedule
    (``forward_only`` under ``no_grad``), so the hooks are seen to fire for training only.
    """
    install_cpu_shims()
    torch.distributed.init_process_group("gloo")
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.training.arguments import parse_and_validate_args
    from megatron.training.global_vars import get_tensorboard_writer, get_timers

    with warnings_silenced():
        args = parse_and_validate_args()  # also sets Megatron's global variables (timers, TensorBoard writer)
        world = PipelineWorld(
            args.pipeline_model_parallel_size,
            args.virtual_pipeline_model_parallel_size,
            microbatch_group_size=args.microbatch_group_size_per_vp_stage,
        )
    world.config.timers = get_timers()
    for iteration in range(1, args.train_iters + 1):
        start = time.perf_counter()
        losses = world.run(get_num_microbatches(), seed=iteration)
        world.zero_grads()
        elapsed_ms = 1e3 * (time.perf_counter() - start)
        with torch.no_grad():
            world.run(get_num_microbatches(), forward_only=True)
        if world.is_last_stage and iteration % args.log_interval == 0:
            _log_iteration(iteration, args.train_iters, elapsed_ms, losses)
    writer = get_tensorboard_writer()
    if writer is not None:
        writer.flush()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    pretrain_main()
