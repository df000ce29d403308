"""Launch DDP gradient reductions at a plan's launch points, on the planned communicator (CTA budget).

megatron-core's ``DistributedDataParallel`` groups gradient buckets into bucket groups
(``_ParamAndGradBucketGroup``, ``distributed/param_and_grad_buffer.py``). With ``--overlap-grad-reduce`` a
group's ``start_grad_sync`` is called as soon as its last gradient of the last microbatch is accumulated
(``register_grad_ready``, from the backward post-hook), or, with ``--align-grad-reduce`` on later pipeline
ranks and in the interleaved schedule, by ``config.grad_sync_func``; ``finish_grad_sync`` (from
``finalize_model_grads``, at the end of the schedule) waits on its handle. That is the seam used here.

:class:`CollectiveLauncher` replaces, on the planned bucket groups only, the *instance* attributes
``start_grad_sync`` and ``finish_grad_sync`` (the class and every other group stay untouched):

- a call from Megatron before the planned point is held (the launch is *deferred*);
- at the planned boundary (an instruction's begin or end hook; the launcher is a ``ScheduleListener``) the
  group's own ``start_grad_sync`` runs; a later call from Megatron in the same step is then a no-op (the
  launch was *forced* earlier than Megatron would have made it);
- with a CTA budget, the group's communicator attribute is swapped for that call to the budget's
  communicator (``megatron.communicators``);
- ``finish_grad_sync`` of a group whose point never came (it cannot happen for a checked plan) launches it
  first, so gradients are always reduced, and records the miss.

A plan the job cannot honour is refused when the launcher is built (:class:`CollectivePlanError` /
``BudgetError``, each naming what and how to fix): an unknown or non-retimable collective (pp, tp, cp), a
bucket this rank does not have, a reduce-scatter without the distributed optimizer (or an all-reduce with
it), ``--overlap-grad-reduce`` off, a launch point before the bucket's gradients exist, a CTA budget on a
gloo group, several distributed-optimizer instances, and parameter all-gathers (not retimed yet). With no
collective actions nothing is replaced, so Megatron behaves exactly as without the launcher.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from megatron_energy.megatron.communicators import BudgetCommunicators, require_nccl
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.plan import Action, Boundary, CollectiveAction
from megatron_energy.runtime.collective_points import (
    INSTRUCTION_END,
    CollectivePlanError,
    boundary_label,
    bucket_collective_name,
    check_gradient_launch,
    parse_collective,
)
from megatron_energy.runtime.communicator_budgets import CtaBudget, collective_group


@dataclass(frozen=True)
class Launch:
    """One launch the runtime made (for logs and tests)."""

    step: int
    """Training step (schedule) number."""
    collective: str
    """The plan's collective name."""
    where: str
    """``start of B3c1`` / ``end of B3c1``, or ``finish_grad_sync (missed its point)``."""
    max_ctas: int | None
    """The budget it ran with; ``None``: the base communicator."""


@dataclass
class _PlannedBucket:
    """A planned bucket group and its state in the current step."""

    action: CollectiveAction
    chunk: int
    group: Any
    group_attr: str
    start: Callable[..., Any]
    finish: Callable[..., Any]
    launched: bool = False
    request: dict[str, Any] = field(default_factory=dict)


def bucket_groups(model_chunks: Sequence[Any]) -> list[tuple[int, Any]]:
    """This rank's dense bucket groups as ``(chunk, group)``, numbered as plans name them (chunk order)."""
    return [(chunk, group) for chunk, ddp in enumerate(model_chunks) for group in ddp.bucket_groups]


def bucket_layout(model_chunks: Sequence[Any]) -> list[tuple[str, int, int]]:
    """``(name, chunk, elements)`` of every bucket group's gradient reduction on this rank, for planning."""
    layout = []
    for index, (chunk, group) in enumerate(bucket_groups(model_chunks)):
        op = "reduce_scatter" if group.ddp_config.use_distributed_optimizer else "all_reduce"
        elements = sum(bucket.grad_data.numel() for bucket in group.buckets)
        layout.append((bucket_collective_name(op, index), chunk, elements))
    return layout


class CollectiveLauncher:
    """Applies one rank's collective actions to megatron-core's DDP bucket groups, at the hooks' boundaries.

    Feed it the schedule events (``ScheduleListener``), e.g. through ``ListenerFanout``.

    Args:
        model_chunks: This rank's ``DistributedDataParallel`` model chunks.
        actions: This rank's actions of the running plan point (clock actions are ignored).
        order: This rank's executed instruction order (``megatron.schedule.pipeline_orders``).
        stage: This rank's pipeline stage (the ``stage`` of the instructions the hooks report).
        communicators: Prepares and holds per-budget communicators; required when an action has a budget.
        budget_actions: Actions whose budgets to prepare communicators for (every point of the plan);
            ``actions`` when ``None``.
        check_backend: Refuse budgets on non-NCCL groups (only tests of the options boundary switch it off).

    Raises:
        CollectivePlanError: The plan cannot be honoured by this job (see the module docstring).
        BudgetError: A budget cannot be honoured (gloo, out of range).
    """

    def __init__(
        self,
        model_chunks: Sequence[Any],
        actions: Sequence[Action],
        order: Sequence[Instruction],
        stage: int,
        communicators: BudgetCommunicators | None = None,
        budget_actions: Sequence[Action] | None = None,
        check_backend: bool = True,
    ) -> None:
        self.stage = stage
        self.communicators = communicators
        self.launches: list[Launch] = []
        self.step = 0
        self._by_boundary: dict[Boundary, list[_PlannedBucket]] = {}
        self._planned: list[_PlannedBucket] = []
        self._restore: list[Callable[[], None]] = []
        collective_actions = [a for a in actions if isinstance(a, CollectiveAction)]
        if not collective_actions:
            return
        groups = bucket_groups(model_chunks)
        planned = [self._check(action, groups, order) for action in collective_actions]
        self._prepare_budgets(planned, budget_actions or actions, groups, check_backend)
        for bucket in planned:
            self._install(bucket)

    # ----------------------------------------------------------------------------- checking the plan

    def _check(
        self, action: CollectiveAction, groups: list[tuple[int, Any]], order: Sequence[Instruction]
    ) -> _PlannedBucket:
        collective = parse_collective(action.collective)
        if not collective.is_gradient:
            raise CollectivePlanError(
                f"the plan launches {action.collective} at a chosen point; this runtime retimes only "
                "gradient reductions (dp.all_reduce / dp.reduce_scatter), parameter all-gathers still run "
                "where --overlap-param-gather puts them. Drop that action (rerun planning)"
            )
        if collective.bucket >= len(groups):
            raise CollectivePlanError(
                f"the plan names {action.collective}, but this rank has {len(groups)} DDP bucket group(s) "
                f"(dp.*.bucket0..{len(groups) - 1}); the plan was made for another --ddp-bucket-size, "
                "--ddp-num-buckets or model: rerun planning"
            )
        chunk, group = groups[collective.bucket]
        config = group.ddp_config
        if not config.overlap_grad_reduce:
            raise CollectivePlanError(
                f"the plan launches {action.collective} at the {boundary_label(action.at)}, but without "
                "--overlap-grad-reduce megatron-core reduces gradients synchronously after the last "
                "backward, with no launch to move: add --overlap-grad-reduce, or plan without collective "
                "actions"
            )
        if config.num_distributed_optimizer_instances > 1:
            raise CollectivePlanError(
                "collective launch points are not supported with --num-distributed-optimizer-instances > 1 "
                "(megatron-core reduces over two groups on a side stream): use one instance, or plan "
                "without collective actions"
            )
        expected_op = "reduce_scatter" if config.use_distributed_optimizer else "all_reduce"
        if collective.op != expected_op:
            flag = "with" if config.use_distributed_optimizer else "without"
            raise CollectivePlanError(
                f"the plan names {action.collective}, but {flag} --use-distributed-optimizer megatron-core "
                f"reduces gradients by {expected_op}: rerun planning for this job's optimizer setting"
            )
        if action.at.instruction.stage != self.stage:
            raise CollectivePlanError(
                f"the plan launches {action.collective} at an instruction of stage "
                f"{action.at.instruction.stage} on pipeline rank {self.stage}: the plan is malformed, rerun "
                "planning"
            )
        check_gradient_launch(order, chunk, action.collective, action.at)
        attr = _communicator_attr(group)
        return _PlannedBucket(action, chunk, group, attr, group.start_grad_sync, group.finish_grad_sync)

    def _prepare_budgets(
        self,
        planned: list[_PlannedBucket],
        budget_actions: Sequence[Action],
        groups: list[tuple[int, Any]],
        check_backend: bool,
    ) -> None:
        budgets: dict[int, set[int]] = {}
        bases: dict[int, tuple[Any, str]] = {}
        for bucket in planned:
            base = getattr(bucket.group, bucket.group_attr)
            bases[id(base)] = (base, bucket.action.collective)
        for action in budget_actions:
            if not isinstance(action, CollectiveAction) or action.max_ctas is None:
                continue
            collective = parse_collective(action.collective)
            if collective.bucket >= len(groups):
                continue  # another point's bucket; refused by _check when that point runs
            _, group = groups[collective.bucket]
            base = getattr(group, _communicator_attr(group))
            bases.setdefault(id(base), (base, action.collective))
            budgets.setdefault(id(base), set()).add(action.max_ctas)
        if not budgets:
            return
        if self.communicators is None:
            raise CollectivePlanError(
                "the plan gives collectives CTA budgets but the launcher got no BudgetCommunicators to "
                "create their communicators: pass communicators=BudgetCommunicators(...)"
            )
        for key, values in budgets.items():
            base, what = bases[key]
            if check_backend:
                require_nccl(base, what)
            group_name = collective_group(what)
            self.communicators.prepare(
                base, [CtaBudget(group_name, ctas) for ctas in values], what, check_backend=check_backend
            )

    # ------------------------------------------------------------------------------- installing

    def _install(self, bucket: _PlannedBucket) -> None:
        group = bucket.group

        def start_grad_sync(*args: Any, **kwargs: Any) -> None:
            if not bucket.launched:
                bucket.request = dict(kwargs)
                if args:
                    bucket.request["force_all_reduce"] = args[0]

        def finish_grad_sync(*args: Any, **kwargs: Any) -> None:
            if not bucket.launched:
                self._launch(bucket, "finish_grad_sync (missed its point)")
            bucket.finish(*args, **kwargs)

        group.start_grad_sync = start_grad_sync
        group.finish_grad_sync = finish_grad_sync
        self._restore.append(lambda: _drop_instance_attrs(group, ("start_grad_sync", "finish_grad_sync")))
        self._planned.append(bucket)
        self._by_boundary.setdefault(bucket.action.at, []).append(bucket)

    def uninstall(self) -> None:
        """Give every bucket group back its own methods."""
        while self._restore:
            self._restore.pop()()

    def _launch(self, bucket: _PlannedBucket, where: str) -> None:
        budget = bucket.action.max_ctas
        bucket.launched = True
        if budget is None or self.communicators is None:
            bucket.start(**bucket.request)
        else:
            base = getattr(bucket.group, bucket.group_attr)
            setattr(bucket.group, bucket.group_attr, self.communicators.get(base, budget))
            try:
                bucket.start(**bucket.request)
            finally:
                setattr(bucket.group, bucket.group_attr, base)
        self.launches.append(Launch(self.step, bucket.action.collective, where, budget))

    def _at(self, boundary: Boundary) -> None:
        for bucket in self._by_boundary.get(boundary, ()):
            if not bucket.launched:
                self._launch(bucket, boundary_label(boundary))

    # ------------------------------------------------------------------------------ listener

    def on_step_begin(self, step: int) -> None:
        """A training step starts: every planned bucket is due again."""
        self.step = step
        for bucket in self._planned:
            bucket.launched = False
            bucket.request = {}

    def on_step_end(self, step: int) -> None:
        """Nothing to do (``finish_grad_sync`` already ran)."""

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Launch what is planned at this instruction's start."""
        if self._by_boundary:
            self._at(Boundary(Instruction(self.stage, chunk, microbatch, kind)))

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Launch what is planned at this instruction's end."""
        if self._by_boundary:
            self._at(Boundary(Instruction(self.stage, chunk, microbatch, kind), INSTRUCTION_END))

    def on_p2p_begin(self, op: str) -> None:
        """Pipeline p2p is not retimed."""

    def on_p2p_end(self, op: str) -> None:
        """Pipeline p2p is not retimed."""


def _communicator_attr(group: Any) -> str:
    """The attribute of a bucket group holding the communicator its gradient reduction runs on."""
    if group.ddp_config.use_distributed_optimizer:
        return "intra_distributed_optimizer_instance_group"
    return "data_parallel_group"


def _drop_instance_attrs(obj: Any, names: Sequence[str]) -> None:
    for name in names:
        obj.__dict__.pop(name, None)
