"""The combined 1F1B orders (``pipeline_orders(..., combined=True)``) equal the steps megatron-core runs.

A 4-rank gloo world runs megatron-core's real combined schedules (``combined_1f1b_world``: its loops, p2p and
bookkeeping; the layer-wise step itself is a CPU stand-in) for every shape megatron-core takes the combined
path on: no pipelining, and interleaved pipelines of 2 and 4 stages with 2 chunks, at several microbatch
counts. Each rank's recorded steps must equal that rank's order, fused pair for fused pair.
"""

from __future__ import annotations

import pytest
from combined_1f1b_world import SHAPES, record_combined_orders
from megatron_harness import spawn_world

from megatron_energy.pipeline.instruction import FusedInstruction, Instruction, Step
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan_file import load_plan

WORLD_SIZE = 4
SHAPE_KEYS = [
    (pipeline_size, virtual_size or 1, microbatches)
    for pipeline_size, virtual_size, counts in SHAPES
    for microbatches in counts
]


def _as_recorded(step: Step) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """A step as the recorder writes it: ``((microbatch, chunk) of the forward, ... of the backward)``."""
    if isinstance(step, FusedInstruction):
        return (step.forward.microbatch, step.forward.chunk), (step.backward.microbatch, step.backward.chunk)
    assert isinstance(step, Instruction)
    ids = (step.microbatch, step.chunk)
    return (ids, None) if step.kind == "forward" else (None, ids)


def _as_events(step: Step) -> list[tuple]:
    """The hooks' events of one step: one instruction, ``fused`` with the forward's ids for a pair."""
    ids = (step.kind, step.microbatch, step.chunk)
    return [("instruction_begin", *ids), ("instruction_end", *ids)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return spawn_world(record_combined_orders, WORLD_SIZE, tmp_path_factory.mktemp("combined_1f1b"))


@pytest.mark.world
@pytest.mark.parametrize("shape", SHAPE_KEYS, ids=lambda shape: "pp{}-vpp{}-m{}".format(*shape))
def test_combined_orders_equal_the_steps_megatron_core_runs_and_the_hooks_report_them(
    recorded: list[dict], shape
) -> None:
    pipeline_size, num_chunks, microbatches = shape
    orders = pipeline_orders(pipeline_size, microbatches, num_chunks, combined=True)
    for rank_results in recorded:
        result = rank_results[shape]
        steps = orders.steps(result["stage"])
        assert result["steps"] == [_as_recorded(step) for step in steps]
        # the launcher's hooks: one instruction per combined_forward_backward_step call, none from the timers
        events = [event for event in result["events"] if event[0].startswith(("instruction", "step"))]
        expected = [event for step in steps for event in _as_events(step)]
        assert events == [("step_begin", 0), *expected, ("step_end", 0)]
    # the shape really fuses: every steady step runs a forward and a backward together
    fused = sum(isinstance(step, FusedInstruction) for step in orders.all_steps())
    assert fused > 0 or microbatches == 1


def test_no_pipelining_is_one_forward_fused_pairs_and_one_backward() -> None:
    labels = [step.label for step in pipeline_orders(1, 4, combined=True).steps(0)]
    assert labels == ["F0c0", "F1c0+B0c0", "F2c0+B1c0", "F3c0+B2c0", "B3c0"]


def test_interleaved_warmup_is_one_microbatch_longer_than_without_fusing() -> None:
    plain = pipeline_orders(2, 4, 2)
    combined = pipeline_orders(2, 4, 2, combined=True)
    for stage in range(2):
        plain_warmup = next(i for i, step in enumerate(plain.stage(stage)) if step.kind == "backward") - 1
        combined_warmup = next(i for i, step in enumerate(combined.steps(stage)) if step.kind != "forward")
        assert combined_warmup == plain_warmup + 1


def test_combined_pipelining_without_interleaving_is_refused_as_megatron_core_refuses_it() -> None:
    with pytest.raises(ValueError, match="only when interleaved"):
        pipeline_orders(2, 4, combined=True)


def test_a_combined_step_that_runs_other_passes_than_predicted_is_a_mismatch() -> None:
    from megatron_energy.megatron.expected_order import ExpectedOrder, ScheduleMismatchError

    expected = ExpectedOrder(lambda: pipeline_orders(1, 3, combined=True).steps(0))
    expected.start()
    assert expected.begin_step(True, False, 0).label == "F0c0"
    with pytest.raises(ScheduleMismatchError, match=r"is a forward, but .* predicts fused"):
        expected.begin_step(True, False, 1)
    expected.start()
    expected.begin_step(True, False, 0)
    with pytest.raises(ScheduleMismatchError, match=r"runs the forward of microbatch 2.*predicts F1c0\+B0c0"):
        expected.begin_step(True, True, 2)


@pytest.mark.world
def test_the_session_profiles_plans_and_runs_clocks_per_fused_step(tmp_path, capsys) -> None:
    """PP=2 x VPP=2 combined 1F1B on simulated GPUs (modelled figures): fused steps are timed while profiling,
    Perseus plans a clock per fused step, and every rank runs that plan."""
    import json

    from session_world import SessionSettings, run_world

    from megatron_energy.cli import main
    from megatron_energy.runtime.session_phase import SessionPhase

    energy_dir = tmp_path / "energy"
    settings = SessionSettings(
        pipeline_size=2,
        virtual_size=2,
        num_microbatches=4,
        combined=True,
        freq_grid=(1980, 1530, 1305),
        profile_iters=1,
        run_steps=3,
        energy_dir=energy_dir,
    )
    reports = run_world(settings, tmp_path / "results")
    orders = pipeline_orders(2, 4, 2, combined=True)
    fingerprint = json.loads((energy_dir / "last_job.json").read_text())["fingerprint"]
    plan = load_plan(energy_dir / fingerprint / "plan.json")
    assert plan.optimisers == ("perseus",)
    for report in reports:
        assert [step.phase for step in report.steps][-settings.run_steps :] == [SessionPhase.PLANNED] * 3
        for phase in (SessionPhase.PROFILING, SessionPhase.PLANNED):
            timed = [(kind, mb) for _, ph, kind, mb, _, _ in report.instructions if ph == phase]
            expected = [(step.kind, step.microbatch) for step in orders.steps(report.stage)]
            assert timed[: len(expected)] == expected  # one timed sample per step, fused ones as such
        assert list(plan.target_point.step_clocks(report.stage)) == list(orders.steps(report.stage))
    # the cache names the schedule (a plain 1F1B job's plan is never reused), and the report rebuilds its DAG
    assert json.loads((energy_dir / fingerprint / "job.json").read_text())["parts"]["combined_1f1b"] is True
    assert main(["report", "--energy-dir", str(energy_dir)]) == 0
    timeline = json.loads((energy_dir / fingerprint / "timeline.json").read_text())
    fused_events = [
        e for e in timeline["traceEvents"] if e["ph"] == "X" and "+B" in str(e["args"].get("instruction"))
    ]
    assert fused_events
