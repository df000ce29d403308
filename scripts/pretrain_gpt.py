r"""Pretrain a GPT with megatron-core 0.19's own training loop: no Megatron-LM checkout needed.

Megatron-LM's ``pretrain_gpt.py`` is not in the megatron-core wheel; this is a small equivalent on
``megatron.training.pretrain`` (the 0.19 signature: a ``PretrainConfigContainer`` first, the model built from
its ``GPTModelConfig``), reading ``MockGPTDataset`` (``--mock-data``) or ``GPTDataset`` (``--data-path``).
Every Megatron flag works as usual (TP/PP/VPP/CP/DP, ``--bf16``, ``--transformer-impl``...). GPU only:
``initialize_megatron`` asserts CUDA.

Energy run on one 8-GPU node (``--energy-dry-run`` records clocks instead of setting them)::

    torchrun --nproc-per-node 8 -m megatron_energy.launch scripts/pretrain_gpt.py \
        --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
        --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 \
        --pipeline-model-parallel-size 4 --train-iters 50 --lr 1e-4 --bf16 \
        --mock-data --tokenizer-type NullTokenizer --vocab-size 32000 \
        --energy-optimise --energy-dry-run

Every tensor-parallel rank reads the (deterministic) data itself instead of receiving a broadcast from
tensor-parallel rank 0; only the first and last pipeline stage read data at all.
"""

from __future__ import annotations

import importlib.util
from functools import partial
from pathlib import Path
from typing import Any

import torch
from megatron.core import mpu
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.enums import ModelType
from megatron.core.utils import get_attr_wrapped_model, get_batch_on_this_cp_rank
from megatron.training import get_args, get_timers, get_tokenizer, pretrain, print_rank_0
from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
from megatron.training.arguments import parse_and_validate_args
from megatron.training.utils import get_blend_and_blend_per_split, is_first_or_last_pipeline_stage


def get_batch(data_iterator: Any, vp_stage: int | None) -> dict[str, torch.Tensor | None]:
    """This rank's microbatch on the GPU, its sequence split for context parallelism.

    Stages between the first and the last take activations from the previous stage, so they get ``None``s.
    """
    keys = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
    if not is_first_or_last_pipeline_stage(vp_stage):
        return dict.fromkeys(keys)
    sample = next(data_iterator)
    batch = {key: sample[key].cuda(non_blocking=True) if key in sample else None for key in keys}
    return get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=mpu.get_context_parallel_group())


def loss_func(
    loss_mask: torch.Tensor, output_tensor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Summed token loss, its token count, and the ``lm loss`` report Megatron averages over data parallel."""
    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}


def forward_step(data_iterator: Any, model: torch.nn.Module) -> tuple[torch.Tensor, Any]:
    """Megatron's ``forward_step_func``: run the model chunk on one microbatch, return the loss function."""
    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    batch = get_batch(data_iterator, get_attr_wrapped_model(model, "vp_stage"))
    timers("batch-generator").stop()
    output_tensor = model(
        batch["tokens"],
        batch["position_ids"],
        batch["attention_mask"],
        labels=batch["labels"],
        loss_mask=batch["loss_mask"],
    )
    return output_tensor, partial(loss_func, batch["loss_mask"])


def train_valid_test_datasets_provider(
    train_val_test_num_samples: list[int], vp_stage: int | None = None
) -> Any:
    """Build the train, validation and test datasets on the ranks that read data."""
    args = get_args()
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=args.split,
        path_to_cache=args.data_cache_path,
        tokenizer=get_tokenizer(),
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
    )
    dataset_type = MockGPTDataset if args.mock_data else GPTDataset
    print_rank_0(f"> building {dataset_type.__name__} train, validation and test datasets ...")
    return BlendedMegatronDatasetBuilder(
        dataset_type, train_val_test_num_samples, partial(is_first_or_last_pipeline_stage, vp_stage), config
    ).build()


# every rank that reads data builds its own datasets (no broadcast from tensor-parallel rank 0)
train_valid_test_datasets_provider.is_distributed = True  # type: ignore[attr-defined]


def use_prebuilt_dataset_helpers() -> None:
    """Skip the dataset-helper compile step when the compiled extension is already installed.

    ``training/initialize.py:_compile_dependencies`` runs ``make`` in ``megatron/core/datasets``
    (``core/datasets/utils.py:25``); the megatron-core wheel ships the compiled ``helpers_cpp`` but not that
    Makefile, so ``make`` fails and training exits. With the extension present there is nothing to compile.
    A Megatron-LM checkout (which has the Makefile) is left alone.
    """
    from megatron.core.datasets import utils as dataset_utils

    folder = Path(dataset_utils.__file__).parent
    if not (folder / "Makefile").exists() and importlib.util.find_spec("megatron.core.datasets.helpers_cpp"):
        dataset_utils.compile_helpers = lambda: None


def main() -> None:
    """Parse Megatron's flags and train."""
    use_prebuilt_dataset_helpers()
    args = parse_and_validate_args(args_defaults={"tokenizer_type": "NullTokenizer"})
    full_config = pretrain_cfg_container_from_args(args, gpt_config_from_args(args))
    pretrain(full_config, train_valid_test_datasets_provider, ModelType.encoder_or_decoder, forward_step)


if __name__ == "__main__":
    main()
