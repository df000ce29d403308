"""Create the energy session inside a Megatron job: job context from Megatron's state, lazily.

On the launcher path the listeners are built before Megatron has initialised torch.distributed and its
parallel state, so ``create_session`` returns a ``DeferredSession`` that builds the real session at the first
training step, from ``megatron.core.parallel_state`` and ``megatron.training.get_args()``. Anything that stops
the session from starting (no GPU spec, an unsupported profiling grid, ...) is reported once, with what to
do, and training goes on at stock clocks.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from megatron_energy.config import EnergyConfig
from megatron_energy.energy_dir import overhead_pairs_path
from megatron_energy.events import CapturedStep
from megatron_energy.megatron.bucket_layout import measured_buckets
from megatron_energy.megatron.collective_setup import collective_setup
from megatron_energy.megatron.modes import uses_full_iteration_graph
from megatron_energy.megatron.pipeline_layout import job_layers
from megatron_energy.megatron.schedule import megatron_schedule_tables
from megatron_energy.pipeline.chunk_layers import ChunkLayers
from megatron_energy.pipeline.job_collectives import CollectiveSetup
from megatron_energy.pipeline.moe import MoeShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import TransformerShape
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.control_plane.comms import Group, TorchComms
from megatron_energy.runtime.control_plane.gloo_groups import control_plane_comms
from megatron_energy.runtime.energy_log.overhead_check import OverheadCheck, OverheadResult
from megatron_energy.runtime.parts import PlanFollower
from megatron_energy.runtime.profiling.job_length import too_short_line
from megatron_energy.runtime.running.collective_points import CollectivePlanError
from megatron_energy.runtime.session_phase import SessionPhase

logger = logging.getLogger(__name__)


def transformer_shape(args: Any) -> TransformerShape:
    """The model shape from Megatron's parsed arguments."""
    return TransformerShape(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        ffn_hidden_size=args.ffn_hidden_size or 4 * args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size,
        vocab_size=getattr(args, "padded_vocab_size", None) or getattr(args, "vocab_size", None) or 50304,
        tensor_parallel=args.tensor_model_parallel_size,
        num_query_groups=args.num_query_groups if getattr(args, "group_query_attention", False) else None,
        gated_mlp=bool(getattr(args, "swiglu", False)),
        moe=_moe_shape(args),
        params_dtype=_params_dtype(args),
        fp8=bool(getattr(args, "fp8", None)),
    )


def _params_dtype(args: Any) -> str:
    """``bf16``, ``fp16`` or ``fp32`` from ``--bf16`` / ``--fp16``.

    Arguments without either flag (not Megatron's parser) give bf16, the job files' default.
    """
    if getattr(args, "fp16", False):
        return "fp16"
    return "bf16" if getattr(args, "bf16", True) else "fp32"


def _moe_shape(args: Any) -> MoeShape | None:
    """The MoE layers from ``--num-experts`` and friends (``None`` for a dense model).

    Every layer is taken as an MoE layer with the all-to-all dispatcher (``pipeline.moe``); the expert group's
    link is taken to be NVLink (the model's default, for simulated GPUs' timing and the collective scheduler).
    """
    num_experts = getattr(args, "num_experts", None)
    if not num_experts:
        return None
    return MoeShape(
        num_experts=num_experts,
        topk=args.moe_router_topk,
        expert_parallel=args.expert_model_parallel_size,
        ffn_hidden_size=getattr(args, "moe_ffn_hidden_size", None),
        overlapped_all_to_all=bool(getattr(args, "overlap_moe_expert_parallel_comm", False)),
    )


def metric_sinks(step_writer: Any, wandb_writer: Any) -> tuple[Any, ...]:
    """Scalar writers for Megatron's TensorBoard and W&B writers, where enabled."""
    sinks: list[Any] = []
    if step_writer is not None:
        sinks.append(lambda name, value, step: step_writer.add_scalar(name, value, step))
    if wandb_writer is not None:
        sinks.append(lambda name, value, step: wandb_writer.log({name: value}, step))
    return tuple(sinks)


def parallel_job_context(
    *,
    shape: TransformerShape,
    num_microbatches: int,
    microbatch_group_size: int | None = None,
    combined: bool = False,
    layers: ChunkLayers | None = None,
    log_interval: int = 10,
    log_sinks: tuple[Any, ...] = (),
    collectives: CollectiveSetup | None = None,
    full_iteration_graph: bool = False,
    megatron_log_energy: bool = False,
) -> tuple[JobContext, TorchComms]:
    """This rank's ``JobContext`` and collectives from megatron-core's initialised parallel state.

    The executed orders are computed here, once, with the schedule's own group size; every DAG of the job is
    built from them, so the plan's DAG is the DAG the hooks observe.

    Args:
        shape: The transformer shape whose work simulated GPUs time (and the fingerprint names).
        num_microbatches: Microbatches per iteration (per data-parallel replica).
        microbatch_group_size: ``microbatch_group_size_per_vp_stage``; ``None``: the pipeline size.
        combined: Megatron runs the combined 1F1B schedule (``--overlap-moe-expert-parallel-comm``).
        layers: Decoder layers per model chunk from ``--pipeline-model-parallel-layout``; ``None``: even.
        log_interval: Steps between energy log lines.
        log_sinks: Scalar writers ``(name, value, step)``.
        collectives: The job's collectives as Megatron configured them (``megatron.collective_setup``).
        full_iteration_graph: Megatron captures the training step as one CUDA graph.
        megatron_log_energy: Megatron's own ``--log-energy`` is on.

    Returns:
        The context and the collectives: over this rank's pipeline, tensor(-and-context) and data-parallel
        groups, as gloo (CPU) groups of the same ranks created here once under an NCCL job, so that no
        message of the session waits for the GPU (``runtime.control_plane.gloo_groups``); no group spans the
        world.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    device = "cuda" if torch.cuda.is_available() else "cpu"
    orders = pipeline_orders(
        ps.get_pipeline_model_parallel_world_size(),
        num_microbatches,
        ps.get_virtual_pipeline_model_parallel_world_size() or 1,
        microbatch_group_size=microbatch_group_size,
        combined=combined,
        tables=megatron_schedule_tables,
    )
    context = JobContext(
        pipeline_rank=ps.get_pipeline_model_parallel_rank(),
        orders=orders,
        data_parallel_rank=ps.get_data_parallel_rank(),
        data_parallel_size=ps.get_data_parallel_world_size(),
        tensor_parallel_size=ps.get_tensor_model_parallel_world_size(),
        shape=shape,
        layers=layers,
        collectives=collectives,
        full_iteration_graph=full_iteration_graph,
        global_rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_device_index=torch.cuda.current_device() if device == "cuda" else 0,
        log_interval=log_interval,
        log_sinks=log_sinks,
        megatron_log_energy=megatron_log_energy,
    )
    groups: dict[Group, Any] = {
        "pipeline": ps.get_pipeline_model_parallel_group(),
        "tensor": ps.get_tensor_and_context_parallel_group(),
        "data": ps.get_data_parallel_group(),
    }
    return context, control_plane_comms(groups, device)


def megatron_job_context(
    model_chunks: Callable[[], Sequence[Any] | None] | None = None,
) -> tuple[JobContext, TorchComms]:
    """This rank's ``JobContext`` and collectives, read from Megatron's initialised state and arguments.

    Args:
        model_chunks: Returns this rank's DDP model chunks (``None`` until built), for the measured bucket
            layout; without them (or with another wrapper than megatron-core's DDP) the planner models it.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.training.global_vars import get_args, get_tensorboard_writer, get_wandb_writer

    args = get_args()
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or dist.get_world_size()
    data_parallel = ps.get_data_parallel_world_size(with_context_parallel=True)
    chunks = model_chunks() if model_chunks is not None else None
    buckets = None
    if chunks and data_parallel > 1:
        try:
            buckets = measured_buckets(chunks, ps.get_pipeline_model_parallel_rank())
        except CollectivePlanError:  # not megatron-core's DDP: the planner models the buckets
            buckets = None
    full_iteration = uses_full_iteration_graph(args)
    return parallel_job_context(
        shape=transformer_shape(args),
        num_microbatches=get_num_microbatches(),
        microbatch_group_size=getattr(args, "microbatch_group_size_per_vp_stage", None),
        combined=bool(getattr(args, "overlap_moe_expert_parallel_comm", False)),
        layers=job_layers(args),
        log_interval=args.log_interval,
        log_sinks=metric_sinks(get_tensorboard_writer(), get_wandb_writer()),
        # collective launch points and SM budgets are fixed in a full-iteration graph: none are planned
        collectives=None
        if full_iteration
        else collective_setup(args, data_parallel, ranks_per_node, buckets=buckets),
        full_iteration_graph=full_iteration,
        megatron_log_energy=bool(getattr(args, "log_energy", False)),
    )


def graph_settling_steps() -> int:
    """Steps a CUDA-graph job runs before its graphs replay: its warm-up steps and the capture (0 without).

    Read from Megatron's arguments (``--cuda-graph-impl``, ``--cuda-graph-warmup-steps``).
    """
    from megatron.training.global_vars import get_args

    args = get_args()
    if getattr(args, "cuda_graph_impl", "none") in (None, "none"):
        return 0
    return int(getattr(args, "cuda_graph_warmup_steps", 0) or 0) + 1


def training_length(step: int) -> tuple[int, int] | None:
    """Megatron's ``--train-iters`` and the iterations left from step ``step`` of this process on.

    The iterations done before it are Megatron's ``curr_iteration`` (a resumed job's included), else the
    checkpoint's ``iteration`` plus ``step``. ``None`` for a job sized by ``--train-samples``.
    """
    from megatron.training.global_vars import get_args

    args = get_args()
    train_iters = getattr(args, "train_iters", None)
    if not train_iters:
        return None
    done = getattr(args, "curr_iteration", None)
    if done is None:
        done = (getattr(args, "iteration", 0) or 0) + step
    return int(train_iters), int(train_iters) - int(done)


class DeferredSession:
    """A ``ScheduleListener`` that builds the energy session at the first training step.

    Args:
        config: The ``--energy-*`` configuration.
    """

    def __init__(self, config: EnergyConfig) -> None:
        self.config = config
        self.session: Any = None
        self.failed = False
        self.overhead_check: OverheadCheck | None = None
        """``--energy-overhead-check``: suspends the session in every other block of steps."""
        self._active = True  # whether schedule events reach the session (the overhead check may suspend it)
        self.model_chunks: Callable[[], Sequence[Any] | None] | None = None
        """Returns this rank's DDP model chunks (set by ``collective_runner.follow_session``)."""
        self.plan_followers: list[PlanFollower] = []
        """Follow the session's state from its start: told which plan point runs, and each change
        (``collective_runner.follow_session``)."""

    def _start(self, step: int) -> None:
        from megatron_energy.runtime.assembly import build_session

        try:
            context, comms = megatron_job_context(self.model_chunks)
            self.session = build_session(self.config, context, comms)
            for follower in self.plan_followers:
                self.session.state.follow(follower)
            if self.config.overhead_check:
                measured = self.session.timer.source == "measured"
                self.overhead_check = OverheadCheck(self.config.overhead_check, measured_energy=measured)
            self._say_if_too_short(step)
        except Exception as problem:  # build_session made every rank agree: all ranks come here, or none
            self.failed = True
            logger.info(f"[energy] not optimising, training continues at stock clocks: {problem}")

    def on_step_begin(self, step: int) -> None:
        """Build the session on the first step after any CUDA graph warm-up and capture, then forward.

        Megatron runs the first ``--cuda-graph-warmup-steps`` steps of a CUDA-graph job eagerly and captures
        its graphs in the next one (per-layer graphs, ``local`` or ``transformer_engine``, or the whole step,
        ``full_iteration``): none of those steps runs as the job will, so the session starts after them and
        profiles graphed steps only.
        """
        if self.session is None and not self.failed:
            if step < graph_settling_steps():
                return
            self._start(step)
        if self.session is None:
            return
        if self.overhead_check is not None:
            self._active = self.overhead_check.before_step(step, self.session)
        if self._active:
            self.session.on_step_begin(step)

    def _say_if_too_short(self, step: int) -> None:
        """Rank 0, as profiling starts: one line if the job ends first (``runtime.profiling.job_length``)."""
        session = self.session
        if session.context.global_rank != 0 or session.phase != SessionPhase.PROFILING:
            return
        length = training_length(step)
        line = None if length is None else too_short_line(session.collector, length[1], length[0])
        if line is not None:
            logger.info(line)

    def _taking_part(self) -> bool:
        return self.session is not None and self._active

    def on_step_end(self, step: int) -> None:
        """Forward to the session."""
        if self._taking_part():
            self.session.on_step_end(step)

    def on_instruction_begin(self, kind: str, microbatch: int, chunk: int) -> None:
        """Forward to the session."""
        if self._taking_part():
            self.session.on_instruction_begin(kind, microbatch, chunk)

    def on_instruction_end(self, kind: str, microbatch: int, chunk: int) -> None:
        """Forward to the session."""
        if self._taking_part():
            self.session.on_instruction_end(kind, microbatch, chunk)

    def on_p2p_begin(self, op: str) -> None:
        """Pipeline communication: nothing to do."""

    def on_p2p_end(self, op: str) -> None:
        """Pipeline communication: nothing to do."""

    def on_outside_begin(self, name: str) -> None:
        """Forward to the session (outside phases: gradient sync, optimizer step, parameter all-gather)."""
        if self._taking_part():
            self.session.on_outside_begin(name)

    def on_outside_end(self, name: str) -> None:
        """Forward to the session."""
        if self._taking_part():
            self.session.on_outside_end(name)

    def on_unmeasured_step(self, step: int) -> None:
        """Forward to the session (a full-iteration CUDA graph was captured in ``step``)."""
        if self._taking_part():
            self.session.on_unmeasured_step(step)

    def on_graph_replay(self, captured: CapturedStep) -> None:
        """Forward to the session (the step replays the captured graph)."""
        if self._taking_part():
            self.session.on_graph_replay(captured)

    def close(self) -> None:
        """Close the session (the controller resets the clocks it locked); log the overhead check's result."""
        if self.session is None:
            return
        self.session.close()
        check = self.overhead_check
        if check is not None:
            result = check.result()
            rank = self.session.context.global_rank
            logger.info(
                f"[energy] rank {rank}: "
                + (
                    "overhead check: fewer than two complete pairs of blocks ran; train longer or give a "
                    "smaller --energy-overhead-check"
                    if result is None
                    else result.describe(clocks_set=self.session.can_set_clocks)
                    + self._keep_pairs(result, rank)
                )
            )

    def _keep_pairs(self, result: OverheadResult, rank: int) -> str:
        """Write the pairs to ``--energy-dir`` (runs can be pooled from them); say where, or why not."""
        path = overhead_pairs_path(self.config.dir, rank)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result.to_json()))
        except OSError as problem:
            return f"; its pairs could not be written to {path}: {problem}"
        return f"; pairs in {path}"


def create_session(config: EnergyConfig) -> DeferredSession:
    """The energy-session listener for a Megatron job (built at its first training step)."""
    return DeferredSession(config)
