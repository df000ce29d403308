"""Plan v2: the checked JSON contract between optimisers and the runtime (and v1 migration)."""

import dataclasses
import hashlib
import json

import pytest

from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.plan import (
    SCHEMA_VERSION,
    Baseline,
    Boundary,
    ClockAction,
    CollectiveAction,
    FrontierSample,
    MeasuredTail,
    Plan,
    PlanError,
    PlanPoint,
    RankPlan,
    fingerprint,
)
from megatron_energy.runtime.planning_round.planning import plan_summary

F0 = Instruction(0, 0, 0, "forward")
B0 = Instruction(0, 0, 0, "backward")
F1 = Instruction(1, 0, 0, "forward")
B1 = Instruction(1, 0, 0, "backward")


def _point(
    label: str, time_s: float, clocks: tuple[int, int, int, int], energies=(400.25, 500.25)
) -> PlanPoint:
    return PlanPoint(
        label=label,
        iteration_time_s=time_s,
        deadline_s=time_s,
        lower_bound_j=sum(energies) - 1.0,
        ranks=(
            RankPlan(
                (
                    ClockAction(Boundary(F0), clocks[0]),
                    ClockAction(Boundary(B0), clocks[1]),
                    CollectiveAction(Boundary(B0, "grad-sync"), "dp-reduce-scatter", max_ctas=8),
                ),
                energy_j=energies[0],
                busy_s=0.5,
            ),
            RankPlan(
                (ClockAction(Boundary(F1), clocks[2]), ClockAction(Boundary(B1), clocks[3])),
                energy_j=energies[1],
                busy_s=0.6,
            ),
        ),
    )


def _plan(job: str = "job-a") -> Plan:
    return Plan(
        fingerprint=fingerprint(job=job)[:16],
        gpu_name="a100-sxm-80gb",
        provenance="modelled",
        target="iso-time",
        optimisers=("perseus",),
        switch_latency_s=0.01,
        baseline=Baseline(1.25, 1000.0, (450.0, 550.0)),
        points=(
            _point("iso-time", 1.25, (1410, 1200, 1005, 1410)),
            _point("time:1.400000", 1.4, (1005, 1005, 1005, 1200), energies=(350.0, 450.0)),
        ),
        target_index=0,
        frontier=(FrontierSample(1.25, 899.0, 898.0, 1.25), FrontierSample(1.4, 790.0, 789.5, 1.4)),
    )


def _rewrite(path, edit, keep_checksum=True):
    """Edit the stored JSON; with keep_checksum=False the checksum is recomputed as a writer would."""
    data = json.loads(path.read_text())
    edit(data)
    if not keep_checksum:
        body = {key: value for key, value in data.items() if key != "checksum"}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        data["checksum"] = hashlib.sha256(canonical.encode()).hexdigest()
    path.write_text(json.dumps(data))


def test_round_trip_keeps_every_field_and_answers_lookups(tmp_path):
    plan = _plan()
    path = plan.save(tmp_path / "deep" / "plan.json")
    loaded = Plan.load(path, expected_fingerprint=plan.fingerprint)
    assert loaded == plan
    assert loaded.to_json_text() == path.read_text()
    assert loaded.schema_version == SCHEMA_VERSION == 2
    assert loaded.created_by.startswith("megatron_energy ")
    assert loaded.clock_for(0, B0) == 1200
    assert loaded.clock_for(1, F1, point=1) == 1005
    assert loaded.target_point.energy_j == pytest.approx(900.5)
    assert loaded.target_point.clock_table(0) == {
        F0: 1410,
        B0: 1200,
    }  # phase actions are not instruction clocks
    collective = loaded.target_point.ranks[0].actions[2]
    assert collective == CollectiveAction(Boundary(B0, "grad-sync"), "dp-reduce-scatter", 8)
    assert loaded.num_stages == 2


def test_a_measured_tail_round_trips_and_a_plan_written_without_one_still_loads(tmp_path):
    plan = dataclasses.replace(_plan(), measured_tail=MeasuredTail(0.05, (20.0, 30.0)))
    path = plan.save(tmp_path / "plan.json")
    assert json.loads(path.read_text())["measured_tail"] == {"time_s": 0.05, "stage_energy_j": [20.0, 30.0]}
    assert Plan.load(path) == plan
    # a version-2 file from before the tail existed: no key at all, checksum over what it held
    _rewrite(path, lambda data: data.pop("measured_tail"), keep_checksum=False)
    assert Plan.load(path).measured_tail is None
    _rewrite(path, lambda data: data.update(measured_tail={"time_s": 0.05, "stage_energy_j": [1.0]}),
             keep_checksum=False)  # fmt: skip
    with pytest.raises(PlanError, match="1 stage energies for 2 ranks"):
        Plan.load(path)


def test_file_is_plain_json_keyed_by_the_shared_instruction_identity(tmp_path):
    path = _plan().save(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert data["schema_version"] == 2 and len(data["checksum"]) == 64
    action = data["points"][0]["ranks"][0]["actions"][1]
    assert action == {
        "type": "clock",
        "at": {"stage": 0, "chunk": 0, "microbatch": 0, "kind": "backward"},
        "clock_mhz": 1200,
    }
    assert data["points"][0]["ranks"][0]["actions"][2]["at"]["phase"] == "grad-sync"
    assert data["optimisers"] == ["perseus"] and data["provenance"] == "modelled"


def test_a_straggler_pace_picks_the_least_energy_point_within_it():
    plan = _plan()
    assert plan.index_for_time(1.0) == 0  # faster than the target: keep the target
    assert plan.index_for_time(1.3) == 0
    assert plan.index_for_time(1.5) == 1


def test_fingerprint_is_canonical():
    a = fingerprint(model={"layers": 24, "hidden": 2048}, parallelism={"pp": 4}, gpu="h100-sxm")
    b = fingerprint(gpu="h100-sxm", parallelism={"pp": 4}, model={"hidden": 2048, "layers": 24})
    assert a == b and len(a) == 64
    assert a != fingerprint(model={"layers": 24, "hidden": 2048}, parallelism={"pp": 8}, gpu="h100-sxm")


def test_unknown_instruction_or_rank_is_refused():
    plan = _plan()
    with pytest.raises(PlanError, match=r"no clock for .* another schedule"):
        plan.clock_for(0, Instruction(0, 0, 7, "forward"))
    with pytest.raises(PlanError, match="not rank 5"):
        plan.clock_for(5, F0)


def test_a_version_1_file_is_migrated(tmp_path):
    body = {
        "schema_version": 1,
        "fingerprint": "f" * 16,
        "gpu_name": "h100-sxm",
        "provenance": "measured",
        "target": "iso-time",
        "created_by": "megatron_energy 0.1.0",
        "ranks": [
            [{"kind": "forward", "microbatch": 0, "chunk": 0, "clock_mhz": 1410}],
            [{"kind": "backward", "microbatch": 0, "chunk": 0, "clock_mhz": 1200}],
        ],
        "prediction": {
            "iteration_time_s": 1.0,
            "energy_j": 10.0,
            "stage_energy_j": [4.0, 6.0],
            "baseline_time_s": 1.0,
            "baseline_energy_j": 12.0,
            "deadline_s": 1.0,
            "lower_bound_j": 9.5,
        },
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    body["checksum"] = hashlib.sha256(canonical.encode()).hexdigest()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(body))
    plan = Plan.load(path)
    assert plan.schema_version == 2 and plan.optimisers == ("perseus",)
    assert plan.clock_for(1, Instruction(1, 0, 0, "backward")) == 1200
    assert plan.target_point.energy_j == 10.0 and plan.baseline.energy_j == 12.0
    resaved = plan.save(tmp_path / "v2.json")
    assert Plan.load(resaved) == plan


def test_rejects_a_file_that_is_not_json(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("[('forward', 1410)]  # a Perseus plan is Python, and is never evaluated here")
    with pytest.raises(PlanError, match=r"not valid JSON.*delete it or rerun planning"):
        Plan.load(path)


def test_rejects_json_that_is_not_an_object(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(PlanError, match="does not hold a JSON object"):
        Plan.load(path)


def test_rejects_a_missing_file(tmp_path):
    with pytest.raises(PlanError, match="cannot read plan file"):
        Plan.load(tmp_path / "absent.json")


def test_rejects_another_schema_version(tmp_path):
    path = _plan().save(tmp_path / "plan.json")
    _rewrite(path, lambda data: data.update(schema_version=SCHEMA_VERSION + 1), keep_checksum=False)
    with pytest.raises(PlanError, match=rf"schema version {SCHEMA_VERSION + 1}.*rerun planning"):
        Plan.load(path)


def test_rejects_a_tampered_file(tmp_path):
    path = _plan().save(tmp_path / "plan.json")
    _rewrite(path, lambda data: data["points"][0]["ranks"][0]["actions"][0].update(clock_mhz=210))
    with pytest.raises(PlanError, match=r"modified after it was written \(checksum mismatch\)"):
        Plan.load(path)


def test_rejects_a_malformed_plan_even_with_a_valid_checksum(tmp_path):
    path = _plan().save(tmp_path / "plan.json")
    _rewrite(
        path,
        lambda data: data["points"][0]["ranks"][1]["actions"][0]["at"].update(kind="recompute"),
        keep_checksum=False,
    )
    with pytest.raises(PlanError, match=r"malformed.*kind must be one of"):
        Plan.load(path)
    path = _plan().save(tmp_path / "plan.json")
    _rewrite(path, lambda data: data.pop("baseline"), keep_checksum=False)
    with pytest.raises(PlanError, match=r"malformed.*baseline"):
        Plan.load(path)
    _rewrite(path, lambda data: data.update(baseline={"iteration_time_s": 1.0, "energy_j": 2.0,
                                                      "stage_energy_j": []}, frontier=[[1.0, 2.0]]),
             keep_checksum=False)  # fmt: skip
    with pytest.raises(PlanError, match=r"malformed.*frontier sample"):
        Plan.load(path)


def test_rejects_an_action_listed_under_the_wrong_rank(tmp_path):
    path = _plan().save(tmp_path / "plan.json")
    _rewrite(
        path,
        lambda data: data["points"][0]["ranks"][1]["actions"][0]["at"].update(stage=0),
        keep_checksum=False,
    )
    with pytest.raises(PlanError, match="listed under rank 1 but names stage 0"):
        Plan.load(path)


def test_rejects_non_finite_numbers(tmp_path):
    path = _plan().save(tmp_path / "plan.json")
    path.write_text(path.read_text().replace('"energy_j": 1000.0', '"energy_j": NaN'))
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.load(path)


def test_rejects_a_plan_for_another_job_naming_both_fingerprints(tmp_path):
    plan = _plan("job-a")
    path = plan.save(tmp_path / "plan.json")
    other = fingerprint(job="job-b")[:16]
    with pytest.raises(PlanError, match=rf"another job.*{plan.fingerprint}.*{other}"):
        Plan.load(path, expected_fingerprint=other)


def test_the_log_summary_names_the_frontier_only_when_one_was_swept():
    swept = _plan()
    text = swept.to_json_text()
    assert "2 frontier points" in plan_summary(swept, text) and "relaxed" in plan_summary(swept, text)
    alone = dataclasses.replace(swept, frontier=())  # kernel or kareus alone: stock instruction clocks
    line = plan_summary(alone, alone.to_json_text())
    assert "no frontier swept" in line and "relaxed" not in line
