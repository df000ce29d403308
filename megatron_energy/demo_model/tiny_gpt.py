"""The demo's model: a tiny ``GPTModel`` split over megatron-core's pipeline, one training step at a time.

:class:`PipelineWorld` initialises megatron-core's parallel state (tensor parallel 1, the given pipeline and
virtual-pipeline sizes, data parallel = world / pipeline) and builds this rank's model chunks with
``get_gpt_layer_local_spec`` (no Transformer Engine, no Apex, fusions off); :meth:`PipelineWorld.run` runs one
step of ``get_forward_backward_func()``, megatron-core's real schedule. Call
:func:`~megatron_energy.demo_model.cpu_shims.install_cpu_shims` first in the process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from megatron_energy.demo_model.cpu_shims import install_moe_cpu_shims, warnings_silenced


@dataclass(frozen=True)
class TinyGpt:
    """The shape of the CPU model: small enough that a schedule step takes milliseconds on CPU."""

    layers_per_chunk: int = 1
    hidden_size: int = 16
    num_attention_heads: int = 2
    vocab_size: int = 64
    seq_length: int = 8
    micro_batch_size: int = 2
    num_experts: int | None = None
    """Experts of every layer's MoE MLP (megatron-core's ``MoELayer``); ``None``: a dense MLP."""
    moe_router_topk: int = 2
    """Experts each token is routed to (with ``num_experts``)."""

    def describe(self) -> str:
        """The shape in words, for the log."""
        moe = "" if self.num_experts is None else f", {self.num_experts} experts top-{self.moe_router_topk}"
        return (
            f"{self.layers_per_chunk} layer per model chunk, hidden size {self.hidden_size}, "
            f"{self.num_attention_heads} heads, vocabulary {self.vocab_size}, sequence {self.seq_length}, "
            f"micro batch {self.micro_batch_size}{moe}"
        )


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


def _num_layers(shape: TinyGpt, num_model_chunks: int, layout: str | None) -> int:
    """Decoder layers of the whole model: the layout's ``t`` count, else ``layers_per_chunk`` per chunk."""
    if layout is None:
        return shape.layers_per_chunk * num_model_chunks
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    stages = PipelineParallelLayerLayout.parse_str_to_list(layout)
    return sum(stage.count(LayerType.decoder) for stage in stages)


def _moe_settings(shape: TinyGpt, expert_parallel: int) -> dict[str, object]:
    """``TransformerConfig`` fields of the MoE MLP (none for a dense model): the all-to-all dispatcher."""
    if shape.num_experts is None:
        return {}
    return {
        "num_moe_experts": shape.num_experts,
        "moe_router_topk": shape.moe_router_topk,
        "moe_token_dispatcher_type": "alltoall",
        "expert_model_parallel_size": expert_parallel,
    }


class PipelineWorld:
    """megatron-core parallel state plus a tiny ``GPTModel`` split over the pipeline, inside one worker."""

    def __init__(
        self,
        pipeline_size: int,
        virtual_size: int | None = None,
        shape: TinyGpt = TinyGpt(),
        microbatch_group_size: int | None = None,
        layout: str | None = None,
        expert_parallel: int = 1,
    ):
        """Initialise model parallelism (data parallel = world / pipeline) and build this rank's chunks.

        Args:
            pipeline_size: Pipeline stages.
            virtual_size: Model chunks per rank (interleaved schedule), ``None`` for plain 1F1B.
            shape: Model and batch sizes.
            microbatch_group_size: ``microbatch_group_size_per_vp_stage``; ``None`` = pipeline size.
            layout: Megatron's ``--pipeline-model-parallel-layout`` (e.g. ``"E|t*3|t|tL"``): the decoder
                layers of every model chunk, built as megatron-core builds them (``shape.layers_per_chunk``
                is then unused); its virtual size must be ``virtual_size``.
            expert_parallel: Expert-parallel size (with ``shape.num_experts``): the experts split over that
                many data-parallel ranks, tokens exchanged by the ``alltoall`` dispatcher.
        """
        from megatron.core import parallel_state
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.tensor_parallel.random import initialize_rng_tracker
        from megatron.core.transformer import TransformerConfig

        if shape.num_experts is not None:
            install_moe_cpu_shims()
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=1,
            pipeline_model_parallel_size=pipeline_size,
            virtual_pipeline_model_parallel_size=virtual_size,
            expert_model_parallel_size=expert_parallel,
        )
        # megatron/core/tensor_parallel/random.py:446: model_parallel_cuda_manual_seed needs CUDA
        initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        torch.manual_seed(1234)
        self.shape = shape
        self.num_chunks = virtual_size or 1
        self.config = TransformerConfig(
            num_layers=_num_layers(shape, pipeline_size * self.num_chunks, layout),
            pipeline_model_parallel_layout=layout,
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
            **_moe_settings(shape, expert_parallel),
        )
        with warnings_silenced():
            self.chunks = [
                GPTModel(
                    self.config,
                    get_gpt_layer_local_spec(num_experts=shape.num_experts),
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
