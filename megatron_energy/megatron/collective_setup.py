"""The job's collectives as Megatron configured them: what the collective scheduler plans live.

Read from Megatron's parsed arguments and the parallel sizes (``pipeline.job_collectives.CollectiveSetup``):

* the data-parallel size with context parallelism (the group DDP reduces over), ``--sequence-parallel``,
  ``--use-distributed-optimizer`` and ``--ddp-bucket-size``;
* the links: megatron-core places ranks tensor-parallel first, then context-, data- and pipeline-parallel
  (``initialize_model_parallel``'s default order ``tp-cp-ep-dp-pp``), so a data-parallel group crosses nodes
  when ``tp x dp`` exceeds the ranks of a node, and pipeline transfers do when ``tp x dp x pp`` does (then
  the NIC, else NVLink);
* the DDP bucket layout of this rank, when the model chunks are known (``megatron.bucket_layout``; the
  session gathers every pipeline rank's before planning);
* the levers (``pipeline.collective_levers``): ``--overlap-grad-reduce``, ``--overlap-param-gather``,
  ``--tp-comm-overlap`` and the ``pp``/``tp``/``ep`` budgets of the communicator config
  (``--nccl-communicator-config-path``), which megatron-core creates its communicators with at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from megatron_energy.pipeline.collective_levers import RuntimeLevers
from megatron_energy.pipeline.collectives import MeasuredBucket
from megatron_energy.pipeline.job_collectives import CollectiveSetup
from megatron_energy.runtime.running.communicator_budgets import FIXED_GROUPS, read_communicator_config


def collective_setup(
    args: Any,
    data_parallel: int,
    ranks_per_node: int,
    communicator_config: Mapping[str, Mapping[str, Any]] | None = None,
    buckets: tuple[MeasuredBucket, ...] | None = None,
) -> CollectiveSetup:
    """The job's collectives from Megatron's parsed arguments (module docstring).

    Args:
        args: Megatron's arguments (``megatron.training.get_args()``, or a namespace with the same names).
        data_parallel: The data-parallel size with context parallelism.
        ranks_per_node: Ranks (GPUs) of one node.
        communicator_config: The communicator config Megatron read; read from
            ``args.nccl_communicator_config_path`` when ``None``.
        buckets: This rank's DDP bucket layout (``megatron.bucket_layout.measured_buckets``), if known.

    Returns:
        The setup, with the running job's levers.

    Raises:
        BudgetError: The communicator config cannot be read.
    """
    if communicator_config is None:
        path = getattr(args, "nccl_communicator_config_path", None)
        communicator_config = {} if path is None else read_communicator_config(path)
    fixed = tuple(
        (group, int(communicator_config[group]["max_ctas"]))
        for group in FIXED_GROUPS
        if "max_ctas" in communicator_config.get(group, {})
    )
    levers = RuntimeLevers(
        overlap_grad_reduce=bool(getattr(args, "overlap_grad_reduce", False)),
        overlap_param_gather=bool(getattr(args, "overlap_param_gather", False)),
        tp_comm_overlap=bool(getattr(args, "tp_comm_overlap", False)),
        fixed_ctas=fixed,
    )
    block = args.tensor_model_parallel_size * data_parallel  # one stage's ranks, consecutive
    return CollectiveSetup(
        data_parallel=data_parallel,
        sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
        distributed_optimizer=bool(getattr(args, "use_distributed_optimizer", False)),
        bucket_elements=getattr(args, "ddp_bucket_size", None),
        dp_link="nic" if block > ranks_per_node else "nvlink",
        pp_link="nic" if block * args.pipeline_model_parallel_size > ranks_per_node else "nvlink",
        levers=levers,
        buckets=buckets,
    )
