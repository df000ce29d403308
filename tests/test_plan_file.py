import hashlib
import json

import pytest

from megatron_energy.plan import (
    SCHEMA_VERSION,
    Plan,
    PlanError,
    PlannedInstruction,
    PlanPrediction,
    fingerprint,
)


def _plan(job: str = "job-a") -> Plan:
    ranks = (
        (PlannedInstruction("forward", 0, 0, 1410), PlannedInstruction("backward", 0, 0, 1200)),
        (PlannedInstruction("forward", 0, 0, 1005), PlannedInstruction("backward", 0, 0, 1410)),
    )
    prediction = PlanPrediction(
        iteration_time_s=1.25,
        energy_j=900.5,
        stage_energy_j=(400.25, 500.25),
        baseline_time_s=1.25,
        baseline_energy_j=1000.0,
        deadline_s=1.25,
        lower_bound_j=899.0,
    )
    return Plan(
        fingerprint=fingerprint(job=job, gpu="a100-sxm-80gb"),
        gpu_name="a100-sxm-80gb",
        provenance="modelled",
        target="iso-time",
        ranks=ranks,
        prediction=prediction,
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
    assert loaded.schema_version == SCHEMA_VERSION
    assert loaded.created_by.startswith("megatron_energy ")
    assert loaded.clock_for(0, "backward", 0, 0) == 1200
    assert loaded.clock_for(1, "forward", 0) == 1005
    assert [item.clock_mhz for item in loaded.rank_clocks(1)] == [1005, 1410]
    assert loaded.num_stages == 2


def test_file_is_plain_json_with_checksum(tmp_path):
    path = _plan().save(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert len(data["checksum"]) == 64
    assert data["ranks"][0][1] == {"kind": "backward", "microbatch": 0, "chunk": 0, "clock_mhz": 1200}
    assert data["prediction"]["stage_energy_j"] == [400.25, 500.25]


def test_fingerprint_is_canonical():
    a = fingerprint(model={"layers": 24, "hidden": 2048}, parallelism={"pp": 4}, gpu="h100-sxm")
    b = fingerprint(gpu="h100-sxm", parallelism={"pp": 4}, model={"hidden": 2048, "layers": 24})
    assert a == b and len(a) == 64
    assert a != fingerprint(model={"layers": 24, "hidden": 2048}, parallelism={"pp": 8}, gpu="h100-sxm")


def test_unknown_instruction_or_rank_is_refused():
    plan = _plan()
    with pytest.raises(PlanError, match="no forward of microbatch 7"):
        plan.clock_for(0, "forward", 7, 0)
    with pytest.raises(PlanError, match="not rank 5"):
        plan.rank_clocks(5)


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
    with pytest.raises(PlanError, match=rf"schema version {SCHEMA_VERSION + 1}.*delete it or rerun planning"):
        Plan.load(path)


def test_rejects_a_tampered_file(tmp_path):
    path = _plan().save(tmp_path / "plan.json")
    _rewrite(path, lambda data: data["ranks"][0][0].update(clock_mhz=210))
    with pytest.raises(PlanError, match=r"modified after it was written \(checksum mismatch\)"):
        Plan.load(path)


def test_rejects_a_malformed_plan_even_with_a_valid_checksum(tmp_path):
    path = _plan().save(tmp_path / "plan.json")
    _rewrite(path, lambda data: data["ranks"][1][0].update(kind="recompute"), keep_checksum=False)
    with pytest.raises(PlanError, match=r"malformed.*kind must be one of"):
        Plan.load(path)
    _rewrite(path, lambda data: data.pop("prediction"), keep_checksum=False)
    with pytest.raises(PlanError, match=r"malformed.*prediction"):
        Plan.load(path)


def test_rejects_non_finite_numbers(tmp_path):
    path = _plan().save(tmp_path / "plan.json")
    path.write_text(path.read_text().replace('"energy_j": 900.5', '"energy_j": NaN'))
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.load(path)


def test_rejects_a_plan_for_another_job(tmp_path):
    path = _plan("job-a").save(tmp_path / "plan.json")
    other = fingerprint(job="job-b", gpu="a100-sxm-80gb")
    with pytest.raises(PlanError, match=r"another job or GPU.*delete it or rerun planning"):
        Plan.load(path, expected_fingerprint=other)
