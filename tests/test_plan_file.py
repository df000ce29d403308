"""Plan v3: the checked JSON contract between optimisers and the runtime, typed phases and collectives."""

import dataclasses
import hashlib
import json

import pytest

from megatron_energy.pipeline.collective_names import END, CollectiveName, layer_start
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.pipeline.phase_labels import OutsideHook, PhaseLabel
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
from megatron_energy.plan_file import load_plan, plan_text, save_plan
from megatron_energy.runtime.planning_round.planning import plan_summary

F0 = Instruction(0, 0, 0, "forward")
B0 = Instruction(0, 0, 0, "backward")
F1 = Instruction(1, 0, 0, "forward")
B1 = Instruction(1, 0, 0, "backward")
REDUCE = CollectiveName("dp", "reduce_scatter", bucket=0)
MEMORY = PhaseLabel("p", 1, "memory", "modelled", 1.2345678e-3, 0.01)
TAIL = PhaseLabel("tail-restore", 2, "restore", "measured", 0.07, 0.0, OutsideHook("optimizer", at_end=True))


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
                    ClockAction(Boundary(B0, MEMORY), 1005),
                    CollectiveAction(Boundary(B0, layer_start(1)), REDUCE, max_ctas=8),
                ),
                energy_j=energies[0],
                busy_s=0.5,
            ),
            RankPlan(
                (
                    ClockAction(Boundary(F1), clocks[2]),
                    ClockAction(Boundary(B1), clocks[3]),
                    ClockAction(Boundary(B1, TAIL), clocks[2]),
                    CollectiveAction(Boundary(B1, END), CollectiveName("pp", "send_recv"), max_ctas=None),
                ),
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
    path = save_plan(plan, tmp_path / "deep" / "plan.json")
    loaded = load_plan(path, expected_fingerprint=plan.fingerprint)
    assert loaded == plan
    assert plan_text(loaded) == path.read_text()
    assert loaded.schema_version == SCHEMA_VERSION == 3
    assert loaded.created_by.startswith("megatron_energy ")
    assert loaded.clock_for(0, B0) == 1200
    assert loaded.clock_for(1, F1, point=1) == 1005
    assert loaded.target_point.energy_j == pytest.approx(900.5)
    assert loaded.target_point.clock_table(0) == {
        F0: 1410,
        B0: 1200,
    }  # phase actions are not instruction clocks
    phase, collective = loaded.target_point.ranks[0].actions[2:]
    assert phase == ClockAction(Boundary(B0, MEMORY), 1005)
    assert phase.at.phase.at_s == 1.2345678e-3  # the planner's float, not a rounded string of it
    assert collective == CollectiveAction(Boundary(B0, layer_start(1)), REDUCE, 8)
    assert loaded.target_point.ranks[1].actions[2].at.phase.hook == OutsideHook("optimizer", at_end=True)
    assert loaded.num_stages == 2


def test_a_measured_tail_round_trips_and_a_wrong_one_is_refused(tmp_path):
    plan = dataclasses.replace(_plan(), measured_tail=MeasuredTail(0.05, (20.0, 30.0)))
    path = save_plan(plan, tmp_path / "plan.json")
    assert json.loads(path.read_text())["measured_tail"] == {"time_s": 0.05, "stage_energy_j": [20.0, 30.0]}
    assert load_plan(path) == plan
    _rewrite(path, lambda data: data.update(measured_tail={"time_s": 0.05, "stage_energy_j": [1.0]}),
             keep_checksum=False)  # fmt: skip
    with pytest.raises(PlanError, match="1 stage energies for 2 ranks"):
        load_plan(path)


def test_file_is_plain_json_keyed_by_the_shared_instruction_identity(tmp_path):
    path = save_plan(_plan(), tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert data["schema_version"] == 3 and len(data["checksum"]) == 64
    action = data["points"][0]["ranks"][0]["actions"][1]
    assert action == {
        "type": "clock",
        "at": {"stage": 0, "chunk": 0, "microbatch": 0, "kind": "backward"},
        "clock_mhz": 1200,
    }
    assert data["optimisers"] == ["perseus"] and data["provenance"] == "modelled"


def test_phases_and_collectives_are_json_objects_not_strings(tmp_path):
    data = json.loads(save_plan(_plan(), tmp_path / "plan.json").read_text())
    phase, collective = data["points"][0]["ranks"][0]["actions"][2:]
    assert phase["at"]["phase"] == {
        "scope": "p",
        "index": 1,
        "kind": "memory",
        "provenance": "modelled",
        "at_s": 1.2345678e-3,
        "lead_s": 0.01,
    }
    assert collective["at"]["phase"] == {"where": "layer", "layer": 1}
    assert collective["collective"] == {"group": "dp", "op": "reduce_scatter", "bucket": 0}
    tail, send = data["points"][0]["ranks"][1]["actions"][2:]
    assert tail["at"]["phase"]["hook"] == {"phase": "optimizer", "at_end": True}
    assert send["at"]["phase"] == {"where": "end"} and send["max_ctas"] is None


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


def test_a_version_2_file_is_refused_and_names_the_version_to_plan_again_with(tmp_path):
    path = save_plan(_plan(), tmp_path / "plan.json")
    _rewrite(path, lambda data: data.update(schema_version=2), keep_checksum=False)
    with pytest.raises(PlanError, match=r"schema version 2; .* reads version 3: rerun planning"):
        load_plan(path)


def test_rejects_a_file_that_is_not_json(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("[('forward', 1410)]  # a Perseus plan is Python, and is never evaluated here")
    with pytest.raises(PlanError, match=r"not valid JSON.*delete it or rerun planning"):
        load_plan(path)


def test_rejects_json_that_is_not_an_object(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(PlanError, match="does not hold a JSON object"):
        load_plan(path)


def test_rejects_a_missing_file(tmp_path):
    with pytest.raises(PlanError, match="cannot read plan file"):
        load_plan(tmp_path / "absent.json")


def test_rejects_another_schema_version(tmp_path):
    path = save_plan(_plan(), tmp_path / "plan.json")
    _rewrite(path, lambda data: data.update(schema_version=SCHEMA_VERSION + 1), keep_checksum=False)
    with pytest.raises(PlanError, match=rf"schema version {SCHEMA_VERSION + 1}.*rerun planning"):
        load_plan(path)


def test_rejects_a_tampered_file(tmp_path):
    path = save_plan(_plan(), tmp_path / "plan.json")
    _rewrite(path, lambda data: data["points"][0]["ranks"][0]["actions"][0].update(clock_mhz=210))
    with pytest.raises(PlanError, match=r"modified after it was written \(checksum mismatch\)"):
        load_plan(path)


def _refused(tmp_path, edit) -> str:
    """The refusal of the test plan's file after ``edit`` (re-signed as a writer would)."""
    path = save_plan(_plan(), tmp_path / "plan.json")
    _rewrite(path, edit, keep_checksum=False)
    with pytest.raises(PlanError, match=r"malformed .*: delete it or rerun planning") as refusal:
        load_plan(path)
    return str(refusal.value)


def _action(data, rank=0, index=2):
    return data["points"][0]["ranks"][rank]["actions"][index]


def test_rejects_a_malformed_plan_even_with_a_valid_checksum(tmp_path):
    kind = _refused(tmp_path, lambda data: _action(data, 1, 0)["at"].update(kind="recompute"))
    assert "points[0].ranks[1].actions[0].clock.at.kind: Input should be 'forward' or 'backward'" in kind
    assert "baseline: Field required" in _refused(tmp_path, lambda data: data.pop("baseline"))
    short = _refused(tmp_path, lambda data: data.update(frontier=[[1.0, 2.0]]))
    assert "frontier[0]" in short


def test_a_malformed_phase_object_is_refused_naming_the_field(tmp_path):
    early = _refused(tmp_path, lambda data: _action(data)["at"]["phase"].update(at_s=-1.0))
    assert (
        "points[0].ranks[0].actions[2].clock.at.phase.label.at_s: Input should be greater than or equal to 0"
        in early
    )
    scope = _refused(tmp_path, lambda data: _action(data)["at"]["phase"].update(scope="q"))
    assert (
        "actions[2].clock.at.phase.label.scope: Input should be 'p', 'p-restore', 'tail' or 'tail-restore'"
        in scope
    )
    missing = _refused(tmp_path, lambda data: _action(data)["at"]["phase"].pop("lead_s"))
    assert "phase.label.lead_s: Field required" in missing
    text = _refused(
        tmp_path, lambda data: _action(data)["at"].update(phase="p1:memory:modelled:at=1ms:lead=0ms")
    )
    assert "actions[2].clock.at.phase: a phase is a phase label" in text
    layer = _refused(tmp_path, lambda data: _action(data, 0, 3)["at"]["phase"].update(layer=None))
    assert "actions[3].collective.at.phase.point: Value error, a 'layer' launch point names a layer" in layer


def test_a_malformed_collective_is_refused_naming_the_field(tmp_path):
    name = _refused(tmp_path, lambda data: _action(data, 0, 3)["collective"].update(op="broadcast"))
    assert "actions[3].collective.collective.op: Input should be 'reduce_scatter'" in name
    bucketless = _refused(tmp_path, lambda data: _action(data, 0, 3)["collective"].pop("bucket"))
    assert "dp collectives name a bucket" in bucketless
    budget = _refused(tmp_path, lambda data: _action(data, 0, 3).update(max_ctas=0))
    assert "actions[3].collective.max_ctas: Input should be greater than or equal to 1" in budget


def test_types_are_strict_and_unknown_keys_refused(tmp_path):
    flag = _refused(tmp_path, lambda data: _action(data, 0, 0).update(clock_mhz=True))
    assert "actions[0].clock.clock_mhz: Input should be a valid integer" in flag
    text = _refused(tmp_path, lambda data: data["baseline"].update(energy_j="1000"))
    assert "baseline.energy_j: Input should be a valid number" in text
    extra = _refused(tmp_path, lambda data: _action(data)["at"]["phase"].update(label="p1"))
    assert "phase.label.label: Unexpected keyword argument" in extra
    assert "notes: Extra inputs are not permitted" not in _refused(
        tmp_path, lambda data: data.update(notes=["x"], target_index=5)
    )
    assert "target_index 5 is not one of the 2 points" in _refused(
        tmp_path, lambda data: data.update(target_index=5)
    )


def test_rejects_an_action_listed_under_the_wrong_rank(tmp_path):
    path = save_plan(_plan(), tmp_path / "plan.json")
    _rewrite(
        path,
        lambda data: data["points"][0]["ranks"][1]["actions"][0]["at"].update(stage=0),
        keep_checksum=False,
    )
    with pytest.raises(PlanError, match="listed under rank 1 but names stage 0"):
        load_plan(path)


def test_rejects_non_finite_numbers(tmp_path):
    path = save_plan(_plan(), tmp_path / "plan.json")
    path.write_text(path.read_text().replace('"energy_j": 1000.0', '"energy_j": NaN'))
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan(path)


def test_rejects_a_plan_for_another_job_naming_both_fingerprints(tmp_path):
    plan = _plan("job-a")
    path = save_plan(plan, tmp_path / "plan.json")
    other = fingerprint(job="job-b")[:16]
    with pytest.raises(PlanError, match=rf"another job.*{plan.fingerprint}.*{other}"):
        load_plan(path, expected_fingerprint=other)


def test_the_log_summary_names_the_frontier_only_when_one_was_swept():
    swept = _plan()
    text = plan_text(swept)
    assert "2 frontier points" in plan_summary(swept, text) and "relaxed" in plan_summary(swept, text)
    alone = dataclasses.replace(swept, frontier=())  # kernel or kareus alone: stock instruction clocks
    line = plan_summary(alone, plan_text(alone))
    assert "no frontier swept" in line and "relaxed" not in line
