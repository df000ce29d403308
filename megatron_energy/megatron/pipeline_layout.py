"""Decoder layers per model chunk from Megatron's uneven pipeline splits, counted by megatron-core.

megatron-core parses the layout string (``PipelineParallelLayerLayout``: ``E`` embedding, ``t`` decoder layer,
``L`` loss, ``m`` MTP layer, ``|`` between virtual stages, ``*n`` repeats) into one list of layers per
(pipeline rank, virtual stage); its virtual size is the number of stages over the pipeline size. The same
parser gives the counts here, so the plugin's chunks are the chunks Megatron builds. Multi-token-prediction
layers are not counted (the work model has none, with or without a layout). Megatron's older uneven-split
flags are counted by megatron-core's ``get_num_layers_to_build`` (:func:`split_layers`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.chunk_layers import ChunkLayers


def layout_layers(layout: Any, pipeline_size: int, num_layers: int) -> ChunkLayers:
    """The decoder layers of every (stage, chunk) of a pipeline layout.

    Args:
        layout: ``--pipeline-model-parallel-layout`` as Megatron's arguments hold it (a string, a list of
            lists, or megatron-core's ``PipelineParallelLayerLayout``).
        pipeline_size: Pipeline-parallel size.
        num_layers: ``--num-layers``.

    Returns:
        The decoder layer counts, one row per pipeline stage.

    Raises:
        EnergyValueError: If the layout places another number of decoder layers than ``--num-layers``.
    """
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    parsed = (
        layout
        if isinstance(layout, PipelineParallelLayerLayout)
        else PipelineParallelLayerLayout(layout, pipeline_size)
    )
    counts = tuple(tuple(chunk.count(LayerType.decoder) for chunk in row) for row in parsed.layout)
    layers = ChunkLayers(counts)
    if layers.num_layers != num_layers:
        raise EnergyValueError(
            f"--pipeline-model-parallel-layout {layout} places {layers.num_layers} decoder layers but "
            f"--num-layers is {num_layers}; give them the same count"
        )
    return layers


UNEVEN_SPLIT_ARGS = {
    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split": "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split": "account_for_loss_in_pipeline_split",
}
"""Megatron's other uneven-split flags (argument name -> ``TransformerConfig`` field)."""


def split_layers(args: Any) -> ChunkLayers:
    """Decoder layers per chunk under Megatron's uneven-split flags, from megatron-core's own count.

    ``get_num_layers_to_build`` counts one (stage, chunk) from the config fields of
    :data:`UNEVEN_SPLIT_ARGS`; it is asked for every stage and chunk here.
    """
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    stages, chunks = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size
    config = SimpleNamespace(
        pipeline_model_parallel_layout=None,
        num_layers=args.num_layers,
        pipeline_model_parallel_size=stages,
        virtual_pipeline_model_parallel_size=chunks,
        **{field: getattr(args, name, None) for name, field in UNEVEN_SPLIT_ARGS.items()},
    )
    return ChunkLayers(
        tuple(
            tuple(
                get_num_layers_to_build(config, vp_stage=chunk, pp_rank=stage) for chunk in range(chunks or 1)
            )
            for stage in range(stages)
        )
    )


def job_layers(args: Any) -> ChunkLayers | None:
    """Decoder layers per chunk from Megatron's parsed arguments; ``None`` for the even split.

    A ``--pipeline-model-parallel-layout`` is read with megatron-core's parser (:func:`layout_layers`); the
    uneven-split flags (``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``,
    ``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``) with its layer
    count (:func:`split_layers`).
    """
    layout = getattr(args, "pipeline_model_parallel_layout", None)
    if layout is not None:
        return layout_layers(layout, args.pipeline_model_parallel_size, args.num_layers)
    if any(getattr(args, name, None) for name in UNEVEN_SPLIT_ARGS):
        return split_layers(args)
    return None
