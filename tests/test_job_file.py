"""The job YAML's schema (``megatron_energy.job_file``): strict reading, the nearest key named, the page.

``docs/reference/job-yaml.md`` lists every key from the schema; it must be what the schema generates now.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from megatron_energy.job import JobConfig, JobConfigError
from megatron_energy.job_file import JobFile, ModelSection, MoeSection, job_yaml_page, read_job_file

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "job-yaml.md"
EXAMPLES = sorted((ROOT / "configs" / "examples").glob("*.yaml"))


def test_the_reference_page_is_what_the_schema_generates_and_names_every_key() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert job_yaml_page(page) == page, "run: python scripts/job_yaml_reference.py"
    for prefix, model in (("", JobFile), ("model.", ModelSection), ("moe.", MoeSection)):
        for name, field in model.model_fields.items():
            assert f"| `{prefix}{name}` |" in page
            assert field.description, f"{prefix}{name} has no docstring"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pipline_stages": 4}, "unknown key(s) ['pipline_stages'] (did you mean 'pipeline_stages'"),
        ({"model": {"num_layer": 24}}, "model has unknown key(s) ['num_layer'] (did you mean 'num_layers'"),
        ({"tensor_parallel": "2"}, "tensor_parallel must be a positive integer, got '2'"),
        ({"data_parallel": True}, "data_parallel must be a positive integer, got True"),
        ({"params_dtype": "int8"}, "params_dtype must be one of bf16, fp16, fp32, got 'int8'"),
        ({"model": 7}, "model must be a known model name or a mapping of shape fields, got 7"),
        ({"name": ""}, "name must be a non-empty string"),
    ],
)
def test_a_bad_key_or_value_is_refused_naming_the_key_and_the_fix(
    changes: dict[str, object], message: str
) -> None:
    data = yaml.safe_load(EXAMPLES[0].read_text()) | changes
    with pytest.raises(JobConfigError, match=re.escape(message)):
        JobConfig.from_dict(data, source="job.yaml")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.stem)
def test_a_written_job_file_reads_back_as_the_same_job(path: Path, tmp_path: Path) -> None:
    file = read_job_file(yaml.safe_load(path.read_text()))
    written = tmp_path / "job.yaml"
    written.write_text(yaml.safe_dump(file.to_yaml_data(), sort_keys=False))
    assert JobConfig.load(written) == JobConfig.load(path)
