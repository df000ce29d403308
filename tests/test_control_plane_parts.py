"""The control plane's parts in one process: K's rule, an exchange spread over steps, the replicas' check.

The scale test (``test_control_plane_scale``) runs them in emulated 16k-rank jobs; here each rule is pinned
down on its own: how K follows from the group sizes, the hop latency and the iteration; how a staged
exchange takes one link a step and begins every K; how a stage whose ranks disagree at stock clocks is
found by the planning's fixed-size reductions.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from reductions import PeerComms

from megatron_energy.pipeline.instruction import Work
from megatron_energy.runtime.control_plane.comms import GROUPS, Group, LocalComms, ReduceOp
from megatron_energy.runtime.control_plane.exchange_period import (
    BUDGET_S,
    EXCHANGE_BUDGET_S,
    EXCHANGES,
    HOP_S,
    exchange_cost_s,
    exchange_period,
)
from megatron_energy.runtime.control_plane.staged_exchange import (
    StagedExchange,
    Stages,
    any_rank_stages,
    pace_stages,
)
from megatron_energy.runtime.profiling.collector import ProfileRow, StepRecord
from megatron_energy.runtime.profiling.replica_profile import FIGURES, replica_profile


def test_k_keeps_the_exchanges_within_a_millisecond_per_step_at_16k_ranks():
    sizes = [16, 8, 128]  # PP16 x TP8 x DP128
    cost_s = exchange_cost_s(sizes)
    assert cost_s == pytest.approx(HOP_S * (2 * 15 + 2 * 7 + 2 * 127))  # 22.35 ms at 75 µs per hop
    period = exchange_period(sizes, iteration_s=1.0)
    # the paces and the energy line share the millisecond: each gets half of it
    assert EXCHANGES * EXCHANGE_BUDGET_S == BUDGET_S
    assert period == 45 and cost_s / period <= EXCHANGE_BUDGET_S < cost_s / (period - 1)
    assert EXCHANGES * cost_s / period <= BUDGET_S
    # a cheap exchange still takes its own steps: one per link of more than one rank
    assert exchange_period([2, 1, 2], iteration_s=1.0) == 2
    assert exchange_period([1, 1, 1], iteration_s=1.0) == 1


def test_k_grows_when_a_link_outlasts_the_iteration():
    # 5 ms iterations, a data-parallel link of 254 hops (19 ms): read four steps after it starts
    assert exchange_period([1, 1, 128], iteration_s=0.005, budget_s=1.0) == 4
    assert exchange_period([1, 1, 128], iteration_s=None, budget_s=1.0) == 1  # unknown: a step a link


def _messages() -> PeerComms:
    """Every group has two ranks and the other sends what this one sends: each link is a message."""
    return PeerComms(dict.fromkeys(GROUPS, 2))


def test_an_exchange_takes_a_link_a_step_and_begins_every_k_steps():
    comms, begun = _messages(), []

    def begin(step: int) -> Stages[bool]:
        begun.append(step)
        return any_rank_stages(comms, raised=step == 5)

    exchange: StagedExchange[bool] = StagedExchange(period=5)
    outcomes = [exchange.step(lambda step=step: begin(step)) for step in range(12)]
    assert begun == [0, 5, 10]
    assert comms.started == [*GROUPS, *GROUPS, *GROUPS[:2]]  # one link started per step, none between
    # an outcome on the step its last link is read: three links, three steps after it began
    assert outcomes == [None, None, None, False, None, None, None, None, True, None, None, None]


def test_links_over_groups_of_one_rank_take_no_step():
    exchange: StagedExchange[bool] = StagedExchange(period=1)
    assert [exchange.step(lambda: any_rank_stages(LocalComms(), raised=True)) for _ in range(3)] == [True] * 3


def test_the_pace_exchange_compares_the_replicas_of_the_step_it_began_at():
    comms, exchange = _messages(), StagedExchange[object](period=3)
    verdicts = [exchange.step(lambda step=step: pace_stages(comms, step, 0.5, abs)) for step in range(4)]
    verdict = verdicts[3]
    assert verdicts[:3] == [None, None, None] and verdict is not None
    assert (verdict.step, verdict.mine_s, verdict.slowest_s, verdict.fastest_s) == (0, 0.5, 0.5, 0.5)


class _SlowerPeer(PeerComms):
    """One stage of two replicas; the other replica's instructions take ``factor`` times as long."""

    def __init__(self, factor: float) -> None:
        super().__init__({"data": 2})
        self.factor = factor

    def peer(self, values: Sequence[float], op: ReduceOp, group: Group) -> list[float]:
        peer = list(values)
        if op == "max" and len(values) > 2 * len(FIGURES):  # the spread's figures lead the first max
            peer[:2] = [self.factor * value for value in values[:2]]  # the first: instruction time
        return peer


def _profile() -> tuple[list[ProfileRow], list[StepRecord]]:
    rows = [ProfileRow(Work(0, 0, kind), 1980, 0.010, 5.0, 4) for kind in ("forward", "backward")]
    steps = [StepRecord(1980, 0.2, 100.0, synchronised=False) for _ in range(4)]
    return rows, steps


@pytest.mark.parametrize(("factor", "said"), [(1.02, None), (1.10, "(+10.0 % > 5 %)")])
def test_a_stage_whose_replicas_disagree_beyond_the_tolerance_is_found(factor, said):
    replica = replica_profile(_SlowerPeer(factor), _profile(), 4, 1980, 0)
    (stage,) = replica.stages
    spread = stage.spread.disagreement()
    assert (spread is None) == (said is None)
    if said is not None:
        assert spread.startswith("instruction time per microbatch 20.0-22.0 ms") and spread.endswith(said)
    assert not replica.failed
    # the job's stock steps sum over both replicas' GPUs, per step
    assert replica.stock.step_energy_j == (200.0,) * 4
