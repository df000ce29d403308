"""A live job's collectives: read from Megatron's arguments, narrowed to what the running job can honour.

``megatron.collective_setup`` reads the setup the session hands the planner (``PlanningJob.collectives``);
``pipeline.collective_levers`` keeps Kareus to what the runtime applies without a restart; the runner leaves
Megatron alone when a plan's collective actions change nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from megatron_energy.errors import EnergyValueError
from megatron_energy.job import JobConfig
from megatron_energy.megatron.collective_launch import CollectiveLauncher
from megatron_energy.megatron.collective_runner import changes_megatron
from megatron_energy.megatron.collective_setup import collective_setup
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.optimisers.kareus.choices import ClassChoice, default_choice
from megatron_energy.optimisers.kareus.collective_optimiser import KareusOptimiser, class_space
from megatron_energy.optimisers.kareus.search import CTA_DEFAULT, SearchBudget
from megatron_energy.pipeline.collective_levers import RuntimeLevers
from megatron_energy.pipeline.collective_names import (
    AFTER_OPTIMIZER,
    END,
    GEMM_OVERLAP,
    CollectiveName,
    LaunchPoint,
)
from megatron_energy.pipeline.collectives import MeasuredBucket
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.pipeline.job_collectives import CollectiveSetup
from megatron_energy.plan import Boundary, ClockAction, CollectiveAction
from megatron_energy.runtime.running.collective_points import CollectivePlanError
from megatron_energy.runtime.running.communicator_budgets import BudgetError
from megatron_energy.target import parse_target
from tests.kareus_jobs import EXAMPLE_7B

FAST = SearchBudget(trials=3)

SEND_RECV = CollectiveName("pp", "send_recv")
TP_GATHER = CollectiveName("tp", "all_gather")


def _args(**flags: object) -> SimpleNamespace:
    """Megatron's parsed arguments (the names ``megatron.training.arguments`` gives them)."""
    return SimpleNamespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=4, **flags)


def test_the_setup_is_read_from_megatrons_flags_and_communicator_config(tmp_path: Path) -> None:
    config = tmp_path / "nccl.yaml"
    config.write_text("pp: {max_ctas: 4, min_ctas: 4}\ndp_cp: {max_ctas: 8}\n")
    args = _args(
        sequence_parallel=True,
        use_distributed_optimizer=True,
        ddp_bucket_size=10_000_000,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
        nccl_communicator_config_path=str(config),
    )
    setup = collective_setup(args, data_parallel=4, ranks_per_node=8)
    assert setup == CollectiveSetup(
        data_parallel=4,
        sequence_parallel=True,
        distributed_optimizer=True,
        bucket_elements=10_000_000,
        dp_link="nvlink",  # TP 2 x DP 4 = 8 ranks per stage fill one node: the replicas share it...
        pp_link="nic",  # ...so the stage's pipeline neighbours sit on other nodes
        levers=RuntimeLevers(overlap_grad_reduce=True, overlap_param_gather=True, fixed_ctas=(("pp", 4),)),
    )
    small = collective_setup(_args(), data_parallel=1, ranks_per_node=8)
    assert (small.dp_link, small.pp_link) == ("nvlink", "nvlink")  # 2 x 1 x 4 = 8 ranks: one node
    wide = collective_setup(_args(), data_parallel=8, ranks_per_node=8)
    assert (wide.dp_link, wide.pp_link) == ("nic", "nic")  # a stage's 16 ranks span two nodes
    assert small.levers == RuntimeLevers() and not small.distributed_optimizer
    config.write_text("- not a mapping\n")
    with pytest.raises(BudgetError, match="must map process-group names"):
        collective_setup(args, data_parallel=4, ranks_per_node=8)


def test_a_setup_survives_the_job_record_and_bad_ones_are_refused() -> None:
    setup = CollectiveSetup(4, levers=RuntimeLevers(tp_comm_overlap=True, fixed_ctas=(("tp", 8),)))
    record = dataclasses.asdict(setup)
    assert CollectiveSetup.from_dict(record) == setup
    bucketed = CollectiveSetup(2, buckets=(MeasuredBucket(1, 0, 3, (-1, 4), 1000),))
    assert CollectiveSetup.from_dict(dataclasses.asdict(bucketed)) == bucketed
    with pytest.raises(EnergyValueError, match="not a collective setup"):
        CollectiveSetup.from_dict({**record, "pipeline": 3})
    with pytest.raises(EnergyValueError, match="data-parallel size must be positive"):
        CollectiveSetup(0)


def _live(levers: RuntimeLevers, sequence_parallel: bool = False) -> tuple[JobConfig, PlanningJob]:
    job = JobConfig.load(EXAMPLE_7B)
    spec = job.spec()
    setup = dataclasses.replace(
        job.collective_setup(spec), sequence_parallel=sequence_parallel, levers=levers
    )
    planning = PlanningJob(
        orders=job.orders(),
        fingerprint=job.fingerprint(),
        target=parse_target("iso-time"),
        comm=job.comm_spec(spec),
        tail=job.iteration_tail(spec),
        collectives=setup.workload(job.shape, job.orders(), spec),
        gpu=spec,
    )
    return job, planning


def test_levers_leave_the_search_only_what_the_running_job_honours() -> None:
    _, free = _live(RuntimeLevers())
    assert free.collectives is not None
    offline = dataclasses.replace(free.collectives, levers=None)
    assert class_space("pp.send_recv", offline).size > 1 and class_space("dp.all_gather", offline).size > 1
    levers = RuntimeLevers(overlap_param_gather=True, fixed_ctas=(("pp", 4),))
    _, live = _live(levers)
    assert live.collectives is not None
    reduce = class_space("dp.reduce_scatter", live.collectives)
    assert reduce.launches == (-1,) and len(reduce.ctas) > 1  # no --overlap-grad-reduce: budgets only
    gather = class_space("dp.all_gather", live.collectives)
    assert (gather.ctas, gather.launches) == ((CTA_DEFAULT,), (1,))
    assert class_space("pp.send_recv", live.collectives).ctas == (4,)
    assert default_choice("pp.send_recv", levers) == ClassChoice(4)
    assert default_choice("dp.all_gather", levers) == ClassChoice(launch=1)
    assert default_choice("dp.reduce_scatter", levers) == ClassChoice(launch=-1)
    te = RuntimeLevers(tp_comm_overlap=True, fixed_ctas=(("tp", 16),))
    assert default_choice("tp.all_gather", te) == ClassChoice(launch=1)  # userbuffers: TE's own SMs
    assert default_choice("tp.all_reduce", RuntimeLevers(fixed_ctas=(("tp", 16),))) == ClassChoice(16)


@pytest.mark.slow
def test_a_live_plan_keeps_what_megatron_fixed_at_start_up() -> None:
    job, planning = _live(RuntimeLevers(fixed_ctas=(("pp", 4), ("tp", 8))), sequence_parallel=True)
    plan = KareusOptimiser(budget=FAST).plan(job.synthetic_profile(), planning)
    last = job.orders().stage(0)[-1]
    for stage, rank in enumerate(plan.target_point.ranks):
        for action in (a for a in rank.actions if isinstance(a, CollectiveAction)):
            key = action.collective.class_key
            if key == "dp.reduce_scatter":
                assert action.at.phase == END  # megatron-core reduces at the end without the flag
            elif key == "dp.all_gather":
                assert action.at.phase == AFTER_OPTIMIZER and action.max_ctas is None
            else:
                assert action.at.phase is None and action.max_ctas == (4 if key == "pp.send_recv" else 8)
        assert stage or any(a.at.instruction == last for a in rank.actions)
    assert plan.target_point.iteration_time_s <= plan.baseline.iteration_time_s * (1 + 1e-9)


def test_only_actions_that_change_megatron_need_the_model_chunks() -> None:
    first = Boundary(Instruction(0, 0, 0, "forward"))
    assert not changes_megatron(CollectiveAction(first, SEND_RECV, None))
    assert not changes_megatron(ClockAction(first, 1980))
    assert changes_megatron(CollectiveAction(first, SEND_RECV, 4))
    assert changes_megatron(CollectiveAction(first._replace(phase=GEMM_OVERLAP), TP_GATHER, None))
    reduce = CollectiveName("dp", "reduce_scatter", bucket=0)
    assert changes_megatron(CollectiveAction(first._replace(phase=END), reduce, None))


def _launcher(tp_comm_overlap: bool, phase: LaunchPoint | None) -> None:
    """A launcher for one TP action on a model chunk whose config has ``tp_comm_overlap`` as given."""
    import torch

    chunk = SimpleNamespace(
        bucket_groups=[],
        module=torch.nn.Linear(1, 1),
        config=SimpleNamespace(tp_comm_overlap=tp_comm_overlap),
    )
    order = [Instruction(0, 0, 0, "forward"), Instruction(0, 0, 0, "backward")]
    action = CollectiveAction(Boundary(order[0], phase), TP_GATHER, None)
    CollectiveLauncher([chunk], [action], order, stage=0)


def test_tp_collectives_are_refused_where_transformer_engine_decides_and_the_message_says_why() -> None:
    with pytest.raises(CollectivePlanError) as without_te:
        _launcher(tp_comm_overlap=False, phase=GEMM_OVERLAP)
    message = str(without_te.value)
    assert "synchronously inside each layer's forward and backward" in message
    assert "does not time them one by one" in message and "add --tp-comm-overlap" in message
    with pytest.raises(CollectivePlanError, match="userbuffers run the TP/SP collectives"):
        _launcher(tp_comm_overlap=True, phase=None)
    _launcher(tp_comm_overlap=True, phase=GEMM_OVERLAP)  # what a live plan under the flag says
    _launcher(tp_comm_overlap=False, phase=None)  # NCCL at megatron-core's own launch
