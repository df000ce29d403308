"""Issue 43, item 2: one owner of the energy directory (``energy_dir``): its names and the typed job facts.

The facts' parts are key for key what the previous version wrote, so a cache it keyed keeps its fingerprint:
``OLD_PARTS`` is a job record's ``parts`` as that version wrote them (from ``JobContext.fingerprint_parts``
and ``planning_parts``; only the GPU spec's figures are cut to two, the record holds them as an opaque
mapping) and ``OLD_FINGERPRINT`` the folder name it gave them.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from job_facts import job_facts, read_back

from megatron_energy import energy_dir
from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.energy_dir import JobArtefacts, JobFacts, JobRecord
from megatron_energy.pipeline.chunk_layers import ChunkLayers
from megatron_energy.pipeline.collective_levers import RuntimeLevers
from megatron_energy.pipeline.job_collectives import CollectiveSetup
from megatron_energy.pipeline.moe import MoeShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import TransformerShape
from megatron_energy.runtime.context import JobContext, planning_inputs
from megatron_energy.runtime.planning_round.cache import JobCache
from megatron_energy.target import parse_target

PACKAGE = Path(__file__).resolve().parents[1] / "megatron_energy"
GPU_SPEC = {"name": "h100-sxm", "switch_latency_s": 0.01}
OLD_FINGERPRINT = "39b23ee610f09d7e"
OLD_PARTS: dict[str, Any] = {
    "model": {
        "num_layers": 24,
        "hidden_size": 2048,
        "ffn_hidden_size": 8192,
        "num_attention_heads": 16,
        "seq_length": 2048,
        "micro_batch_size": 1,
        "vocab_size": 50257,
        "tensor_parallel": 2,
        "num_query_groups": None,
        "gated_mlp": False,
        "moe": {
            "num_experts": 8,
            "topk": 2,
            "expert_parallel": 2,
            "ffn_hidden_size": None,
            "all_to_all_bandwidth_gbps": None,
            "overlapped_all_to_all": False,
        },
        "params_dtype": "fp16",
        "fp8": False,
    },
    "pipeline_size": 4,
    "num_chunks": 2,
    "tensor_parallel_size": 2,
    "data_parallel_size": 2,
    "num_microbatches": 8,
    "microbatch_group_size": None,
    "gpu": "h100-sxm",
    "collectives": {
        "data_parallel": 2,
        "sequence_parallel": True,
        "distributed_optimizer": True,
        "bucket_elements": 40000000,
        "dp_link": "nic",
        "pp_link": "nvlink",
        "dp_bandwidth_gbps": 50.0,
        "pp_bandwidth_gbps": None,
        "levers": {
            "overlap_grad_reduce": True,
            "overlap_param_gather": False,
            "tp_comm_overlap": False,
            "fixed_ctas": [["pp", 4]],
        },
        "buckets": None,
    },
    "layers": [[2, 3], [3, 3], [3, 3], [3, 4]],
    "full_iteration_graph": True,
    "grid_mhz": [1980, 1500, 1200],
    "planning": {
        "mode": "all",
        "target": "slowdown:0.05",
        "switch_latency_s": 0.01,
        "phase_switching": "auto",
        "gpu_spec": GPU_SPEC,
        "memory_clock": "off",
    },
    "clock_control": True,
}


def _session_facts() -> JobFacts:
    """The facts the session keys the job of ``OLD_PARTS`` by (``runtime.assembly``)."""
    shape = dataclasses.replace(
        TransformerShape.from_name("gpt3-1.3b"),
        moe=MoeShape(num_experts=8, topk=2, expert_parallel=2),
        tensor_parallel=2,
        params_dtype="fp16",
    )
    setup = CollectiveSetup(
        data_parallel=2,
        sequence_parallel=True,
        bucket_elements=40_000_000,
        dp_link="nic",
        dp_bandwidth_gbps=50.0,
        levers=RuntimeLevers(overlap_grad_reduce=True, fixed_ctas=(("pp", 4),)),
    )
    context = JobContext(
        0,
        pipeline_orders(4, 8, 2),
        0,
        2,
        tensor_parallel_size=2,
        shape=shape,
        layers=ChunkLayers(((2, 3), (3, 3), (3, 3), (3, 4))),
        collectives=setup,
        full_iteration_graph=True,
    )
    config = EnergyConfig(mode="all", target=parse_target("slowdown:0.05"), memory_clock="off")
    planning = dataclasses.replace(planning_inputs(config, load_gpu_spec("h100-sxm")), gpu_spec=GPU_SPEC)
    return dataclasses.replace(
        context.job_facts("h100-sxm"), grid_mhz=(1980, 1500, 1200), planning=planning, clock_control=True
    )


def test_the_session_keys_a_job_as_the_previous_version_did() -> None:
    facts = _session_facts()
    assert read_back(facts) == OLD_PARTS
    assert facts.fingerprint == OLD_FINGERPRINT


def test_a_record_of_the_previous_version_reads_back_into_typed_facts_with_its_fingerprint(
    tmp_path: Path,
) -> None:
    old = json.dumps({"fingerprint": OLD_FINGERPRINT, "parts": OLD_PARTS}, indent=2)
    record = JobRecord.from_json(old)
    assert record.fingerprint == record.facts.fingerprint == OLD_FINGERPRINT
    assert record.facts.model is not None and record.facts.model.moe == MoeShape(8, 2, 2)
    assert record.facts.layers == ChunkLayers(((2, 3), (3, 3), (3, 3), (3, 4)))
    assert record.facts.planning is not None and record.facts.planning.memory_clock == "off"
    assert JobRecord.of(record.facts).to_json() == old, "written back byte for byte"
    JobCache(tmp_path, record.facts).store({"plan.json": "{}", "baseline.json": "{}", "profile.csv": "s\n"})
    assert (tmp_path / OLD_FINGERPRINT / "job.json").read_text() == old


def test_a_record_with_an_unknown_or_missing_fact_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['colour'\]"):
        JobFacts.from_parts(OLD_PARTS | {"colour": "blue"})
    with pytest.raises(ValueError, match=r"missing key\(s\) \['gpu'\]"):
        JobFacts.from_parts({key: value for key, value in OLD_PARTS.items() if key != "gpu"})


def test_the_cached_files_are_mapped_to_their_roles_and_back() -> None:
    artefacts = JobArtefacts(profile_csv="p\n", baseline_json="{}", plan_json='{"a": 1}', measured_json="{}")
    files = artefacts.files()
    assert files == {
        "plan.json": '{"a": 1}',
        "baseline.json": "{}",
        "profile.csv": "p\n",
        "measured.json": "{}",
    }
    assert JobArtefacts.of_files({name: text.encode() for name, text in files.items()}) == artefacts
    with pytest.raises(ValueError, match=r"holds no baseline\.json"):
        JobArtefacts.of_files({"profile.csv": b"p\n"})


def test_the_report_finds_the_latest_job_through_the_owner(tmp_path: Path) -> None:
    JobCache(tmp_path, job_facts()).store({"plan.json": "{}", "baseline.json": "{}", "profile.csv": "s\n"})
    assert energy_dir.latest_fingerprint(tmp_path) == job_facts().fingerprint
    assert energy_dir.JobFiles(tmp_path / job_facts().fingerprint).record.is_file()


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module but its docstrings (module, class, function and attribute ones)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_only_the_owner_names_the_files_of_the_energy_directory() -> None:
    names = (
        energy_dir.LAST_JOB,
        energy_dir.JOB_RECORD,
        energy_dir.PROFILE,
        energy_dir.BASELINE,
        energy_dir.PLAN,
        energy_dir.FRONTIER,
        energy_dir.MEASURED,
        energy_dir.MANIFEST,
        energy_dir.QUARANTINE_PREFIX,
        energy_dir.FRONTIER_PLOT,
        energy_dir.TIMELINE,
        energy_dir.overhead_pairs_path(Path(), 0).name.removesuffix("0.json"),
    )
    strays = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {text!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "energy_dir.py"
        for line, text in _string_literals(path)
        if any(name in text for name in names)
    ]
    assert not strays, "name the energy directory's files through megatron_energy.energy_dir:\n" + "\n".join(
        strays
    )
