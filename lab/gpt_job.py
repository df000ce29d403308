"""The GPT job the GPU scripts train: the issue's shape, flags known to run on one H200 without TE or Apex.

16 layers, hidden 2048, 16 heads, seq 2048, bf16, mock data with the NullTokenizer, Megatron's own
per-iteration log with energy (``--log-interval 1 --log-energy``), the local transformer implementation.
``lab/bench_overhead.py`` and ``lab/gpu_validate.py`` differ only in the batch and the iterations;
``lab/bench_recorded_step.py`` also trains the user-shaped variant (:data:`USER_SHAPED`).
"""

from __future__ import annotations

FIXED = (
    "--num-layers 16 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
    "--max-position-embeddings 2048 --lr 1e-4 --bf16 "
    "--mock-data --tokenizer-type NullTokenizer --vocab-size 32000 --log-interval 1 --log-energy "
    "--eval-iters 0 --eval-interval 1000000 --transformer-impl local --no-gradient-accumulation-fusion "
    "--no-masked-softmax-fusion --no-persist-layer-norm --no-rope-fusion"
)

USER_SHAPED = (
    "--group-query-attention --num-query-groups 4 --swiglu --normalization RMSNorm "
    "--position-embedding-type rope --use-distributed-optimizer --overlap-grad-reduce --manual-gc"
)
"""The shape users train (grouped-query attention, SwiGLU, RMSNorm, RoPE, the distributed optimizer with the
gradient reduction overlapped, Megatron's manual garbage collection), still ``--transformer-impl local``;
each flag checked against megatron-core 0.19's ``megatron/training/arguments.py`` parser."""


def gpt_args(
    microbatches: int, micro_batch_size: int, train_iters: int, pipeline: int = 1, user_shaped: bool = False
) -> list[str]:
    """Megatron's flags for the job.

    Args:
        microbatches: Microbatches per iteration (global batch = microbatches x micro batch size, DP=1).
        micro_batch_size: Sequences per microbatch.
        train_iters: Training iterations.
        pipeline: Pipeline-parallel size.
        user_shaped: Add :data:`USER_SHAPED`.

    Returns:
        The arguments after ``scripts/pretrain_gpt.py``.
    """
    return [
        *FIXED.split(),
        *(USER_SHAPED.split() if user_shaped else ()),
        "--micro-batch-size",
        str(micro_batch_size),
        "--global-batch-size",
        str(microbatches * micro_batch_size),
        "--pipeline-model-parallel-size",
        str(pipeline),
        "--train-iters",
        str(train_iters),
    ]
