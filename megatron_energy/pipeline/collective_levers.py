"""What a running job lets a plan change about its collectives: Megatron's flags and communicator config.

Planning offline (``simulate``, ``plan --config``) every lever is free: a plan then says which flags and
communicator config to start the job with
(``runtime.running.communicator_budgets.plan_communicator_config``). A live session plans for the job as
Megatron started it, and the runtime refuses what that job cannot honour (``megatron.collective_launch``), so
:class:`RuntimeLevers` narrows the search to what it can:

* gradient reductions (``dp.reduce_scatter`` / ``dp.all_reduce``) move only with ``--overlap-grad-reduce``
  (without it megatron-core reduces synchronously at the end of the rank's last instruction); their CTA
  budgets are free (the runtime creates one communicator per budget);
* parameter all-gathers launch where ``--overlap-param-gather`` says, with NCCL's budget (they share the
  reduction's communicator, whose budget the runtime does not swap for them);
* pipeline p2p and NCCL tensor-parallel collectives keep the budget their communicator was created with
  (``--nccl-communicator-config-path``: megatron-core creates them once, at start-up);
* tensor-parallel collectives overlap their GEMMs only under ``--tp-comm-overlap`` (Transformer Engine's
  userbuffers, which take their SMs from ``--tp-comm-overlap-cfg``, a file this runtime neither reads nor
  writes), and then always do.

Clock offsets stay free: the runtime sets every instruction's clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeLevers:
    """The collective settings a running job was started with (module docstring)."""

    overlap_grad_reduce: bool = False
    """``--overlap-grad-reduce``."""

    overlap_param_gather: bool = False
    """``--overlap-param-gather``."""

    tp_comm_overlap: bool = False
    """``--tp-comm-overlap`` (Transformer Engine userbuffers)."""

    fixed_ctas: tuple[tuple[str, int], ...] = ()
    """``(group, max_ctas)`` of the groups whose communicator config sets a budget (``pp``, ``tp``); a group
    not listed runs with NCCL's default."""

    def fixed_budget(self, group: str) -> int | None:
        """The budget megatron-core created ``group``'s communicator with; ``None``: NCCL's default."""
        return dict(self.fixed_ctas).get(group)
