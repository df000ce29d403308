"""A job's collectives as its launcher or job file describes them, before the GPU is known.

:class:`CollectiveSetup` is what the Megatron adapter reads from Megatron's arguments and parallel state (or
``job.JobConfig`` from a job file): parallel sizes, optimizer and DDP settings, which links the groups cross,
and, for a running job, its levers (``pipeline.collective_levers``). With the model shape, the executed
orders and the GPU spec it becomes the :class:`~megatron_energy.pipeline.collectives.CollectiveWorkload` the
planner uses (:meth:`CollectiveSetup.workload`): the one place where links get their bandwidths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.collective_levers import RuntimeLevers
from megatron_energy.pipeline.collectives import CollectiveWorkload, Link, MeasuredBucket
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.workload import TransformerShape


@dataclass(frozen=True)
class CollectiveSetup:
    """Everything about a job's collectives but the model shape, the orders and the GPU (module docstring)."""

    data_parallel: int
    """Data-parallel size, context parallelism included (the group DDP reduces over)."""

    sequence_parallel: bool = False
    """``--sequence-parallel``."""

    distributed_optimizer: bool = True
    """``--use-distributed-optimizer``."""

    bucket_elements: int | None = None
    """``--ddp-bucket-size``; ``None``: megatron-core's default."""

    dp_link: Link = "nvlink"
    """The link the data-parallel group crosses."""

    pp_link: Link = "nvlink"
    """The link pipeline transfers cross."""

    dp_bandwidth_gbps: float | None = None
    """Bandwidth of the data-parallel link per GPU and direction; ``None``: the GPU spec's for ``dp_link``."""

    pp_bandwidth_gbps: float | None = None
    """Bandwidth of the pipeline link; ``None``: the GPU spec's for ``pp_link``."""

    levers: RuntimeLevers | None = None
    """What the running job lets a plan change; ``None`` when planning offline (every lever free)."""

    buckets: tuple[MeasuredBucket, ...] | None = None
    """The running job's DDP bucket layout (this rank's, until the session gathers every pipeline rank's);
    ``None``: modelled from ``bucket_elements``."""

    def __post_init__(self) -> None:
        if self.data_parallel < 1:
            raise EnergyValueError(f"data-parallel size must be positive, got {self.data_parallel}")
        if self.bucket_elements is not None and self.bucket_elements < 1:
            raise EnergyValueError(f"a DDP bucket must hold at least one element, got {self.bucket_elements}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CollectiveSetup:
        """Read back ``dataclasses.asdict`` of a setup (as a job folder's ``job.json`` holds it).

        Raises:
            EnergyValueError: If ``data`` is not such a mapping.
        """
        try:
            fields = dict(data)
            levers = fields.pop("levers", None)
            if levers is not None:
                fixed = tuple((str(group), int(ctas)) for group, ctas in levers.get("fixed_ctas", ()))
                levers = RuntimeLevers(**{**levers, "fixed_ctas": fixed})
            buckets = fields.pop("buckets", None)
            if buckets is not None:
                buckets = tuple(
                    MeasuredBucket(**{**bucket, "layers": tuple(bucket["layers"])}) for bucket in buckets
                )
            return cls(**fields, levers=levers, buckets=buckets)
        except (TypeError, ValueError, AttributeError) as error:
            raise EnergyValueError(f"not a collective setup ({error}): {dict(data)!r}") from None

    def workload(self, shape: TransformerShape, orders: PipelineOrders, spec: GpuSpec) -> CollectiveWorkload:
        """The collective workload of this job on ``spec`` (tensor-parallel groups inside a node, NVLink).

        Args:
            shape: The model shape (micro-batch size and TP degree included).
            orders: Every rank's executed instruction order.
            spec: The GPU spec (link bandwidths).

        Raises:
            EnergyValueError: If the orders' layout does not divide the model's layers.
        """
        if shape.num_layers % (orders.num_stages * orders.num_chunks):
            raise EnergyValueError(
                f"{shape.num_layers} layers do not split evenly over {orders.num_stages} pipeline stages x "
                f"{orders.num_chunks} model chunks: the collectives' buckets cannot be placed"
            )
        return CollectiveWorkload(
            shape=shape,
            orders=orders,
            data_parallel=self.data_parallel,
            sequence_parallel=self.sequence_parallel,
            distributed_optimizer=self.distributed_optimizer,
            dp_link=self.dp_link,
            dp_bandwidth_gbps=self.dp_bandwidth_gbps or spec.link_bandwidth_gbps(self.dp_link),
            pp_link=self.pp_link,
            pp_bandwidth_gbps=self.pp_bandwidth_gbps or spec.link_bandwidth_gbps(self.pp_link),
            tp_bandwidth_gbps=spec.nvlink_bandwidth_gbps,
            ep_link=_ep_link(shape, spec),
            ep_bandwidth_gbps=None if shape.moe is None else shape.moe.all_to_all_bandwidth_gbps,
            bucket_elements=self.bucket_elements,
            levers=self.levers,
            measured_buckets=self.buckets,
        )


def _ep_link(shape: TransformerShape, spec: GpuSpec) -> Link:
    """The expert-parallel group's link: the NIC where the job gives it less bandwidth than NVLink."""
    bandwidth = None if shape.moe is None else shape.moe.all_to_all_bandwidth_gbps
    return "nic" if bandwidth is not None and bandwidth < spec.nvlink_bandwidth_gbps else "nvlink"
