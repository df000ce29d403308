"""A second optimiser plugs in as an installed plugin, without touching the session, and runs end to end.

The toy optimiser (``tests/optimiser_plugin/toy_fixed_clocks.py``) is "installed" the way a pip package
would be (``plugin_site``): a ``.dist-info`` folder on the ranks' path (``sys.path``, where ``PYTHONPATH``
puts it) declares it in the ``megatron_energy.optimisers`` entry-point group. Megatron then trains a 2-stage
pipeline through the launcher with ``--energy-mode toy`` (``launcher_world``); the toy plans in a planner
process, which finds it on the same path.
"""

from __future__ import annotations

import re

import pytest
from launcher_world import LauncherRun, run_launcher
from megatron_harness import TINY_GPT_SCRIPT
from plugin_site import PLUGIN_SOURCE, install_plugin

from megatron_energy.optimisers import registry
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan_file import load_plan

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

# 8 profiling steps (stock: settling + 4-step baseline pilot + 1 synchronous; 1005 MHz: 1 + 1), 2 planned
TRAIN_ITERS = 10
MEGATRON_ARGS = [
    "--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2",
    "--seq-length", "8", "--max-position-embeddings", "8", "--vocab-size", "64",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", str(TRAIN_ITERS), "--lr", "1e-4",
    "--pipeline-model-parallel-size", "2", "--log-interval", "1",
    "--mock-data", "--tokenizer-type", "NullTokenizer",
]  # fmt: skip
GRID_MHZ = (1980, 1005)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> LauncherRun:
    """The launcher with ``--energy-mode toy`` on 2 ranks, the plugin installed on their path."""
    root = tmp_path_factory.mktemp("toy_plugin")
    install_plugin(root / "site", {"toy": "toy_fixed_clocks:FixedClockPerKind"})
    argv = [
        str(TINY_GPT_SCRIPT), *MEGATRON_ARGS,
        "--energy-optimise", "--energy-mode", "toy", "--energy-backend", "simulated",
        "--energy-gpu-spec", "h100-sxm", "--energy-freq-grid", ",".join(map(str, GRID_MHZ)),
        "--energy-memory-clock", "off",  # the plugin's plan as it made it (the lever re-picks SM clocks)
        "--energy-profile-iters", "1", "--energy-dir", str(root / "energy"),
    ]  # fmt: skip
    return run_launcher(argv, 2, root, sys_path=[root / "site", PLUGIN_SOURCE])


def test_an_unknown_plugin_mode_is_refused_with_the_released_ones() -> None:
    problem = registry.mode_problem("toy")
    assert problem is not None and "unknown --energy-mode 'toy'" in problem and "perseus" in problem


def test_the_plugin_plans_and_its_plan_runs(toy_run: LauncherRun) -> None:
    output = toy_run.output
    assert toy_run.statuses == (0, 0), output[-4000:]
    (plan_file,) = (toy_run.folder / "energy").glob("*/plan.json")
    plan = load_plan(plan_file)
    assert plan.optimisers == ("toy",)
    orders = pipeline_orders(2, 4, 1)
    for stage in (0, 1):
        actions = plan.target_point.ranks[stage].actions
        assert [action.at.instruction for action in actions] == list(orders.stage(stage))
        assert {(action.at.instruction.kind, action.clock_mhz) for action in actions} == {
            ("forward", min(GRID_MHZ)),
            ("backward", max(GRID_MHZ)),
        }
    assert "plan for iso-time (toy)" in output
    planned = [
        line for line in output.splitlines() if line.startswith("[energy] iteration") and "| planned" in line
    ]
    assert planned, output[-4000:]
    predicted = re.search(r"predicted \(modelled\)=([\d.]+)", planned[-1])
    assert predicted is not None
    # the log prints one decimal: the rank-summed prediction is the plan's to that resolution
    assert float(predicted.group(1)) == pytest.approx(plan.target_point.energy_j, abs=0.05 + 1e-9)
