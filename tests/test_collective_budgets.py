"""CTA budgets and launch-point rules without a world: what megatron-core's options builder receives, the
communicator config file, readiness of a bucket's gradients, refusals (milliseconds; no gloo)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from megatron_energy.megatron.communicators import BudgetCommunicators, nccl_options
from megatron_energy.pipeline.collective_names import END, CollectiveName, layer_start
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.plan import Baseline, Boundary, ClockAction, CollectiveAction, Plan, PlanPoint, RankPlan
from megatron_energy.runtime.running.collective_points import (
    EMBEDDING,
    HEAD,
    CollectivePlanError,
    check_gradient_launch,
    ready_point,
)
from megatron_energy.runtime.running.communicator_budgets import (
    BudgetError,
    CtaBudget,
    check_fixed_budget,
    communicator_config,
    plan_budgets,
    plan_communicator_config,
    read_communicator_config,
    write_communicator_config,
)

B = "backward"
F = "forward"
ORDER = (
    Instruction(0, 0, 0, F),
    Instruction(0, 0, 1, F),
    Instruction(0, 0, 0, B),
    Instruction(0, 0, 1, B),
)
LAST = ORDER[-1]


def test_megatron_builds_nccl_options_with_the_budget_and_keeps_the_jobs_other_settings() -> None:
    base = {"dp_cp": {"is_high_priority_stream": True, "cga_cluster_size": 2, "max_ctas": 32}}
    options = nccl_options(CtaBudget("dp_cp", 8), base)
    assert (options.config.max_ctas, options.config.min_ctas) == (8, 8)
    assert options.config.cga_cluster_size == 2
    assert options.is_high_priority_stream
    capped = nccl_options(CtaBudget("tp", 4, exact=False))
    assert capped.config.max_ctas == 4
    assert capped.config.min_ctas != 4  # NCCL's default, not the cap
    assert base["dp_cp"]["max_ctas"] == 32  # the job's config is not modified


def test_plan_budgets_are_collected_per_communicator_over_every_action() -> None:
    at = Boundary(LAST, END)
    actions = [
        ClockAction(Boundary(LAST), 1200),
        CollectiveAction(at, CollectiveName("dp", "all_reduce", bucket=0), 8),
        CollectiveAction(at, CollectiveName("dp", "all_reduce", bucket=1), 16),
        CollectiveAction(at, CollectiveName("dp", "all_reduce", bucket=2), 8),
        CollectiveAction(at, CollectiveName("dp", "all_reduce", bucket=3)),
        CollectiveAction(Boundary(ORDER[0]), CollectiveName("tp", "all_reduce"), 4),
    ]
    budgets = plan_budgets(actions)
    assert {group: [b.max_ctas for b in values] for group, values in budgets.items()} == {
        "dp_cp": [8, 16],
        "tp": [4],
    }


def test_communicator_config_sets_fixed_budgets_and_refuses_two_for_one_communicator(tmp_path: Path) -> None:
    base = {"tp": {"cga_cluster_size": 4, "min_ctas": 2}, "pp": {"net_name": "IB"}}
    config = communicator_config([CtaBudget("tp", 16), CtaBudget("pp", 2, exact=False)], base)
    assert config == {
        "tp": {"cga_cluster_size": 4, "max_ctas": 16, "min_ctas": 16},
        "pp": {"net_name": "IB", "max_ctas": 2},
    }
    path = write_communicator_config(tmp_path / "nccl.yaml", config)
    assert read_communicator_config(path) == config
    with pytest.raises(BudgetError, match="one communicator per budget"):
        communicator_config([CtaBudget("tp", 16), CtaBudget("tp", 8)])
    with pytest.raises(BudgetError, match=re.escape("outside NCCL's 1..64")):
        CtaBudget("dp_cp", 0)
    (tmp_path / "bad.yaml").write_text("- dp_cp\n")
    with pytest.raises(BudgetError, match="must map process-group names"):
        read_communicator_config(tmp_path / "bad.yaml")


def test_inline_budgets_must_be_in_the_communicator_megatron_created() -> None:
    check_fixed_budget(CollectiveName("tp", "all_reduce"), None, None)
    check_fixed_budget(CollectiveName("tp", "all_reduce"), 8, {"tp": {"max_ctas": 8, "min_ctas": 8}})
    with pytest.raises(BudgetError, match=re.escape("add 'pp: {'max_ctas': 4, 'min_ctas': 4}'")):
        check_fixed_budget(CollectiveName("pp", "send_recv"), 4, {"pp": {"max_ctas": 8}})


def test_a_bucket_is_ready_once_its_layers_have_run_their_backward() -> None:
    # four layers; a backward runs the head, then layers 3, 2, 1, 0, then the embedding
    assert ready_point([HEAD], 4) == layer_start(0)
    assert ready_point([3], 4) == layer_start(1)
    assert ready_point([3, 2], 4) == layer_start(2)
    assert ready_point([HEAD, 1], 4) == layer_start(3)
    assert ready_point([0], 4) == END
    assert ready_point([EMBEDDING, 3], 4) == END


def test_launch_points_before_the_gradients_exist_are_refused() -> None:
    layers = [4]
    check_gradient_launch(
        ORDER, 0, layers, [3], CollectiveName("dp", "all_reduce", bucket=0), Boundary(LAST, layer_start(1))
    )
    check_gradient_launch(
        ORDER, 0, layers, [3], CollectiveName("dp", "all_reduce", bucket=0), Boundary(LAST, END)
    )
    with pytest.raises(CollectivePlanError, match=r"before its gradients exist.*layer1 of B1c0"):
        check_gradient_launch(
            ORDER,
            0,
            layers,
            [3],
            CollectiveName("dp", "all_reduce", bucket=0),
            Boundary(LAST, layer_start(0)),
        )
    with pytest.raises(CollectivePlanError, match="before its gradients exist"):
        check_gradient_launch(
            ORDER, 0, layers, [HEAD], CollectiveName("dp", "all_reduce", bucket=0), Boundary(ORDER[2], END)
        )
    with pytest.raises(CollectivePlanError, match=re.escape("layer0..layer3")):
        check_gradient_launch(
            ORDER,
            0,
            layers,
            [3],
            CollectiveName("dp", "all_reduce", bucket=0),
            Boundary(LAST, layer_start(7)),
        )
    with pytest.raises(CollectivePlanError, match="does not run"):
        check_gradient_launch(
            ORDER, 0, layers, [3], CollectiveName("pp", "send_recv"), Boundary(Instruction(0, 0, 5, B), END)
        )


def test_budget_communicators_must_be_prepared_before_they_are_chosen() -> None:
    with pytest.raises(BudgetError, match="prepare the budgets"):
        BudgetCommunicators().get(object(), 8)


def test_the_written_config_gives_megatron_core_the_budgets_when_it_creates_its_communicators(
    tmp_path: Path,
) -> None:
    """Read the file as ``parallel_state.initialize_model_parallel`` does, then build each group's options."""
    import yaml
    from megatron.core import parallel_state

    budgets = [CtaBudget("dp_cp", 8), CtaBudget("tp", 16), CtaBudget("pp", 4)]
    path = write_communicator_config(tmp_path / "nccl.yaml", communicator_config(budgets))
    with open(path) as stream:
        megatron_reads = yaml.safe_load(stream)
    for budget in budgets:
        options = parallel_state.get_nccl_options(budget.group, megatron_reads)
        assert (options.config.max_ctas, options.config.min_ctas) == (budget.max_ctas, budget.max_ctas)
    assert parallel_state.get_nccl_options("ep", megatron_reads) is None  # untouched groups: NCCL defaults


def _plan_with(*rank_actions: list) -> Plan:
    return Plan(
        fingerprint="f",
        gpu_name="h200",
        provenance="modelled",
        target="iso-time",
        optimisers=("kareus",),
        switch_latency_s=0.0,
        baseline=Baseline(1.0, 1.0),
        points=(
            PlanPoint("iso-time", 1.0, 1.0, 1.0, tuple(RankPlan(tuple(a), 1.0, 1.0) for a in rank_actions)),
        ),
        target_index=0,
    )


def test_a_plans_fixed_budgets_become_the_config_megatron_starts_with() -> None:
    first0, first1 = Boundary(ORDER[0]), Boundary(Instruction(1, 0, 0, F))
    plan = _plan_with(
        [
            CollectiveAction(first0, CollectiveName("pp", "send_recv"), 4),
            CollectiveAction(first0, CollectiveName("tp", "all_reduce"), 16),
        ],
        [
            CollectiveAction(first1, CollectiveName("pp", "send_recv"), 4),
            CollectiveAction(
                Boundary(Instruction(1, 0, 1, B), END), CollectiveName("dp", "all_reduce", bucket=0), 8
            ),
        ],
    )
    config = plan_communicator_config(plan, {"tp": {"cga_cluster_size": 2}})
    assert config == {
        "pp": {"max_ctas": 4, "min_ctas": 4},
        "tp": {"cga_cluster_size": 2, "max_ctas": 16, "min_ctas": 16},
    }
    clash = _plan_with(
        [CollectiveAction(first0, CollectiveName("pp", "send_recv"), 4)],
        [CollectiveAction(first1, CollectiveName("pp", "send_recv"), 8)],
    )
    with pytest.raises(BudgetError, match="one budget per group"):
        plan_communicator_config(clash)
