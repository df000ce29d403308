"""The offline path imports neither torch nor megatron-core: ``plan``, ``simulate``, ``report``, ``estimate``,
the planner.

Each runs in a fresh interpreter (this test process has imported both long ago), which then lists the heavy
packages in its ``sys.modules``. ``tests/data/profile_pp8_h100.csv`` is the S=8 profile the ``plan`` timing
uses (``lab/bench_plan_command.py``): ``Profile.synthetic`` of gpt3-6.7b on h100-sxm over the session's
automatic 6-clock grid (``runtime.assembly.profiling_grid``).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from demo_run import DemoRun

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers import registry
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.runtime.child_process import INPUT_FILE, RESULT_FILE
from megatron_energy.runtime.planning_round.planner_process import PlannerInput
from megatron_energy.runtime.planning_round.planning import PlanRelease
from megatron_energy.runtime.profiling.stock_baseline import StockBaseline
from megatron_energy.target import EnergyTarget

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "tests" / "data" / "profile_pp8_h100.csv"
EXAMPLE_JOB = ROOT / "configs" / "examples" / "gpt3-xl-pp4-h100.yaml"
HEAVY = ("torch", "megatron")
QUICK = ("--points", "4", "--switch-latency-ms", "0")
"""``plan`` arguments that keep the test quick: few frontier points, no switch-latency repair."""

PROBE = """
import sys
from megatron_energy.{module} import main
status = main(sys.argv[1:])
print("heavy:", *sorted(name for name in {heavy!r} if name in sys.modules))
sys.exit(status)
"""
CLI_PROBE = PROBE.format(module="cli", heavy=HEAVY)
PLANNER_PROBE = PROBE.format(module="runtime.child_process", heavy=HEAVY)
"""The planner process as ``ChildProcess`` runs it (``python -m megatron_energy.runtime.child_process``)."""


def _heavy_imports(probe: str, *args: str) -> list[str]:
    """Run ``probe`` with ``args`` in a fresh interpreter; the heavy packages it imported."""
    child = subprocess.Popen(
        [sys.executable, "-c", probe, *args],
        stdin=subprocess.PIPE,  # held open: the planner process ends when it closes
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    out = child.stdout.read()  # type: ignore[union-attr]
    child.stdin.close()  # type: ignore[union-attr]
    assert child.wait() == 0, out
    (line,) = [line for line in out.splitlines() if line.startswith("heavy:")]
    return line.split()[1:]


@pytest.mark.slow
def test_plan_on_a_profile_csv_imports_neither_torch_nor_megatron(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    shape = ("--stages", "8", "--microbatches", "32", "--gpu-spec", "h100-sxm", *QUICK)
    assert _heavy_imports(CLI_PROBE, "plan", "--profile", str(PROFILE), *shape, "--out", str(plan)) == []
    assert plan.exists()


@pytest.mark.slow
def test_plan_and_simulate_of_a_job_config_import_neither_torch_nor_megatron(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    job = ("--config", str(EXAMPLE_JOB))
    assert _heavy_imports(CLI_PROBE, "plan", *job, *QUICK, "--out", str(plan)) == []
    assert _heavy_imports(CLI_PROBE, "simulate", *job, "--plan", str(plan), "--power-swing") == []


def test_estimate_from_a_megatron_command_line_imports_neither_torch_nor_megatron() -> None:
    layout = ("--gpu-spec", "h100-sxm", "--gpus", "2", "--target", "iso-time", *QUICK[:2], "--trials", "1")
    megatron = [
        *("--pipeline-model-parallel-size", "2", "--num-layers", "2", "--hidden-size", "512"),
        *("--num-attention-heads", "4", "--seq-length", "256", "--micro-batch-size", "1"),
        *("--global-batch-size", "4", "--padded-vocab-size", "1024", "--bf16"),
    ]
    assert _heavy_imports(CLI_PROBE, "estimate", *layout, "--", *megatron) == []


def test_the_planner_process_imports_neither_torch_nor_megatron(tmp_path: Path) -> None:
    spec = load_gpu_spec("h100-sxm")
    profile = Profile.synthetic(TransformerShape.from_name("gpt3-1.3b"), spec, 2, clocks_mhz=(1980, 1005))
    job = PlanningJob(pipeline_orders(2, 4), fingerprint="offline-imports", target=EnergyTarget("iso-time"))
    task = PlannerInput("perseus", registry.registered(), profile, job, StockBaseline(iteration_s=0.1))
    (tmp_path / INPUT_FILE).write_bytes(pickle.dumps(task))
    assert _heavy_imports(PLANNER_PROBE, str(tmp_path)) == []
    assert isinstance(pickle.loads((tmp_path / RESULT_FILE).read_bytes()), PlanRelease)


@pytest.mark.world
def test_report_imports_neither_torch_nor_megatron(demo: DemoRun) -> None:
    assert demo.status == 0, demo.out[-3000:]  # the session's one demo run (conftest.demo)
    assert _heavy_imports(CLI_PROBE, "report", "--energy-dir", str(demo.energy_dir)) == []


def test_a_command_line_naming_its_subcommand_imports_that_subcommands_module_alone() -> None:
    probe = (
        "import sys\nfrom megatron_energy.cli import COMMANDS, build_parser\nbuild_parser('plan')\n"
        "print(*[name for name in COMMANDS.values() if f'megatron_energy.commands.{name}' in sys.modules])"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert loaded.stdout.split() == ["plan_command"]
