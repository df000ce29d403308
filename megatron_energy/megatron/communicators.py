"""One NCCL communicator per SM (CTA) budget: how a plan's budgets become communicators.

**Why more than one.** NCCL fixes a communicator's ``minCTAs``/``maxCTAs`` when it is created
(``ncclCommInitRankConfig``), and megatron-core creates its communicators once, in
``parallel_state.initialize_model_parallel``, from ``--nccl-communicator-config-path``
(``get_nccl_options``). ``NCCL_MIN_NCHANNELS``/``NCCL_MAX_NCHANNELS`` are process-global and read at
initialisation, so they cannot vary by phase either. A budget that changes within an iteration (bucket 0 of
the gradient reduction on 8 SMs under a GEMM-heavy backward, bucket 3 on 32 in the bubble) therefore needs
one communicator per budget over the same ranks, chosen per launch.

**Design.**

1. *Fixed budgets* (one per group for the whole run, known before Megatron starts, e.g. from a cached plan,
   and the only way for ``pp``/``tp``, whose launches are not retimed): written into the YAML Megatron
   reads (``runtime.running.communicator_budgets.communicator_config`` / ``write_communicator_config``); no
   extra communicator, no extra memory.
2. *Varying budgets* (the plan's, known after profiling): :class:`BudgetCommunicators` creates, per base
   communicator and distinct budget of the plan (over *all* its points, so a straggler's switch of point
   needs nothing new), one communicator over the same ranks in the same order
   (``torch.distributed.new_group(ranks, backend="nccl", pg_options=...)``, with
   ``use_local_synchronization=True`` so only members take part). The options are built by megatron-core's
   own ``parallel_state.get_nccl_options`` from the group's entry of the job's communicator config with the
   budget set, so everything else (``cga_cluster_size``, ``is_high_priority_stream``, ``net_name``) is what
   Megatron would give the base communicator. Every member rank creates the same budgets in the same
   (ascending) order: a data-parallel group's members all run the same pipeline stage, hence the same plan
   rank.
3. *Choice per launch*: ``megatron.collective_launch`` swaps the bucket group's communicator attribute
   (``data_parallel_group`` or ``intra_distributed_optimizer_instance_group``, plain attributes of
   megatron-core's ``_ParamAndGradBucketGroup``) to the budget's communicator for the one ``start_grad_sync``
   call; the returned handle belongs to that communicator, which ``finish_grad_sync`` waits on.

**Cost.** Each extra communicator holds its own NCCL buffers and channels on the GPU (and a proxy thread);
torch creates it lazily at its first collective unless the process group is bound to a device.
``lab/measure_communicator_memory.py`` measures the memory per communicator and budget on one GPU
(``torch.cuda.memory_reserved`` and NVML used memory before and after; reads only).

**Not covered.** Expert-parallel bucket groups (``expert_parallel_bucket_groups``) and
``--num-distributed-optimizer-instances`` > 1 (two-level reduction on a side stream); gloo groups have no
CTA budgets at all (refused).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from megatron_energy.runtime.running.communicator_budgets import BudgetError, CtaBudget, communicator_config

NewGroup = Callable[..., Any]


def nccl_options(budget: CtaBudget, base_config: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    """The ``ProcessGroupNCCL.Options`` megatron-core builds for a budget's communicator.

    Args:
        budget: The group and its CTA budget.
        base_config: The job's ``--nccl-communicator-config-path`` mapping (other keys of the group's entry
            are kept).

    Returns:
        ``torch.distributed.ProcessGroupNCCL.Options`` with ``config.max_ctas`` (and ``min_ctas``) set.
    """
    from megatron.core import parallel_state

    base = {budget.group: dict((base_config or {}).get(budget.group, {}))}
    return parallel_state.get_nccl_options(budget.group, communicator_config([budget], base))


def require_nccl(group: Any, what: str) -> None:
    """Refuse a CTA budget on a communicator that is not NCCL.

    Raises:
        BudgetError: The group's backend is not NCCL (gloo, ucc, ...).
    """
    import torch.distributed as dist

    backend = str(dist.get_backend(group))
    if backend != "nccl":
        raise BudgetError(
            f"{what} asks for a CTA (SM) budget, but its process group runs on {backend}, which has none: "
            "CTA budgets are NCCL communicator settings. Run on GPUs with NCCL, or plan without budgets "
            "(max_ctas: null)"
        )


class BudgetCommunicators:
    """Per-budget communicators over the same ranks as a base communicator, created once, chosen per launch.

    Args:
        base_config: The job's communicator config (``read_communicator_config`` of
            ``--nccl-communicator-config-path``), or ``None``.
        new_group: Creates a process group (``torch.distributed.new_group`` by default; tests pass a recorder
            to see what would be created).
    """

    def __init__(
        self, base_config: Mapping[str, Mapping[str, Any]] | None = None, new_group: NewGroup | None = None
    ) -> None:
        self.base_config = {group: dict(entry) for group, entry in (base_config or {}).items()}
        self._new_group = new_group
        self._made: dict[tuple[int, int], Any] = {}

    def prepare(self, base: Any, budgets: Iterable[CtaBudget], what: str, check_backend: bool = True) -> None:
        """Create the communicators of ``budgets`` over ``base``'s ranks (ascending budget; idempotent).

        Every member rank of ``base`` must call this with the same budgets.

        Args:
            base: The communicator megatron-core runs the collective on.
            budgets: Its budgets (their ``group`` names the config entry the options start from).
            what: Which collective, for messages.
            check_backend: Refuse a base that is not NCCL (tests of the options boundary switch it off).

        Raises:
            BudgetError: ``base`` is not an NCCL group.
        """
        import torch.distributed as dist

        if check_backend:
            require_nccl(base, what)
        ranks = dist.get_process_group_ranks(base)
        new_group = self._new_group or dist.new_group
        for budget in sorted(budgets, key=lambda b: b.max_ctas):
            key = (id(base), budget.max_ctas)
            if key in self._made:
                continue
            self._made[key] = new_group(
                ranks=ranks,
                backend="nccl",
                pg_options=nccl_options(budget, self.base_config),
                use_local_synchronization=True,
                group_desc=budget.label,
            )

    def get(self, base: Any, max_ctas: int) -> Any:
        """The communicator of ``base``'s ranks with budget ``max_ctas``.

        Raises:
            BudgetError: It was not prepared.
        """
        try:
            return self._made[(id(base), max_ctas)]
        except KeyError:
            raise BudgetError(
                f"no communicator with a budget of {max_ctas} CTAs was prepared for this group; prepare the "
                "budgets of every point of the plan before training"
            ) from None
