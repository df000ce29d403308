"""Issue 43, item 2: one builder of ``PlanningJob`` (``optimisers.interface.planning_job``), used offline,
live and in comparisons, so a live MoE job plans with its MoE layer pattern as the same job offline does."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml

from megatron_energy.config import EnergyConfig
from megatron_energy.job import JobConfig
from megatron_energy.optimisers.registry import resolve
from megatron_energy.pipeline.modelled_phases import LAYER_PATTERN, layer_pattern
from megatron_energy.plan import ClockAction, Plan
from megatron_energy.plan_file import read_plan
from megatron_energy.runtime.context import JobContext
from megatron_energy.runtime.planning_round.replanning import Replanner, planning_job
from megatron_energy.runtime.profiling.measured_inputs import MeasuredInputs
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.target import parse_target

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "configs" / "examples" / "mixtral-8x7b-pp4-tp2-ep4-h200.yaml"
BUILDER = ("megatron_energy.optimisers.interface", "planning_job")


def _moe_job() -> JobConfig:
    """The Mixtral example on two stages with 4 microbatches (a quick plan)."""
    data = yaml.safe_load(EXAMPLE.read_text()) | {"global_batch_size": 16, "pipeline_stages": 2}
    return JobConfig.from_dict(data)


def _live_context(job: JobConfig) -> JobContext:
    """Rank 0's context of the job, as the session factory builds it from Megatron's arguments."""
    return JobContext(
        0,
        job.orders(),
        0,
        job.data_parallel,
        tensor_parallel_size=job.tensor_parallel,
        shape=job.shape,
        collectives=job.collective_setup(),
    )


@pytest.mark.slow
def test_a_live_moe_job_plans_with_its_layer_pattern() -> None:
    job = _moe_job()
    spec = dataclasses.replace(job.spec(), switch_latency_s=1e-4)  # a layer's runs get clocks of their own
    config = EnergyConfig(mode="kernel", target=parse_target("iso-time"))
    optimiser = resolve("kernel")
    measured = MeasuredInputs(optimiser.request)  # nothing measured: the phases are modelled
    profile = job.synthetic_profile(spec)
    baseline = StockBaseline(iteration_s=1.0)
    live = planning_job(config, _live_context(job), spec, "live", optimiser.request, measured)
    moe_pattern = layer_pattern(job.shape, spec)
    assert moe_pattern != LAYER_PATTERN
    offline = job.planning_job(config.target, 2, spec=spec)
    assert live.layer_pattern == moe_pattern == offline.layer_pattern
    assert live.compute_mixes == offline.compute_mixes

    replanned = Replanner(config, _live_context(job), spec, optimiser)(
        {
            "profile.csv": profile.to_csv_text().encode(),
            "baseline.json": baseline.to_json().encode(),
            "measured.json": measured.to_json().encode(),
        },
        "live",
    )
    phase_clocks = _phase_clocks(read_plan(replanned["plan.json"]))
    assert phase_clocks == _phase_clocks(optimiser.plan(profile, live))
    dense = dataclasses.replace(live, layer_pattern=LAYER_PATTERN)
    assert phase_clocks != _phase_clocks(optimiser.plan(profile, dense)), (
        "the MoE layer's runs (router, dispatch, experts, combine) set the phase clocks"
    )


def _phase_clocks(plan: Plan) -> list[tuple[str, int]]:
    """The target point's clock actions inside instructions: (phase boundary, clock)."""
    return [
        (action.at.phase, action.clock_mhz)
        for rank in plan.target_point.ranks
        for action in rank.actions
        if isinstance(action, ClockAction) and action.at.phase is not None
    ]


def _constructions(path: Path) -> list[tuple[str, int]]:
    """Where a module calls ``PlanningJob(...)``: (enclosing function, line)."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call):
                callee = child.func
                called = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", None)
                if called == "PlanningJob":
                    found.append((name, child.lineno))
            visit(child, name)

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return found


def test_planning_job_is_built_in_one_place() -> None:
    package = ROOT / "megatron_energy"
    strays = []
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        strays += [
            f"{module}:{line} ({function or 'module level'})"
            for function, line in _constructions(path)
            if (module, function) != BUILDER
        ]
    assert not strays, "build a PlanningJob with optimisers.interface.planning_job:\n" + "\n".join(strays)
