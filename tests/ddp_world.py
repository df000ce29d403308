"""Data-parallel gloo worlds: the tiny GPT's chunks wrapped in megatron-core's ``DistributedDataParallel``.

``DdpWorld`` builds a ``PipelineWorld`` and wraps every model chunk in megatron-core's DDP the way
``megatron.training.training.get_model`` and ``train()`` do: bucketing only on pipeline rank 0's first
chunk, ``config.no_sync_func``/``grad_sync_func`` (``--align-grad-reduce``) and ``finalize_model_grads``. One
more CPU shim is needed here: ``param_and_grad_buffer.py:632`` asks for ``torch.cuda.current_stream()``
before every gradient reduction (:func:`install_stream_shim`).

Workers must live in modules that do not import ``megatron`` at import time (see ``megatron_harness``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from log_lines import capture_lines
from megatron_harness import PipelineWorld, TinyGpt

from megatron_energy.pipeline.collective_names import END, GEMM_OVERLAP, CollectiveName


class _CpuStream:
    """Stands in for ``torch.cuda.current_stream()`` on CPU: nothing to wait for."""

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass


def install_stream_shim() -> None:
    """``param_and_grad_buffer.py:632``: ``torch.cuda.current_stream()`` before each gradient reduction."""
    torch.cuda.current_stream = lambda device=None: _CpuStream()  # type: ignore[assignment]


class DdpWorld:
    """A ``PipelineWorld`` whose chunks are wrapped in megatron-core's DDP.

    Args:
        pipeline_size: Pipeline stages (data parallel = world / pipeline).
        virtual_size: Model chunks per rank, ``None`` for plain 1F1B.
        bucket_size: ``--ddp-bucket-size`` (elements); ``None`` for one bucket.
        overlap_grad_reduce: ``--overlap-grad-reduce``.
        use_distributed_optimizer: ``--use-distributed-optimizer`` (reduce-scatter instead of all-reduce).
        align_grad_reduce: ``--align-grad-reduce`` (Megatron's default).
        shape: Model and batch sizes.
    """

    def __init__(
        self,
        pipeline_size: int,
        virtual_size: int | None = None,
        bucket_size: int | None = 40,
        overlap_grad_reduce: bool = True,
        use_distributed_optimizer: bool = False,
        align_grad_reduce: bool = True,
        shape: TinyGpt | None = None,
    ) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads

        install_stream_shim()
        self.world = PipelineWorld(pipeline_size, virtual_size, shape=shape or TinyGpt())
        config = self.world.config
        self.ddp = []
        for index, chunk in enumerate(self.world.chunks):
            ddp_config = DistributedDataParallelConfig(
                overlap_grad_reduce=overlap_grad_reduce,
                use_distributed_optimizer=use_distributed_optimizer,
                bucket_size=bucket_size,
            )
            self.ddp.append(DistributedDataParallel(config, ddp_config, chunk, disable_bucketing=index > 0))
        self.world.chunks = self.ddp
        if overlap_grad_reduce:
            no_sync = [chunk.no_sync for chunk in self.ddp]
            config.no_sync_func = no_sync if len(no_sync) > 1 else no_sync[0]
            if align_grad_reduce:
                grad_sync = [chunk.start_grad_sync for chunk in self.ddp]
                config.grad_sync_func = grad_sync if len(grad_sync) > 1 else grad_sync[0]
        config.finalize_model_grads_func = finalize_model_grads

    def run(self, num_microbatches: int, seed: int = 0) -> list[float]:
        """One training step of megatron-core's schedule; gradients are zeroed first."""
        for chunk in self.ddp:
            chunk.zero_grad_buffer()
        return self.world.run(num_microbatches, seed=seed)


# ------------------------------------------------------------------------------ the launch-point world

NUM_MICROBATCHES = 4


def _plan(order: list, layout: list, early: bool) -> list:
    """A plan for every bucket group of this rank.

    ``early=True`` (the contract's earliest points): every group where its gradients become complete, at
    a ``layer<k>`` of its chunk's last backward or at its ``end``. ``early=False``: chunk 1's groups at the
    start of the rank's last instruction (later than Megatron launches them; an instruction boundary after
    the last backward), chunk 0's at the end of the last instruction.
    """
    from megatron_energy.plan import Boundary, CollectiveAction
    from megatron_energy.runtime.running.collective_points import last_backward, ready_point

    actions = []
    for name, chunk, _elements, places in layout:
        if early:
            at = Boundary(last_backward(order, chunk), ready_point(places, LAYERS_PER_CHUNK))
        else:
            at = Boundary(order[-1], END) if chunk == 0 else Boundary(order[-1])
        actions.append(CollectiveAction(at, name))
    return actions


LAYERS_PER_CHUNK = 2


class ObservedDdp:
    """A ``DdpWorld`` run under the launcher-path hooks, with every event recorded in one list.

    The record holds the hook events, ``("layer_backward", chunk, layer)`` when a layer's backward starts
    (this class's own hooks, registered before any launcher's) and ``("collective", name, ranks, group id)``
    for every bucket reduction (``torch.distributed.all_reduce`` wrapped inside the worker). Schedule events
    also go to the listeners in ``current`` (the launcher under test).
    """

    def __init__(self, pipeline_size: int, virtual_size: int | None) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state as ps
        from megatron.training import global_vars
        from megatron_harness import RecordingListener

        from megatron_energy.events import ListenerFanout
        from megatron_energy.megatron.bucket_layout import bucket_groups, bucket_layout
        from megatron_energy.megatron.expected_order import current_rank_order
        from megatron_energy.megatron.hooks import install_hooks

        self.world = DdpWorld(
            pipeline_size, virtual_size, bucket_size=40, shape=TinyGpt(layers_per_chunk=LAYERS_PER_CHUNK)
        )
        self.order = list(current_rank_order(NUM_MICROBATCHES))
        self.stage = ps.get_pipeline_model_parallel_rank()
        self.groups = bucket_groups(self.world.ddp)
        self.layout = bucket_layout(self.world.ddp)
        names = {id(b.group): entry[0] for entry, b in zip(self.layout, self.groups, strict=True)}
        buffers = {
            bucket.grad_data.data_ptr(): names[id(b.group)] for b in self.groups for bucket in b.group.buckets
        }
        self.recorder = recorder = RecordingListener()
        self.current: list[Any] = []
        current = self.current

        class Forward:
            """Forwards the schedule events to the launcher under test, if any."""

            def __getattr__(self, name: str) -> Any:
                def forward(*args: Any) -> None:
                    for listener in current:
                        getattr(listener, name)(*args)

                return forward

        for chunk, ddp in enumerate(self.world.ddp):
            for layer, module in enumerate(ddp.module.decoder.layers):

                def on_output(_m: Any, _a: Any, output: Any, chunk: int = chunk, layer: int = layer) -> None:
                    tensor = output[0] if isinstance(output, tuple) else output
                    if torch.is_grad_enabled() and tensor.requires_grad:
                        tensor.register_hook(
                            lambda _g: recorder.events.append(("layer_backward", chunk, layer))
                        )

                module.register_forward_hook(on_output)

        self._all_reduce = original = dist.all_reduce

        def traced_all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            name = buffers.get(tensor.data_ptr())
            if name is not None:
                group = kwargs.get("group")
                recorder.events.append(("collective", name, dist.get_process_group_ranks(group), id(group)))
            return original(tensor, *args, **kwargs)

        dist.all_reduce = traced_all_reduce
        self.installation = install_hooks(
            ListenerFanout([recorder, Forward()]), num_microbatches_fn=lambda: NUM_MICROBATCHES
        )
        self.world.world.config.timers = global_vars.Timers(0, "minmax")

    def run_steps(self, seeds: tuple[int, ...]) -> tuple[list, list]:
        """Run one step per seed; return the record and each step's reduced gradients."""
        self.recorder.events.clear()
        grads = []
        for seed in seeds:
            torch.manual_seed(seed)  # dropout
            self.world.run(NUM_MICROBATCHES, seed=seed)
            grads.append([bucket.grad_data.clone() for b in self.groups for bucket in b.group.buckets])
        return list(self.recorder.events), grads

    def close(self) -> None:
        """Remove the hooks and the all-reduce tracing."""
        import torch.distributed as dist

        self.installation.uninstall()
        dist.all_reduce = self._all_reduce


def same_grads(grads_a: list, grads_b: list) -> bool:
    """Whether two runs' reduced gradients agree, step by step and bucket by bucket."""
    return all(
        bool(torch.allclose(a, b))
        for step_a, step_b in zip(grads_a, grads_b, strict=True)
        for a, b in zip(step_a, step_b, strict=True)
    )


def grad_ready_world_worker(rank: int, world_size: int, payload: Any) -> dict[str, Any]:
    """DP=2, no pipeline: Megatron launches each bucket inside the last backward (``register_grad_ready``)."""
    from megatron_energy.megatron.collective_launch import CollectiveLauncher
    from megatron_energy.plan import Boundary, CollectiveAction
    from megatron_energy.runtime.running.collective_points import last_backward, ready_point

    observed = ObservedDdp(1, None)
    order, layout = observed.order, observed.layout
    report: dict[str, Any] = {"order": order, "layout": layout}
    report["baseline"], baseline_grads = observed.run_steps((0, 1, 2))
    plans = {
        "end": [CollectiveAction(Boundary(order[-1], END), name) for name, *_ in layout],
        "earliest": [
            CollectiveAction(
                Boundary(last_backward(order, chunk), ready_point(places, LAYERS_PER_CHUNK)), name
            )
            for name, chunk, _, places in layout
        ],
    }
    for label, plan in plans.items():
        launcher = CollectiveLauncher(observed.world.ddp, plan, order, observed.stage)
        observed.current[:] = [launcher]
        events, grads = observed.run_steps((0, 1, 2))
        report[label] = {"plan": plan, "events": events, "same_grads": same_grads(baseline_grads, grads)}
        launcher.uninstall()
    observed.close()
    return report


def launch_world_worker(rank: int, world_size: int, payload: Any) -> dict[str, Any]:
    """PP=2 x VPP=2 x DP=2: baseline steps, steps under an empty plan, under two plans, refused plans."""
    import torch.distributed as dist
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from megatron_energy.megatron.bucket_layout import measured_buckets
    from megatron_energy.megatron.collective_launch import CollectiveLauncher
    from megatron_energy.megatron.collective_runner import chunks_from_config
    from megatron_energy.megatron.communicators import BudgetCommunicators
    from megatron_energy.plan import Boundary, CollectiveAction

    observed = ObservedDdp(2, 2)
    world, order, stage, groups, layout = (
        observed.world,
        observed.order,
        observed.stage,
        observed.groups,
        observed.layout,
    )
    current, run_steps, same = observed.current, observed.run_steps, same_grads

    report: dict[str, Any] = {"stage": stage, "order": order, "layout": layout}
    report["measured"] = measured_buckets(world.ddp, stage)  # what the session hands the planner
    report["baseline"], baseline_grads = run_steps((0, 1))

    empty = CollectiveLauncher(world.ddp, [], order, stage)
    current[:] = [empty]
    report["empty"], empty_grads = run_steps((0, 1))
    report["empty_same_grads"] = same(baseline_grads, empty_grads)
    report["empty_patched"] = [("start_grad_sync" in vars(b.group)) for b in groups]

    for label, early in (("late", False), ("early", True)):
        plan = _plan(order, layout, early)
        launcher = CollectiveLauncher(world.ddp, plan, order, stage)
        current[:] = [launcher]
        events, grads = run_steps((0, 1))
        report[label] = {
            "plan": plan,
            "events": events,
            "launches": launcher.launches,
            "same_grads": same(baseline_grads, grads),
        }
        launcher.uninstall()

    # a CTA budget: the options megatron-core builds, and the communicator chosen at the launch
    made: list[dict[str, Any]] = []

    def recording_new_group(**kwargs: Any) -> Any:
        made.append(kwargs)
        return dist.new_group(kwargs["ranks"], backend="gloo", use_local_synchronization=True)

    budgets = BudgetCommunicators(
        base_config={"dp_cp": {"is_high_priority_stream": True}}, new_group=recording_new_group
    )
    first = report["late"]["plan"][0]
    budget_plan = [CollectiveAction(first.at, first.collective, max_ctas=8)]
    budget_launcher = CollectiveLauncher(
        world.ddp, budget_plan, order, stage, communicators=budgets, check_backend=False
    )
    current[:] = [budget_launcher]
    report["budget_events"], _ = run_steps((0,))
    report["budget_groups"] = [
        {
            "ranks": call["ranks"],
            "backend": call["backend"],
            "max_ctas": call["pg_options"].config.max_ctas,
            "min_ctas": call["pg_options"].config.min_ctas,
            "high_priority": call["pg_options"].is_high_priority_stream,
            "desc": call["group_desc"],
        }
        for call in made
    ]
    base_group = groups[0].group.data_parallel_group
    report["budget_group_id"] = id(budgets.get(base_group, 8))
    report["base_group_id"] = id(base_group)
    report["budget_collective"] = first.collective
    budget_launcher.uninstall()
    current.clear()

    report["runner"] = _follow_a_session(world, current, run_steps, order, stage, layout)
    found = chunks_from_config(world.world.config) or []
    report["chunks_from_config"] = len(found) == len(world.ddp) and all(
        a is b for a, b in zip(found, world.ddp, strict=False)
    )

    report["refusals"] = _refusals(world, order, stage, layout, first)
    report["untouched_after_refusals"] = not any("start_grad_sync" in vars(b.group) for b in groups)
    chunk0 = world.ddp[0].module
    overlap_off = DistributedDataParallel(
        world.world.config, DistributedDataParallelConfig(overlap_grad_reduce=False), chunk0
    )
    report["refusals"].update(
        _refusals(
            [overlap_off],
            order,
            stage,
            layout,
            CollectiveAction(Boundary(order[-1]), CollectiveName("dp", "all_reduce", bucket=0)),
        )
    )
    # without --overlap-grad-reduce, megatron-core's own point (the end of the last instruction) is accepted
    megatrons = CollectiveLauncher(
        [overlap_off],
        [CollectiveAction(Boundary(order[-1], END), CollectiveName("dp", "all_reduce", bucket=0))],
        order,
        stage,
    )
    report["overlap_off_accepted"] = not any(
        name in vars(group)
        for group in overlap_off.bucket_groups
        for name in ("start_grad_sync", "finish_grad_sync")
    )
    megatrons.uninstall()
    try:
        CollectiveLauncher([ddp.module for ddp in world.ddp], [first], order, stage)
    except Exception as error:  # the test asserts type and message
        report["refusals"]["not_ddp"] = f"{type(error).__name__}: {error}"
    observed.close()
    return report


def _plan_of(points: list[list], stage: int, num_stages: int) -> Any:
    """A real plan whose points hold ``points``' actions on this stage (nothing on the others)."""
    from megatron_energy.plan import Baseline, Plan, PlanPoint, RankPlan

    return Plan(
        fingerprint="world",
        gpu_name="cpu",
        provenance="modelled",
        target="iso-time",
        optimisers=("kareus",),
        switch_latency_s=0.0,
        baseline=Baseline(1.0, 1.0),
        points=tuple(
            PlanPoint(
                label=f"point{index}",
                iteration_time_s=1.0 + index,
                deadline_s=1.0 + index,
                lower_bound_j=1.0,
                ranks=tuple(
                    RankPlan(tuple(actions) if rank == stage else (), 1.0, 1.0) for rank in range(num_stages)
                ),
            )
            for index, actions in enumerate(points)
        ),
        target_index=0,
    )


def _follow_a_session(
    world: DdpWorld, current: list, run_steps: Any, order: list, stage: int, layout: list
) -> dict:
    """A ``CollectiveRunner`` following a session state: its plan switches point, stops, re-arms, is bad."""
    from megatron_energy.megatron.collective_runner import CollectiveRunner
    from megatron_energy.pipeline.schedule_orders import pipeline_orders
    from megatron_energy.plan import CollectiveAction
    from megatron_energy.runtime.running.plan_runner import PlanRunner
    from megatron_energy.runtime.session_state import SessionState

    orders = pipeline_orders(2, NUM_MICROBATCHES, 2)
    early, late = _plan(order, layout, True), _plan(order, layout, False)
    plan = _plan_of([early, late], stage, 2)
    lines = capture_lines()
    runner = CollectiveRunner(lambda: world.ddp)
    state = SessionState()
    state.follow(runner)  # the session's port: the runner is told, it searches and polls nothing
    state.run(PlanRunner(plan, stage, orders.steps(stage)))
    current[:] = [runner]
    steps = {}
    steps["point0"], _ = run_steps((0,))
    state.select(1)  # a straggler's pace
    steps["point1"], _ = run_steps((0,))
    state.stop()  # the safety net reverts to stock
    steps["stopped"], _ = run_steps((0,))
    state.run(PlanRunner(plan, stage, orders.steps(stage)))  # re-armed: the target point again
    steps["rearmed"], _ = run_steps((0,))
    bad = _plan_of(
        [[CollectiveAction(late[0].at, CollectiveName("dp", "all_reduce", chunk=0, bucket=99))]], stage, 2
    )
    state.run(PlanRunner(bad, stage, orders.steps(stage)))
    steps["refused"], _ = run_steps((0,))
    runner.close()
    current.clear()
    return {"steps": steps, "lines": lines, "early": early, "late": late}


def _refusals(chunks: Any, order: list, stage: int, layout: list, first: Any) -> dict[str, str]:
    """The messages of plans this job cannot honour (one action each)."""
    from megatron_energy.megatron.collective_launch import CollectiveLauncher
    from megatron_energy.megatron.communicators import BudgetCommunicators
    from megatron_energy.plan import Boundary, CollectiveAction

    if not isinstance(chunks, list):
        chunks = chunks.ddp
    cases: dict[str, list] = {}
    if len(chunks) == 1:
        cases["overlap_off"] = [first]
    else:
        chunk1 = next(name for name, chunk, _, _ in layout if chunk == 1)
        last_b1 = [i for i in order if i.kind == "backward" and i.chunk == 1][-1]
        cases = {
            "before_gradients": [CollectiveAction(Boundary(last_b1), chunk1)],
            "gloo_budget": [CollectiveAction(first.at, first.collective, max_ctas=8)],
            "pipeline_p2p_moved": [CollectiveAction(first.at, CollectiveName("pp", "send_recv"))],
            "pipeline_p2p_budget": [
                CollectiveAction(Boundary(order[0]), CollectiveName("pp", "send_recv"), max_ctas=8)
            ],
            "no_such_bucket": [
                CollectiveAction(first.at, CollectiveName("dp", "all_reduce", chunk=0, bucket=99))
            ],
            "no_chunk": [CollectiveAction(first.at, CollectiveName("dp", "all_reduce", bucket=0))],
            "wrong_op": [
                CollectiveAction(first.at, dataclasses.replace(first.collective, op="reduce_scatter"))
            ],
            "param_gather": [
                CollectiveAction(first.at, CollectiveName("dp", "all_gather", chunk=0, bucket=0))
            ],
            "twice": [first, first],
            "gemm_overlap": [
                CollectiveAction(Boundary(order[0], GEMM_OVERLAP), CollectiveName("tp", "all_gather"))
            ],
        }
    refusals = {}
    for case, actions in cases.items():
        try:
            CollectiveLauncher(chunks, actions, order, stage, communicators=BudgetCommunicators())
        except Exception as error:  # the test asserts type and message
            refusals[case] = f"{type(error).__name__}: {error}"
    return refusals
