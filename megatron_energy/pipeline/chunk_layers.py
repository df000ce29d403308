"""Decoder layers of every model chunk: Megatron's even split, or ``--pipeline-model-parallel-layout``'s.

Megatron splits ``num_layers`` evenly over ``stages x chunks`` model chunks unless the job gives a layout such
as ``"E|t*3|t|tL"`` (megatron-core's ``PipelineParallelLayerLayout``), which places every decoder layer, the
embedding and the loss; a chunk may then hold no decoder layer at all (an embedding-only first stage). The
embedding always runs on stage 0's chunk 0 and the LM head and loss on the last stage's last chunk (where
megatron-core's ``pre_process`` and ``post_process`` are), so the decoder counts are all that differ.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkLayers:
    """Decoder layers of every (stage, chunk): ``counts[stage][chunk]``.

    Attributes:
        counts: One row per pipeline stage, one count per model chunk of that stage.
    """

    counts: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.counts or not self.counts[0]:
            raise ValueError("a layer layout needs at least one stage and one chunk")
        if any(len(row) != len(self.counts[0]) for row in self.counts):
            raise ValueError(f"every stage must have the same number of chunks, got {self.counts}")
        if any(count < 0 for row in self.counts for count in row):
            raise ValueError(f"layer counts cannot be negative, got {self.counts}")

    @classmethod
    def even(cls, num_layers: int, num_stages: int, num_chunks: int = 1) -> ChunkLayers:
        """Megatron's default split: the same number of layers in every chunk.

        Raises:
            ValueError: If ``num_layers`` does not split evenly over ``num_stages x num_chunks`` chunks.
        """
        if num_stages <= 0 or num_chunks <= 0:
            raise ValueError(f"num_stages and num_chunks must be positive, got {num_stages}, {num_chunks}")
        if num_layers % (num_stages * num_chunks):
            raise ValueError(
                f"{num_layers} layers do not split evenly over {num_stages} stages x {num_chunks} chunks"
            )
        per_chunk = num_layers // (num_stages * num_chunks)
        return cls(tuple((per_chunk,) * num_chunks for _ in range(num_stages)))

    @property
    def num_stages(self) -> int:
        """Pipeline stages."""
        return len(self.counts)

    @property
    def num_chunks(self) -> int:
        """Model chunks per stage."""
        return len(self.counts[0])

    @property
    def num_layers(self) -> int:
        """Decoder layers of the whole model."""
        return sum(sum(row) for row in self.counts)

    @property
    def is_even(self) -> bool:
        """Whether every chunk holds the same number of layers (Megatron's default split)."""
        return len({count for row in self.counts for count in row}) == 1

    def of(self, stage: int, chunk: int) -> int:
        """Decoder layers of one model chunk."""
        return self.counts[stage][chunk]

    def describe(self) -> str:
        """The counts in words, for messages: ``stage 0: 0+1, stage 1: 3+1`` (one figure per chunk)."""
        return ", ".join(
            f"stage {stage}: {'+'.join(str(count) for count in row)}" for stage, row in enumerate(self.counts)
        )
