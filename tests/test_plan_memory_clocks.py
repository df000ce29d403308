"""A plan's memory clocks: written only when a rank leaves the stock one, read back, refused if unlisted."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.plan import Baseline, Boundary, ClockAction, Plan, PlanError, PlanPoint, RankPlan
from megatron_energy.plan_file import load_plan, plan_text, read_plan, save_plan


def _plan(memory_clocks_mhz: tuple[int, ...] = ()) -> Plan:
    ranks = tuple(
        RankPlan((ClockAction(Boundary(Instruction(stage, 0, 0, "forward")), 1410),), 400.0, 0.5)
        for stage in range(2)
    )
    return Plan(
        fingerprint="f" * 16,
        gpu_name="h100-sxm",
        provenance="modelled",
        target="iso-time",
        optimisers=("perseus",),
        switch_latency_s=0.01,
        baseline=Baseline(1.25, 1000.0, (500.0, 500.0)),
        points=(PlanPoint("iso-time", 1.25, 1.25, 790.0, ranks),),
        target_index=0,
        memory_clocks_mhz=memory_clocks_mhz,
    )


def _resigned(text: str, edit) -> str:
    """The plan text with ``edit`` applied to its JSON and the checksum recomputed, as a writer would."""
    data = json.loads(text)
    edit(data)
    body = {key: value for key, value in data.items() if key != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    data["checksum"] = hashlib.sha256(canonical.encode()).hexdigest()
    return json.dumps(data)


def test_memory_clocks_round_trip_and_answer_per_rank(tmp_path: Path) -> None:
    plan = _plan((2619, 1593))
    loaded = load_plan(save_plan(plan, tmp_path / "plan.json"))
    assert loaded == plan
    assert loaded.memory_clocks_mhz == (2619, 1593)
    assert [loaded.memory_clock_for(stage) for stage in range(2)] == [2619, 1593]


def test_a_plan_at_stock_memory_clocks_writes_no_field() -> None:
    text = plan_text(_plan())
    assert "memory_clocks_mhz" not in text
    assert read_plan(text).memory_clock_for(1) is None


def test_a_memory_clock_the_gpu_does_not_list_is_refused_with_the_supported_ones() -> None:
    text = plan_text(_plan((2619, 1500)))
    with pytest.raises(
        PlanError,
        match=r"rank 1's memory clock 1500 MHz is not one of h100-sxm's supported "
        r"memory clocks \(2619, 1593 MHz\)",
    ):
        read_plan(text)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([2619], "gives 1 memory clocks for 2 pipeline ranks"),
        ([2619, "1593"], r"memory_clocks_mhz\[1\]: Input should be a valid integer"),
        ([2619, True], r"memory_clocks_mhz\[1\]: Input should be a valid integer"),
        ([2619, 0], r"memory_clocks_mhz\[1\]: Input should be greater than 0"),
        ("2619", "memory_clocks_mhz: Input should be a valid array"),
    ],
)
def test_malformed_memory_clocks_are_refused(value: object, problem: str) -> None:
    text = _resigned(plan_text(_plan((2619, 1593))), lambda data: data.update(memory_clocks_mhz=value))
    with pytest.raises(PlanError, match=problem):
        read_plan(text)


def test_memory_clocks_of_a_gpu_without_a_spec_are_refused() -> None:
    plan = dataclasses.replace(_plan((1593, 1593)), gpu_name="mystery-gpu")
    with pytest.raises(PlanError, match="'mystery-gpu', which has no GPU spec to check them against"):
        read_plan(plan_text(plan))
