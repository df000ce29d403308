"""Drive megatron-core's combined 1F1B schedules on CPU and record the steps they run, for the order tests.

megatron-core takes its combined path (``combined_1f1b.py``) when ``config.overlap_moe_expert_parallel_comm``
is set on a training schedule: ``forward_backward_no_pipelining`` calls
``combined_1f1b_schedule_for_no_pipelining``, and ``forward_backward_pipelining_with_interleaving`` routes
every warm-up, steady and cool-down step through ``combined_1f1b_schedule_for_interleaved_pipelining``. Both
call the module global ``combined_1f1b.combined_forward_backward_step`` once per step. On CPU, and without
expert parallelism, the real one cannot run: it needs ``GPTModel.build_schedule_plan`` (a MoE transformer's
layer-wise plan with CUDA events and streams). This worker keeps megatron-core's loops, p2p traffic over gloo
and bookkeeping (input/output tensor queues, chunk and microbatch ids) real and replaces only that step with
a CPU stand-in that runs megatron-core's own ``forward_step`` then ``backward_step`` on the tiny GPT. The
stand-in records which forward and which backward each call ran: the forward's ids from its arguments, the
backward's from a tag its own forward put on the output tensor that megatron-core hands back for the backward.

The energy session's world (``session_world``, ``combined=True``) uses the same stand-in
(:func:`use_cpu_combined_step`). Two CPU shims, besides the harness's: the communication stream is preset
(``set_streams`` otherwise creates a CUDA stream), and the flag is set on the built model's config
(``TransformerConfig`` asserts EP > 1, an alltoall/flex dispatcher and bf16/fp16 before it accepts it).
"""

from __future__ import annotations

from typing import Any

import torch
from megatron_harness import PipelineWorld, RecordingListener

Pass = tuple[int, int]
"""``(microbatch, chunk)``."""
Step = tuple[Pass | None, Pass | None]
"""``(forward, backward)`` of one ``combined_forward_backward_step`` call."""

SHAPES: tuple[tuple[int, int | None, tuple[int, ...]], ...] = (
    (1, None, (1, 2, 3, 5)),
    (2, 2, (2, 4, 6)),
    (4, 2, (4, 8)),
)
"""``(pipeline size, virtual size, microbatch counts)`` the world runs; every shape megatron-core takes."""


class _RecordingStep:
    """A CPU stand-in for ``combined_forward_backward_step`` that records the passes of every call."""

    def __init__(self, world: PipelineWorld):
        self.world = world
        self.steps: list[Step] = []

    def _chunk_of(self, model: Any) -> int:
        return next(i for i, chunk in enumerate(self.world.chunks) if chunk is model)

    def __call__(
        self,
        forward_step_func: Any,
        data_iterator: Any,
        f_model: Any,
        num_microbatches: int,
        input_tensor: Any,
        forward_data_store: list,
        b_model: Any,
        b_input_tensor: Any,
        b_output_tensor: Any,
        b_output_tensor_grad: Any,
        config: Any,
        f_model_chunk_id: int | None = None,
        pre_forward: Any = None,
        pre_backward: Any = None,
        post_forward: Any = None,
        post_backward: Any = None,
        collect_non_loss_data: bool = False,
        checkpoint_activations_microbatch: Any = None,
        is_first_microbatch: bool = False,
        current_microbatch: int | None = None,
        **_: Any,
    ) -> tuple[Any, Any, Any]:
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel.schedules import backward_step, forward_step

        forward: Pass | None = None
        backward: Pass | None = None
        output_tensor, num_tokens, input_tensor_grad = None, None, None
        if f_model is not None:
            chunk = self._chunk_of(f_model)
            assert f_model_chunk_id in (None, chunk)
            forward = (int(current_microbatch or 0), chunk)
            if pre_forward is not None:
                pre_forward()
            output_tensor, num_tokens = forward_step(
                forward_step_func,
                data_iterator,
                f_model,
                num_microbatches,
                input_tensor,
                forward_data_store,
                config,
                cp_group_size=1,
                collect_non_loss_data=collect_non_loss_data,
                is_first_microbatch=is_first_microbatch,
                current_microbatch=current_microbatch,
                vp_stage=chunk,
                is_last_stage=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=chunk),
            )
            tagged = output_tensor[0] if isinstance(output_tensor, list) else output_tensor
            tagged.recorded_pass = forward
            if post_forward is not None:
                output_tensor = post_forward(output_tensor)
        if b_model is not None:
            tagged = b_output_tensor[0] if isinstance(b_output_tensor, list) else b_output_tensor
            backward = tagged.recorded_pass
            assert backward[1] == self._chunk_of(b_model), "the backward's output tensor is another chunk's"
            if pre_backward is not None:
                pre_backward()
            input_tensor_grad = backward_step(b_input_tensor, b_output_tensor, b_output_tensor_grad, config)
            if post_backward is not None:
                input_tensor_grad = post_backward(input_tensor_grad)
        self.steps.append((forward, backward))
        return output_tensor, num_tokens, input_tensor_grad


def _hooked(world: PipelineWorld, recorder: _RecordingStep, num_microbatches: int) -> tuple[Any, list]:
    """The launcher's hooks on this world (``install_hooks(combined=True)``'s pieces): the timers proxy
    with the forward/backward timers silenced, and ``combined_step_hooks`` around the recorder."""
    from megatron.core.timers import Timers

    from megatron_energy.megatron.expected_order import ExpectedOrder, current_rank_order
    from megatron_energy.megatron.hooked_timers import HookedTimers
    from megatron_energy.megatron.schedule_hooks import ScheduleHooks
    from megatron_energy.megatron.traced_calls import combined_step_hooks

    listener = RecordingListener()
    hooks = ScheduleHooks(listener)
    expected = ExpectedOrder(lambda: current_rank_order(num_microbatches, combined=True))
    world.config.timers = HookedTimers(Timers(0, "minmax"), hooks, expected, combined=True)
    return combined_step_hooks(recorder, hooks, expected), listener.events


def use_cpu_combined_step(world: PipelineWorld) -> _RecordingStep:
    """Make ``world`` run megatron-core's combined 1F1B schedules with the CPU stand-in step (until exit)."""
    from megatron.core.pipeline_parallel import combined_1f1b

    # set_streams keeps the first stream it is given; without one it creates a CUDA stream
    combined_1f1b.set_streams(comm_stream="no CUDA stream on CPU")
    for chunk in world.chunks:
        chunk.config.overlap_moe_expert_parallel_comm = True
    recorder = _RecordingStep(world)
    combined_1f1b.combined_forward_backward_step = recorder
    return recorder


def record_combined_orders(rank: int, world_size: int, payload: None) -> dict[tuple[int, int, int], dict]:
    """Worker: run every shape of ``SHAPES`` that fits the world, under the launcher's combined-1F1B hooks.

    Returns:
        ``(pipeline size, virtual size or 1, microbatches)`` -> ``{"stage": pipeline rank, "steps": [...],
        "events": the hooks' events, "losses": [...]}``.
    """
    from megatron.core.pipeline_parallel import combined_1f1b

    original = combined_1f1b.combined_forward_backward_step
    results: dict[tuple[int, int, int], dict] = {}
    try:
        for pipeline_size, virtual_size, microbatch_counts in SHAPES:
            if world_size % pipeline_size:
                continue
            world = PipelineWorld(pipeline_size=pipeline_size, virtual_size=virtual_size)
            for num_microbatches in microbatch_counts:
                recorder = use_cpu_combined_step(world)
                combined_1f1b.combined_forward_backward_step, events = _hooked(
                    world, recorder, num_microbatches
                )
                losses = world.run(num_microbatches)
                assert all(torch.isfinite(torch.tensor(losses))), losses
                results[pipeline_size, virtual_size or 1, num_microbatches] = {
                    "stage": world.pipeline_rank,
                    "steps": recorder.steps,
                    "events": events,
                    "losses": losses,
                }
    finally:
        combined_1f1b.combined_forward_backward_step = original
    return results
