"""Apply a plan's collective actions to megatron-core: gradient reductions at their launch points and budgets.

**Gradient reductions** (``dp.all_reduce`` / ``dp.reduce_scatter``). megatron-core's DDP bucket groups
(``_ParamAndGradBucketGroup``, ``distributed/param_and_grad_buffer.py``) reduce in ``start_grad_sync``,
called with ``--overlap-grad-reduce`` as soon as a group's last gradient of the last microbatch is
accumulated (``register_grad_ready``, from the backward post-hook) or, with ``--align-grad-reduce`` on later
pipeline ranks and in the interleaved schedule, by ``config.grad_sync_func``; ``finish_grad_sync`` (from
``finalize_model_grads``, at the end of the schedule) waits on the handle. :class:`CollectiveLauncher`
replaces ``start_grad_sync``/``finish_grad_sync`` on the planned groups' *instances* only:

- a call from Megatron before the planned point is held (the launch is *deferred*);
- at the planned boundary the group's own ``start_grad_sync`` runs, and a later call from Megatron in the same
  step is a no-op (the launch was *forced* earlier than Megatron's);
- boundaries are the schedule hooks (an instruction's start or ``end``; the launcher is a
  ``ScheduleListener``) and, for ``layer<k>`` phases, a hook on the gradient of the chunk's layer outputs
  (the moment a layer's backward starts), installed only when the plan has such phases;
- with a CTA budget the group's communicator attribute is swapped, for that call, to the budget's
  communicator (``megatron.communicators``);
- ``finish_grad_sync`` of a group whose point never came launches it first (gradients are always reduced)
  and records the miss; a checked plan cannot miss.

Without ``--overlap-grad-reduce`` megatron-core reduces synchronously in ``finish_grad_sync``: the only
launch point is then its own, the ``end`` of the rank's last instruction, where only a budget is applied.

**Parameter all-gathers** (``dp.all_gather``) have two launch points in the contract, and they are
Megatron's own: ``after_optimizer`` without and ``layer0`` of the chunk's first forward with
``--overlap-param-gather``; the launcher checks the plan agrees with the flag. **Inline collectives**
(``pp.send_recv``, ``tp.*``) are launched by Megatron itself; a plan gives them only a budget, which the
communicator Megatron created must already carry (``communicator_budgets.check_fixed_budget``); a TP class
at phase ``gemm_overlap`` needs ``--tp-comm-overlap`` (Transformer Engine userbuffers), whose SMs come from
``--tp-comm-overlap-cfg`` at start-up, so a budget there is refused; under ``--tp-comm-overlap`` a TP
class left on NCCL (phase ``None``) is refused too (userbuffers run it). Not covered, and why: without
Transformer Engine, TP/SP collectives run synchronously inside each layer's autograd functions, so their
launch is no choice and the runtime does not time them one by one (its hooks see instructions and DDP
buckets, not the collectives inside a layer); their timing in a plan is the model's.

A plan the job cannot honour is refused when the launcher is built (``CollectivePlanError`` /
``BudgetError``, each naming what and how to fix). With no collective actions nothing is replaced, so Megatron
behaves exactly as without the launcher.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from megatron_energy.megatron.bucket_layout import (
    BucketGroup,
    bucket_groups,
    chunk_layers,
    communicator_attr,
    gradient_op,
)
from megatron_energy.megatron.communicators import BudgetCommunicators, require_nccl
from megatron_energy.pipeline.collective_names import (
    AFTER_OPTIMIZER,
    END,
    GEMM_OVERLAP,
    CollectiveName,
    layer_start,
)
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.plan import Action, Boundary, CollectiveAction
from megatron_energy.runtime.running.collective_points import (
    CollectivePlanError,
    boundary_label,
    check_gradient_launch,
)
from megatron_energy.runtime.running.communicator_budgets import (
    CtaBudget,
    check_fixed_budget,
    collective_group,
)

_LAYER_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)$")


@dataclass(frozen=True)
class Launch:
    """One launch the runtime made (for logs and tests)."""

    step: int
    """Training step (schedule) number."""
    collective: CollectiveName
    """The plan's collective."""
    where: str
    """``start of B3c1``, ``layer1 of B3c1``, ``end of B3c1``, or ``finish_grad_sync (missed its point)``."""
    max_ctas: int | None
    """The budget it ran with; ``None``: the base communicator."""


@dataclass
class _Planned:
    """A planned bucket group and its state in the current step."""

    action: CollectiveAction
    bucket: BucketGroup
    start: Callable[..., Any]
    finish: Callable[..., Any]
    timed: bool = True
    """False: Megatron's own launch point (no ``--overlap-grad-reduce``), only the budget is applied."""
    launched: bool = False
    request: dict[str, Any] = field(default_factory=dict)


class CollectiveLauncher:
    """Applies one rank's collective actions to megatron-core's DDP, at the hooks' boundaries.

    Feed it the schedule events (``ScheduleListener``), e.g. through ``ListenerFanout``.

    Args:
        model_chunks: This rank's ``DistributedDataParallel`` model chunks.
        actions: This rank's actions of the running plan point (clock actions are ignored).
        order: This rank's executed instruction order (``pipeline.schedule_orders.pipeline_orders``).
        stage: This rank's pipeline stage.
        communicators: Creates and holds per-budget communicators; required when a reduction has a budget.
        budget_actions: Actions whose budgets to prepare communicators for (every point of the plan);
            ``actions`` when ``None``.
        communicator_config: The communicator config Megatron started with
            (``--nccl-communicator-config-path``), against which budgets of inline collectives are checked.
        check_backend: Refuse budgets on non-NCCL groups (only tests of the options boundary switch it off).

    Raises:
        CollectivePlanError: The plan cannot be honoured by this job (see the module docstring).
        BudgetError: A budget cannot be honoured (gloo, out of range, not in the communicator config).
    """

    def __init__(
        self,
        model_chunks: Sequence[Any],
        actions: Sequence[Action],
        order: Sequence[Instruction],
        stage: int,
        communicators: BudgetCommunicators | None = None,
        budget_actions: Sequence[Action] | None = None,
        communicator_config: Mapping[str, Mapping[str, Any]] | None = None,
        check_backend: bool = True,
    ) -> None:
        self.stage = stage
        self.communicators = communicators
        self.launches: list[Launch] = []
        self.step = 0
        self._by_boundary: dict[Boundary, list[_Planned]] = {}
        self._planned: list[_Planned] = []
        self._restore: list[Callable[[], None]] = []
        self._current: Instruction | None = None
        collective_actions = [a for a in actions if isinstance(a, CollectiveAction)]
        if not collective_actions:
            return
        self._virtual = len(model_chunks) > 1
        buckets = {(b.chunk, b.index): b for b in bucket_groups(model_chunks)}
        self._layers = [chunk_layers(ddp) for ddp in model_chunks]
        self._tp_comm_overlap = bool(
            getattr(getattr(model_chunks[0], "config", None), "tp_comm_overlap", False)
        )
        planned = []
        named = [action.collective for action in collective_actions]
        twice = sorted({str(name) for name in named if named.count(name) > 1})
        if twice:
            raise CollectivePlanError(
                f"the plan launches {', '.join(twice)} more than once on pipeline rank {self.stage}; each "
                "collective launches once per iteration: rerun planning"
            )
        for action in collective_actions:
            parsed = action.collective
            self._check_stage(action)
            if parsed.group != "dp":
                self._check_inline(action, order, communicator_config)
            elif parsed.op == "all_gather":
                self._check_gather(action, self._bucket(parsed, action, buckets), order)
            else:
                planned.append(self._check_reduce(action, parsed, buckets, order))
        self._prepare_budgets(planned, budget_actions or actions, buckets, check_backend)
        for item in planned:
            self._install(item)
        if any(at.phase not in (None, END) for at in self._by_boundary):
            self._install_layer_hooks(model_chunks)

    # ----------------------------------------------------------------------------- checking the plan

    def _check_stage(self, action: CollectiveAction) -> None:
        if action.at.instruction.stage != self.stage:
            raise CollectivePlanError(
                f"the plan launches {action.collective} at an instruction of stage "
                f"{action.at.instruction.stage} on pipeline rank {self.stage}: the plan is malformed, rerun "
                "planning"
            )

    def _bucket(self, parsed: CollectiveName, action: CollectiveAction, buckets: dict) -> BucketGroup:
        if (parsed.chunk is not None) != self._virtual:
            raise CollectivePlanError(
                f"the plan names {action.collective}, but this job has {len(self._layers)} model chunk(s) "
                "per rank: names carry .chunk<c> exactly when there is a virtual pipeline. Rerun planning "
                "for this job"
            )
        key = (parsed.chunk or 0, parsed.bucket)
        if key not in buckets:
            count = sum(1 for chunk, _ in buckets if chunk == key[0])
            raise CollectivePlanError(
                f"the plan names {action.collective}, but model chunk {key[0]} of this rank has {count} DDP "
                "bucket group(s); the plan was made for another --ddp-bucket-size, --ddp-num-buckets or "
                "model: rerun planning"
            )
        return buckets[key]

    def _check_reduce(
        self, action: CollectiveAction, parsed: CollectiveName, buckets: dict, order: Sequence[Instruction]
    ) -> _Planned:
        bucket = self._bucket(parsed, action, buckets)
        config = bucket.group.ddp_config
        if config.num_distributed_optimizer_instances > 1:
            raise CollectivePlanError(
                "collective launch points are not supported with --num-distributed-optimizer-instances > 1 "
                "(megatron-core reduces over two groups on a side stream): use one instance, or plan "
                "without collective actions"
            )
        if parsed.op != gradient_op(bucket.group):
            flag = "with" if config.use_distributed_optimizer else "without"
            raise CollectivePlanError(
                f"the plan names {action.collective}, but {flag} --use-distributed-optimizer megatron-core "
                f"reduces gradients by {gradient_op(bucket.group)}: rerun planning for this job's optimizer "
                "setting"
            )
        group = bucket.group
        if not config.overlap_grad_reduce:
            megatrons = Boundary(order[-1], END)
            if action.at != megatrons:
                raise CollectivePlanError(
                    f"the plan launches {action.collective} at the {boundary_label(action.at)}, but without "
                    "--overlap-grad-reduce megatron-core reduces gradients synchronously at the "
                    f"{boundary_label(megatrons)}, with no launch to move: add --overlap-grad-reduce, or "
                    "rerun planning for this job"
                )
            return _Planned(action, bucket, group.start_grad_sync, group.finish_grad_sync, timed=False)
        check_gradient_launch(order, bucket.chunk, self._layers, bucket.places, action.collective, action.at)
        return _Planned(action, bucket, group.start_grad_sync, group.finish_grad_sync)

    def _check_gather(
        self, action: CollectiveAction, bucket: BucketGroup, order: Sequence[Instruction]
    ) -> None:
        config = bucket.group.ddp_config
        if not config.use_distributed_optimizer:
            raise CollectivePlanError(
                f"the plan names {action.collective}, but without --use-distributed-optimizer megatron-core "
                "gathers no parameters: rerun planning for this job's optimizer setting"
            )
        first_forward = next(i for i in order if i.kind == "forward" and i.chunk == bucket.chunk)
        overlapped = Boundary(first_forward, layer_start(0))
        stepped = Boundary(order[-1], AFTER_OPTIMIZER)
        if action.at not in (overlapped, stepped):
            raise CollectivePlanError(
                f"the plan launches {action.collective} at the {boundary_label(action.at)}; megatron-core "
                f"gathers parameters only at the {boundary_label(stepped)} or, with --overlap-param-gather, "
                f"at the {boundary_label(overlapped)}: rerun planning"
            )
        wanted = action.at == overlapped
        if wanted != config.overlap_param_gather:
            fix = "add --overlap-param-gather" if wanted else "drop --overlap-param-gather"
            raise CollectivePlanError(
                f"the plan launches {action.collective} at the {boundary_label(action.at)}, which needs "
                f"--overlap-param-gather {'on' if wanted else 'off'}: {fix}, or rerun planning for this job"
            )
        if action.max_ctas is not None:
            raise CollectivePlanError(
                f"the plan gives {action.collective} a CTA budget; budgets of parameter all-gathers are not "
                "applied by this runtime (they share the gradient reduction's communicator): rerun planning "
                "without one"
            )

    def _check_inline(
        self,
        action: CollectiveAction,
        order: Sequence[Instruction],
        communicator_config: Mapping[str, Mapping[str, Any]] | None,
    ) -> None:
        if action.at.phase == GEMM_OVERLAP and action.at._replace(phase=None) == Boundary(order[0]):
            self._check_gemm_overlap(action)
            return
        if action.at != Boundary(order[0]):
            raise CollectivePlanError(
                f"the plan launches {action.collective} at the {boundary_label(action.at)}, but "
                "megatron-core issues pipeline p2p and TP collectives itself, inside and between "
                "instructions, so their launch is no choice: a plan gives them only a budget, at the "
                "rank's first instruction. Rerun planning"
            )
        if action.collective.group == "tp" and self._tp_comm_overlap:
            raise CollectivePlanError(
                f"the plan runs {action.collective} on NCCL where megatron-core launches it, but "
                "--tp-comm-overlap is on: Transformer Engine's userbuffers run the TP/SP collectives, split "
                "and overlapped with their GEMMs on the SMs --tp-comm-overlap-cfg gives them, so the plan's "
                f"timing of them is not what runs. Rerun planning for this job (its plan puts them at "
                f"'{GEMM_OVERLAP}', without a budget)"
            )
        check_fixed_budget(action.collective, action.max_ctas, communicator_config)

    def _check_gemm_overlap(self, action: CollectiveAction) -> None:
        if action.collective.group != "tp":
            raise CollectivePlanError(
                f"the plan overlaps {action.collective} with GEMMs ('{GEMM_OVERLAP}'); only TP "
                "collectives can be: rerun planning"
            )
        if not self._tp_comm_overlap:
            raise CollectivePlanError(
                f"the plan overlaps {action.collective} with its GEMMs ('{GEMM_OVERLAP}'), which "
                "megatron-core does only through Transformer Engine's userbuffers (--tp-comm-overlap, with "
                "--sequence-parallel). Without them megatron-core runs TP/SP collectives synchronously "
                "inside each layer's forward and backward (tensor_parallel/mappings.py, NCCL on the compute "
                "stream): their launch cannot be moved and this runtime does not time them one by one (no "
                "hook inside a layer), so a plan may give them only a communicator budget, fixed at "
                "start-up: add --tp-comm-overlap (Transformer Engine required), or rerun planning for this "
                "job"
            )
        if action.max_ctas is not None:
            raise CollectivePlanError(
                f"the plan gives {action.collective} {action.max_ctas} SMs under --tp-comm-overlap; "
                "Transformer Engine takes them per GEMM from --tp-comm-overlap-cfg ('num_sm') at start-up "
                "and this runtime neither writes nor reads that file: set num_sm there and plan without a "
                "budget"
            )

    def _prepare_budgets(
        self, planned: list[_Planned], budget_actions: Sequence[Action], buckets: dict, check_backend: bool
    ) -> None:
        wanted: dict[int, tuple[Any, CollectiveName, set[int]]] = {}
        for item in planned:
            base = getattr(item.bucket.group, communicator_attr(item.bucket.group))
            wanted.setdefault(id(base), (base, item.action.collective, set()))
        for action in budget_actions:
            if not isinstance(action, CollectiveAction) or action.max_ctas is None:
                continue
            parsed = action.collective
            bucket = buckets.get((parsed.chunk or 0, parsed.bucket))
            if parsed.group != "dp" or parsed.op == "all_gather" or bucket is None:
                continue  # fixed budgets, or another point's bucket (refused when that point is checked)
            base = getattr(bucket.group, communicator_attr(bucket.group))
            wanted.setdefault(id(base), (base, action.collective, set()))[2].add(action.max_ctas)
        wanted = {key: value for key, value in wanted.items() if value[2]}
        if not wanted:
            return
        if self.communicators is None:
            raise CollectivePlanError(
                "the plan gives gradient reductions CTA budgets but the launcher got no BudgetCommunicators "
                "to create their communicators: pass communicators=BudgetCommunicators(...)"
            )
        for base, what, values in wanted.values():
            if check_backend:
                require_nccl(base, str(what))
            budgets = [CtaBudget(collective_group(what), ctas) for ctas in values]
            self.communicators.prepare(base, budgets, str(what), check_backend=check_backend)

    # ------------------------------------------------------------------------------- installing

    def _install(self, item: _Planned) -> None:
        group = item.bucket.group
        if not item.timed:
            if item.action.max_ctas is not None:

                def budgeted_start_grad_sync(*args: Any, **kwargs: Any) -> None:
                    self._launch(item, "megatron-core's own point", *args, **kwargs)

                group.start_grad_sync = budgeted_start_grad_sync
                self._restore.append(lambda: _drop_instance_attrs(group, ("start_grad_sync",)))
            return

        def start_grad_sync(*args: Any, **kwargs: Any) -> None:
            if not item.launched:
                item.request = dict(kwargs)
                if args:
                    item.request["force_all_reduce"] = args[0]

        def finish_grad_sync(*args: Any, **kwargs: Any) -> None:
            if not item.launched:
                self._launch(item, "finish_grad_sync (missed its point)")
            item.finish(*args, **kwargs)

        group.start_grad_sync = start_grad_sync
        group.finish_grad_sync = finish_grad_sync
        self._restore.append(lambda: _drop_instance_attrs(group, ("start_grad_sync", "finish_grad_sync")))
        self._planned.append(item)
        self._by_boundary.setdefault(item.action.at, []).append(item)

    def _install_layer_hooks(self, model_chunks: Sequence[Any]) -> None:
        import torch

        for chunk, ddp in enumerate(model_chunks):
            for name, module in ddp.module.named_modules():
                match = _LAYER_MODULE.search(name)
                if match is None:
                    continue
                step_index = self._layers[chunk] - 1 - int(match.group(1))

                def on_output(
                    _module: Any, _args: Any, output: Any, chunk: int = chunk, k: int = step_index
                ) -> None:
                    tensor = output[0] if isinstance(output, tuple) else output
                    if torch.is_grad_enabled() and isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                        tensor.register_hook(lambda _grad: self._layer_backward(chunk, k))

                self._restore.append(module.register_forward_hook(on_output).remove)

    def uninstall(self) -> None:
        """Give every bucket group back its own methods and remove the layer hooks."""
        while self._restore:
            self._restore.pop()()

    def _launch(self, item: _Planned, where: str, *args: Any, **kwargs: Any) -> None:
        budget = item.action.max_ctas
        item.launched = True
        group = item.bucket.group
        request = kwargs if args or kwargs else item.request
        if budget is None or self.communicators is None:
            item.start(*args, **request)
        else:
            attr = communicator_attr(group)
            base = getattr(group, attr)
            setattr(group, attr, self.communicators.get(base, budget))
            try:
                item.start(*args, **request)
            finally:
                setattr(group, attr, base)
        self.launches.append(Launch(self.step, item.action.collective, where, budget))

    def _at(self, boundary: Boundary) -> None:
        for item in self._by_boundary.get(boundary, ()):
            if not item.launched:
                self._launch(item, boundary_label(boundary))

    def _layer_backward(self, chunk: int, k: int) -> None:
        current = self._current
        if current is not None and current.kind == "backward" and current.chunk == chunk:
            self._at(Boundary(current, layer_start(k)))

    # ------------------------------------------------------------------------------ listener

    def on_step_begin(self, step: int) -> None:
        """A training step starts: every planned bucket is due again."""
        self.step = step
        for item in self._planned:
            item.launched = False
            item.request = {}

    def on_step_end(self, step: int) -> None:
        """Nothing to do (``finish_grad_sync`` already ran)."""

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Launch what is planned at this instruction's start."""
        self._current = Instruction(self.stage, chunk, microbatch, kind)
        if self._by_boundary:
            self._at(Boundary(self._current))

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Launch what is planned at this instruction's end."""
        self._current = None
        if self._by_boundary:
            self._at(Boundary(Instruction(self.stage, chunk, microbatch, kind), END))

    def on_p2p_begin(self, op: str) -> None:
        """Pipeline p2p is not retimed."""

    def on_p2p_end(self, op: str) -> None:
        """Pipeline p2p is not retimed."""


def _drop_instance_attrs(obj: Any, names: Sequence[str]) -> None:
    for name in names:
        obj.__dict__.pop(name, None)
