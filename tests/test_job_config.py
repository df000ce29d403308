from pathlib import Path

import pytest
import yaml

from megatron_energy.job import JobConfig, JobConfigError

EXAMPLES = Path(__file__).resolve().parents[1] / "configs" / "examples"

BASE = {
    "name": "small",
    "gpu": "h200",
    "model": "gpt3-1.3b",
    "pipeline_stages": 4,
    "tensor_parallel": 1,
    "data_parallel": 2,
    "micro_batch_size": 2,
    "num_microbatches": 8,
}


def _load(tmp_path, **changes):
    data = {key: value for key, value in (BASE | changes).items() if value is not None}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return JobConfig.load(path)


def test_examples_load_as_plausible_jobs():
    jobs = {path.stem: JobConfig.load(path) for path in sorted(EXAMPLES.glob("*.yaml"))}
    assert set(jobs) == {
        "gpt3-xl-pp4-h100",
        "llama-7b-pp4-tp2-h200",
        "llama-70b-pp8-tp8-a100",
        "mixtral-8x7b-pp4-tp2-ep4-h200",
    }
    gpt = jobs["gpt3-xl-pp4-h100"]
    assert (gpt.gpu, gpt.pipeline_stages, gpt.num_microbatches, gpt.num_gpus) == ("h100-sxm", 4, 16, 32)
    assert gpt.global_batch_size * gpt.shape.seq_length == 512 * 2048
    llama7 = jobs["llama-7b-pp4-tp2-h200"]
    assert (llama7.gpu, llama7.tensor_parallel, llama7.virtual_stages, llama7.num_microbatches) == (
        "h200",
        2,
        2,
        64,
    )
    llama70 = jobs["llama-70b-pp8-tp8-a100"]
    assert (llama70.gpu, llama70.pipeline_stages, llama70.tensor_parallel) == ("a100-sxm-80gb", 8, 8)
    assert llama70.data_parallel > 1 and llama70.num_gpus == 256
    mixtral = jobs.pop("mixtral-8x7b-pp4-tp2-ep4-h200")  # its shape is a mapping: no known model name
    assert mixtral.shape.moe is not None and mixtral.name == "mixtral-8x7b-pp4-tp2-ep4-h200"
    assert (mixtral.shape.moe.num_experts, mixtral.shape.moe.topk, mixtral.shape.moe.expert_parallel) == (
        8,
        2,
        4,
    )
    assert (mixtral.pipeline_stages, mixtral.tensor_parallel, mixtral.data_parallel) == (4, 2, 4)
    for stem, job in jobs.items():
        assert job.name == stem and job.model_name is not None and job.shape.moe is None


def test_global_batch_size_and_explicit_model_shape(tmp_path):
    shape = {
        "num_layers": 8,
        "hidden_size": 512,
        "ffn_hidden_size": 2048,
        "num_attention_heads": 8,
        "seq_length": 1024,
        "vocab_size": 32000,
    }
    job = _load(tmp_path, model=shape, num_microbatches=None, global_batch_size=64)
    assert job.num_microbatches == 64 // (2 * 2)
    assert (job.shape.num_layers, job.micro_batch_size, job.model_name) == (8, 2, None)
    assert _load(tmp_path, seq_length=4096).shape.seq_length == 4096


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"colour": "blue"}, r"unknown key\(s\) \['colour'\]"),
        ({"pipeline_stages": None}, r"missing key\(s\) \['pipeline_stages'\]"),
        ({"global_batch_size": 64}, "exactly one of num_microbatches and global_batch_size"),
        ({"num_microbatches": None, "global_batch_size": 30}, "not a multiple of"),
        ({"gpu": "tpu-v9"}, "tpu-v9"),
        ({"model": "gpt-5"}, "unknown model shape"),
        ({"model": {"num_layers": 2, "micro_batch_size": 4}}, "model has unknown key.*top-level key"),
        ({"pipeline_stages": 5}, "do not split evenly"),
        ({"virtual_stages": 2, "num_microbatches": 6}, "multiple of 4"),
        ({"tensor_parallel": 0}, "positive integer"),
        ({"sequence_parallel": "yes"}, "true or false"),
        ({"pipeline_bandwidth_gbps": -1}, "positive number"),
    ],
)
def test_invalid_configs_are_refused_with_the_reason(tmp_path, changes, message):
    with pytest.raises(JobConfigError, match=message):
        _load(tmp_path, **changes)


def test_unreadable_files_are_refused(tmp_path):
    with pytest.raises(JobConfigError, match="cannot read"):
        JobConfig.load(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(JobConfigError, match="not valid YAML"):
        JobConfig.load(tmp_path / "bad.yaml")


def test_comm_and_tail_models(tmp_path):
    job = _load(tmp_path, tensor_parallel=2, sequence_parallel=True, pipeline_bandwidth_gbps=50)
    spec = job.spec()
    comm = job.comm_spec(spec)
    assert comm.activation_bytes == 2 * 2 * 2048 * 2048 // 2  # bf16 x mbs x seq x hidden, split over TP
    assert comm.bandwidth_gbps == 50 and comm.latency_s == spec.p2p_latency_s
    tail = job.iteration_tail(spec)
    assert tail.dp_sync_s > 0 and tail.optimizer_s > 0
    assert _load(tmp_path, data_parallel=1).iteration_tail(spec).dp_sync_s == 0.0
    slower = _load(tmp_path, data_parallel_bandwidth_gbps=spec.p2p_bandwidth_gbps / 2).iteration_tail(spec)
    single_link = _load(tmp_path).iteration_tail(spec)
    assert slower.dp_sync_s - spec.p2p_latency_s == pytest.approx(
        2 * (single_link.dp_sync_s - spec.p2p_latency_s)
    )


def test_dag_and_profile_fit_together(tmp_path):
    job = _load(tmp_path, virtual_stages=2)
    dag = job.build_dag()
    assert len(dag.compute_nodes()) == 2 * 4 * 8 * 2
    profile = job.synthetic_profile()
    assert profile.source == "modelled" and profile.gpu_name == "h200"
    keys = {node.work for node in dag.compute_nodes()}
    assert keys == set(profile.keys())
