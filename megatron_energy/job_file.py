"""The job YAML's schema: every key, its type, default, checks and meaning (``configs/examples/*.yaml``).

:class:`JobFile` is the file as pydantic reads it (strict: no string for a number, no boolean for an integer,
unknown keys refused with the nearest known key named); :class:`~megatron_energy.job.JobConfig` is built from
it alone (``JobConfig.from_file``), whether the file came from YAML or from a Megatron command line
(``megatron-energy estimate``). The checks that span keys (layers over stages, the batch over the
data-parallel size, MoE against the parallelism) are the builder's. ``docs/reference/job-yaml.md`` lists the
keys from this schema (:func:`job_yaml_reference`; ``tests/test_job_file.py`` keeps the page current).
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

import yaml
from annotated_types import Ge, Gt, MinLen
from pydantic import BaseModel, ConfigDict, Discriminator, Tag, ValidationError, field_validator
from pydantic_core import ErrorDetails

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.errors import EnergyValueError
from megatron_energy.pipeline.workload import KNOWN_SHAPES

PositiveInt = Annotated[int, Ge(1)]
"""An integer >= 1."""
PositiveFloat = Annotated[float, Gt(0)]
"""A number > 0 (GB/s)."""

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)


class ModelSection(BaseModel):
    """``model:`` as a mapping: the transformer's shape (Megatron's flags in brackets)."""

    model_config = _STRICT

    num_layers: PositiveInt
    """Transformer layers of the whole model (``--num-layers``)."""
    hidden_size: PositiveInt
    """Model width (``--hidden-size``)."""
    ffn_hidden_size: PositiveInt
    """MLP inner width (``--ffn-hidden-size``)."""
    num_attention_heads: PositiveInt
    """Attention heads (``--num-attention-heads``); divide ``hidden_size``."""
    seq_length: PositiveInt
    """Tokens per sequence (``--seq-length``); the job's ``seq_length`` overrides it."""
    vocab_size: PositiveInt
    """Vocabulary size after Megatron's padding (``--vocab-size`` padded to a multiple of 128 x TP)."""
    num_query_groups: PositiveInt | None = None
    """Key/value heads with grouped-query attention (``--group-query-attention --num-query-groups``);
    unset: one per attention head."""
    gated_mlp: bool = False
    """A gated (SwiGLU) MLP: three weight matrices instead of two (``--swiglu``)."""


class MoeSection(BaseModel):
    """``moe:``: every layer's MLP a mixture-of-experts layer (``pipeline.moe``)."""

    model_config = _STRICT

    num_experts: PositiveInt
    """Experts per MoE layer (``--num-experts``)."""
    topk: PositiveInt
    """Experts each token is routed to (``--moe-router-topk``)."""
    expert_parallel: PositiveInt = 1
    """GPUs a layer's experts are split over (``--expert-model-parallel-size``); divides
    ``tensor_parallel`` x ``data_parallel``."""
    ffn_hidden_size: PositiveInt | None = None
    """One expert's FFN width (``--moe-ffn-hidden-size``); unset: the model's ``ffn_hidden_size``."""
    all_to_all_bandwidth_gbps: PositiveFloat | None = None
    """GB/s per GPU and direction of the link the expert-parallel group crosses; unset: the GPU spec's
    NVLink (the group inside a node)."""
    overlapped_all_to_all: Literal[False] = False
    """Must be false: job files plan megatron-core's default schedules, which keep the expert all-to-all on
    the critical path (only the combined 1F1B schedule overlaps it)."""


def _model_kind(value: object) -> str:
    return "name" if isinstance(value, str) else "shape"


ModelField = Annotated[
    Annotated[str, Tag("name")] | Annotated[ModelSection, Tag("shape")], Discriminator(_model_kind)
]
"""A known shape's name or a mapping of shape fields."""


class JobFile(BaseModel):
    """The top-level keys: one Megatron training job on one GPU type."""

    model_config = _STRICT

    name: Annotated[str, MinLen(1)]
    """The job's name (plan files and tables carry it)."""
    gpu: Annotated[str, MinLen(1)]
    """GPU spec: a name under ``configs/gpus/`` (``h100-sxm``, ``a100-sxm-80gb``, ...) or a path to a spec
    YAML."""
    model: ModelField
    """A known shape (``gpt3-1.3b``, ``gpt3-2.7b``, ``gpt3-6.7b``, ``llama-7b``, ``llama-13b``,
    ``llama-70b``, ...) or a mapping of the ``model.*`` keys below."""
    pipeline_stages: PositiveInt
    """Pipeline-parallel size (``--pipeline-model-parallel-size``); divides the layers."""
    micro_batch_size: PositiveInt
    """Sequences per microbatch (``--micro-batch-size``)."""
    description: str = ""
    """Free text."""
    seq_length: PositiveInt | None = None
    """Tokens per sequence (``--seq-length``); unset: the model's."""
    virtual_stages: PositiveInt = 1
    """Model chunks per pipeline stage, an interleaved schedule when > 1
    (``--num-layers-per-virtual-pipeline-stage`` or ``--num-virtual-stages-per-pipeline-rank``)."""
    tensor_parallel: PositiveInt = 1
    """Tensor-parallel size (``--tensor-model-parallel-size``)."""
    data_parallel: PositiveInt = 1
    """Data-parallel size: the GPUs over pipeline stages x tensor-parallel size."""
    sequence_parallel: bool = False
    """Megatron's sequence parallelism (``--sequence-parallel``): splits pipeline transfers over the
    tensor-parallel group; MoE with ``tensor_parallel`` > 1 needs it."""
    num_microbatches: PositiveInt | None = None
    """Microbatches per pipeline per iteration; give this or ``global_batch_size``, not both."""
    global_batch_size: PositiveInt | None = None
    """Sequences per iteration over all data-parallel replicas (``--global-batch-size``); a multiple of
    ``micro_batch_size`` x ``data_parallel``."""
    pipeline_bandwidth_gbps: PositiveFloat | None = None
    """GB/s per GPU of the link pipeline transfers cross; unset: the GPU spec's NVLink (set the NIC's where
    stages sit on different nodes)."""
    data_parallel_bandwidth_gbps: PositiveFloat | None = None
    """GB/s per GPU of the link the data-parallel gradient sync crosses; unset: the GPU spec's NVLink."""
    params_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    """The parameters' dtype: Megatron's ``--bf16``, ``--fp16``, or neither (``fp32``)."""
    fp8: bool = False
    """The decoder layers' GEMMs in fp8 (Megatron's ``--fp8-format``)."""
    moe: MoeSection | None = None
    """A mixture-of-experts model: the ``moe.*`` keys below."""

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, gpu: str) -> str:
        load_gpu_spec(gpu)  # its message lists the known specs
        return gpu

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str | ModelSection) -> str | ModelSection:
        if isinstance(model, str) and model not in KNOWN_SHAPES:
            raise ValueError(f"unknown model shape {model!r}; known: {', '.join(sorted(KNOWN_SHAPES))}")
        return model

    def to_yaml_data(self) -> dict[str, Any]:
        """The file's content, keys in schema order, unset and default keys left out (``--save-job``)."""
        return self.model_dump(mode="json", exclude_defaults=True)


class JobFileError(EnergyValueError):
    """A job file's content breaks the schema; the message names the keys and the fix."""


def read_job_file(data: object) -> JobFile:
    """The schema's reading of a YAML mapping.

    Raises:
        JobFileError: The problems, ``;``-separated, each naming its key and the fix.
    """
    if not isinstance(data, dict):
        raise JobFileError("expected a mapping of job settings")
    try:
        return JobFile.model_validate(data)
    except ValidationError as error:
        details = sorted(_grouped(error.errors()), key=lambda detail: detail["type"] != "extra_forbidden")
        problems = list(dict.fromkeys(_problem(detail) for detail in details))
        raise JobFileError("; ".join(problems)) from None


def _grouped(details: list[ErrorDetails]) -> list[ErrorDetails]:
    """Unknown and missing keys of one section as one error each (the message lists them together)."""
    kept: list[ErrorDetails] = []
    seen: set[tuple[str, tuple[Any, ...]]] = set()
    for detail in details:
        loc = _location(detail)
        if detail["type"] in ("extra_forbidden", "missing"):
            group = (detail["type"], loc[:-1])
            if group in seen:
                continue
            seen.add(group)
            names = [
                _location(d)[-1]
                for d in details
                if d["type"] == detail["type"] and _location(d)[:-1] == loc[:-1]
            ]
            detail = {**detail, "ctx": {"names": names}}
        kept.append(detail)
    return kept


def _location(detail: ErrorDetails) -> tuple[Any, ...]:
    """The key path of an error, the model union's tag (``model.shape.num_layers``) left out."""
    loc = tuple(detail["loc"])
    return loc[:1] + loc[2:] if loc[:1] == ("model",) and loc[1:2] in (("name",), ("shape",)) else loc


def _problem(detail: ErrorDetails) -> str:
    """One error as a line that names the key and the fix."""
    loc = _location(detail)
    key = ".".join(map(str, loc))
    section = ".".join(map(str, loc[:-1]))
    kind, value = detail["type"], detail.get("input")
    if kind == "extra_forbidden":
        names = detail["ctx"]["names"]
        allowed = _allowed(loc[:-1])
        hint = "".join(_nearest(str(name), allowed, bool(section)) for name in names)
        where = f"{section} has unknown" if section else "unknown"
        return f"{where} key(s) {sorted(map(str, names))}{hint}; allowed: {allowed}"
    if kind == "missing":
        names = detail["ctx"]["names"]
        return f"{section} is missing {names}" if section else f"missing key(s) {names}"
    if kind == "value_error":
        return str(detail["ctx"]["error"])
    if kind in ("int_type", "greater_than_equal") and _annotation(loc) == "int":
        return f"{key} must be a positive integer, got {value!r}"
    if kind in ("float_type", "greater_than"):
        return f"{key} must be a positive number, got {value!r}"
    if loc[-1] == "overlapped_all_to_all":
        return (
            "moe.overlapped_all_to_all: only the combined 1F1B schedule overlaps the expert all-to-all, "
            "and job files plan megatron-core's default schedules: drop the key"
        )
    if kind == "bool_type":
        return f"{key} must be true or false, got {value!r}"
    if kind == "literal_error":
        expected = str(detail["ctx"]["expected"]).replace("'", "").replace(" or ", ", ")
        return f"{key} must be one of {expected}, got {value!r}"
    if kind in ("string_type", "string_too_short"):
        return f"{key} must be a non-empty string, got {value!r}"
    if kind in ("model_type", "model_attributes_type") and loc == ("model",):
        return f"model must be a known model name or a mapping of shape fields, got {value!r}"
    if kind in ("model_type", "model_attributes_type"):
        return f"{key} must be a mapping, e.g. moe: {{num_experts: 8, topk: 2}}; got {value!r}"
    return f"{key}: {detail['msg']}"


def _nearest(name: str, allowed: list[str], in_section: bool) -> str:
    """`` (did you mean 'x'?)`` for a misspelt key, or where a top-level key was put in a section."""
    if in_section and name in JobFile.model_fields:
        return f" ({name!r} is a top-level key: move it out of the section)"
    close = difflib.get_close_matches(name, allowed, 1)
    return f" (did you mean {close[0]!r} for {name!r}?)" if close else ""


def _annotation(loc: tuple[Any, ...]) -> str:
    """Whether the key at ``loc`` holds integers (``int``) or something else."""
    model: type[BaseModel] = JobFile
    for part in loc[:-1]:
        model = ModelSection if part == "model" else MoeSection
    field = model.model_fields.get(str(loc[-1]))
    return "int" if field is not None and "int" in str(field.annotation) else "other"


def _allowed(section: tuple[Any, ...]) -> list[str]:
    """The keys a section allows, sorted."""
    sections: dict[tuple[Any, ...], type[BaseModel]] = {
        (): JobFile,
        ("model",): ModelSection,
        ("moe",): MoeSection,
    }
    model = sections.get(section, JobFile)
    return sorted(model.model_fields)


REFERENCE_START = "<!-- job-yaml-reference: generated from megatron_energy/job_file.py -->"
"""Where the generated tables begin in ``docs/reference/job-yaml.md``."""
REFERENCE_END = "<!-- end of job-yaml-reference -->"
"""Where they end."""


def job_yaml_page(page: str) -> str:
    """``page`` with the text between its two markers replaced by :func:`job_yaml_reference`.

    Raises:
        ValueError: The page lacks a marker.
    """
    if REFERENCE_START not in page or REFERENCE_END not in page:
        raise ValueError(f"the page needs the lines {REFERENCE_START!r} and {REFERENCE_END!r}")
    head, rest = page.split(REFERENCE_START, 1)
    tail = rest.split(REFERENCE_END, 1)[1]
    return f"{head}{REFERENCE_START}\n\n{job_yaml_reference()}\n{REFERENCE_END}{tail}"


def job_yaml_reference() -> str:
    """Every key of the job YAML as Markdown: a table per section with type, default and meaning."""
    sections: list[tuple[str, type[BaseModel]]] = [
        ("", JobFile),
        ("model.", ModelSection),
        ("moe.", MoeSection),
    ]
    parts = []
    for prefix, model in sections:
        parts.append(
            f"### {'top level' if not prefix else f'`{prefix[:-1]}`'}\n\n{_code(model.__doc__ or '')}\n"
        )
        parts.append("| key | type | default | meaning |\n|---|---|---|---|")
        for name, field in model.model_fields.items():
            default = "required" if field.is_required() else _default_text(field.default)
            kind = _type_text(field.annotation) + (" or unset" if field.default is None else "")
            text = _code(" ".join((field.description or "").split()))
            parts.append(f"| `{prefix}{name}` | {kind} | {default} | {text} |")
        parts.append("")
    return "\n".join(parts)


def _type_text(annotation: object) -> str:
    """A field's type in words."""
    text = str(annotation)
    for pattern, words in (
        ("ModelSection", "name or mapping"),
        ("MoeSection", "mapping"),
        ("Literal['bf16', 'fp16', 'fp32']", "`bf16`, `fp16` or `fp32`"),
        ("Literal[False]", "false"),
        ("int", "integer >= 1"),
        ("float", "number > 0"),
        ("bool", "true/false"),
        ("str", "string"),
    ):
        if pattern in text:
            return words
    return text


def _default_text(value: object) -> str:
    """A default as the YAML would spell it; ``unset`` for none."""
    return (
        "unset"
        if value is None
        else f"`{yaml.safe_dump(value).removesuffix(chr(10) + '...' + chr(10)).strip()}`"
    )


def _code(text: str) -> str:
    """The docstrings' ````code```` as Markdown's single backquotes."""
    return text.replace("``", "`")
