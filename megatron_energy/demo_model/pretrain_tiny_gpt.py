r"""Pretrain the demo's tiny GPT on CPU with megatron-core's real schedules (``megatron-energy demo``).

Run one process per rank under ``torch.distributed.run`` (gloo over its ``env://``), through the energy
launcher, exactly as a GPU job runs ``pretrain_gpt.py``::

    python -m torch.distributed.run --nproc-per-node 4 -m megatron_energy.launch \
        megatron_energy/demo_model/pretrain_tiny_gpt.py \
        --pipeline-model-parallel-size 4 --num-layers 24 --hidden-size 2048 --num-attention-heads 16 \
        --seq-length 2048 --max-position-embeddings 2048 --vocab-size 50257 --micro-batch-size 1 \
        --global-batch-size 8 --train-iters 28 --lr 1e-4 --mock-data --tokenizer-type NullTokenizer \
        --energy-optimise --energy-backend simulated --energy-gpu-spec h100-sxm

It parses Megatron's own arguments (which also sets Megatron's global variables: timers, microbatch
calculator, TensorBoard writer when ``--tensorboard-dir`` is given). The arguments describe the model whose
work simulated GPUs time; what runs on CPU is a stand-in with the same pipeline layout (pipeline and virtual
pipeline sizes, microbatches, group size, and the layers per chunk of ``--pipeline-model-parallel-layout``)
but a tiny width (``tiny_gpt.TinyGpt``), and the script says so when it starts. Each iteration is one
training step of ``get_forward_backward_func()`` followed by one evaluation step (``forward_only`` under
``no_grad``), so the hooks are seen to fire for training only. The last rank logs like Megatron:
timestamp, 1-based ``iteration N/M``, the stand-in's measured time per iteration and its loss, and writes
``lm loss`` and ``iteration-time`` to Megatron's TensorBoard writer.
"""

from __future__ import annotations

import time
from datetime import datetime

import torch

from megatron_energy.demo_model.cpu_shims import install_cpu_shims, warnings_silenced
from megatron_energy.demo_model.tiny_gpt import PipelineWorld, TinyGpt


def log_iteration(
    iteration: int, total: int, samples: int, batch: int, elapsed_ms: float, losses: list[float]
) -> None:
    """One Megatron-style iteration line (the last rank prints it, as Megatron's ``print_rank_last``)."""
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    loss = f" lm loss (CPU stand-in): {sum(losses) / len(losses):.6E} |" if losses else ""
    print(
        f" [{stamp}] iteration {iteration:>8d}/{total:>8d} | consumed samples: {samples:>12d} | "
        f"elapsed time per iteration (ms, CPU stand-in, measured): {elapsed_ms:.1f} | "
        f"global batch size: {batch:>5d} |{loss}",
        flush=True,
    )


def pretrain_main() -> None:
    """The tiny pretrain loop on Megatron's own arguments, global variables and timers (see the docstring)."""
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
            layout=args.pipeline_model_parallel_layout,
            shape=TinyGpt(num_experts=args.num_experts, moe_router_topk=args.moe_router_topk),
            expert_parallel=args.expert_model_parallel_size,
        )
    world.config.timers = get_timers()
    last_rank = torch.distributed.get_rank() == torch.distributed.get_world_size() - 1
    if last_rank:
        print(f"> CPU stand-in for the arguments' model: tiny GPTModel, {world.shape.describe()}", flush=True)
    writer = get_tensorboard_writer()
    elapsed_ms: list[float] = []
    for iteration in range(1, args.train_iters + 1):
        start = time.perf_counter()
        losses = world.run(get_num_microbatches(), seed=iteration)
        world.zero_grads()
        elapsed_ms.append(1e3 * (time.perf_counter() - start))
        with torch.no_grad():
            world.run(get_num_microbatches(), forward_only=True)
        if writer is not None and losses:
            writer.add_scalar("lm loss", sum(losses) / len(losses), iteration)
            writer.add_scalar("iteration-time", elapsed_ms[-1] / 1e3, iteration)
        if last_rank and iteration % args.log_interval == 0:
            mean_ms = sum(elapsed_ms) / len(elapsed_ms)
            log_iteration(
                iteration, args.train_iters, iteration * args.global_batch_size, args.global_batch_size,
                mean_ms, losses,
            )  # fmt: skip
            elapsed_ms.clear()
    if writer is not None:
        writer.flush()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    pretrain_main()
