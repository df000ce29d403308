"""Decoder layers per model chunk from Megatron's ``--pipeline-model-parallel-layout``, read by megatron-core.

megatron-core parses the layout string (``PipelineParallelLayerLayout``: ``E`` embedding, ``t`` decoder layer,
``L`` loss, ``m`` MTP layer, ``|`` between virtual stages, ``*n`` repeats) into one list of layers per
(pipeline rank, virtual stage); its virtual size is the number of stages over the pipeline size. The same
parser gives the counts here, so the plugin's chunks are the chunks Megatron builds. Multi-token-prediction
layers are not counted (the work model has none, with or without a layout).
"""

from __future__ import annotations

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


def job_layers(args: Any) -> ChunkLayers | None:
    """The layout's decoder layers per chunk from Megatron's parsed arguments; ``None`` without a layout."""
    layout = getattr(args, "pipeline_model_parallel_layout", None)
    if layout is None:
        return None
    return layout_layers(layout, args.pipeline_model_parallel_size, args.num_layers)
