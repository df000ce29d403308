"""A Megatron-LM command line read as a job: the flags that shape its work, without importing Megatron.

``megatron-energy estimate -- <Megatron arguments>`` reads the arguments a user already passes to
``pretrain_gpt.py`` through :data:`MEGATRON_FLAGS`, our own table of the Megatron flags the time/power model
uses (defaults as Megatron's); every other flag is set aside and listed (:attr:`MegatronJob.ignored`). Flags
whose effect the model does not cover (context parallelism, full activation recompute, an expert
tensor-parallel size other than 1) are refused, each with what to do. The GPU count and node layout are not
Megatron flags: :class:`NodeLayout` comes from ``estimate``'s own options, and places the groups as
Megatron's default rank order does (tensor-parallel ranks adjacent, then data-parallel, then pipeline), so a
group that does not fit in one node crosses the NIC.

The result is a :class:`~megatron_energy.job_file.JobFile`, the job YAML's schema, which
``JobConfig.from_file`` builds the job from as it does for a YAML file (``--save-job`` writes it).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.errors import EnergyValueError
from megatron_energy.job_file import JobFile, ModelSection, MoeSection

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128
"""Megatron's ``--make-vocab-size-divisible-by`` default."""


class MegatronCommandLineError(EnergyValueError):
    """The Megatron arguments describe no job the model can estimate; the message names the flag and fix."""


@dataclass(frozen=True)
class NodeLayout:
    """How many GPUs the job runs on and how they sit in nodes (``estimate --gpus/--nodes``)."""

    num_gpus: int
    """GPUs of the whole job (Megatron's world size)."""
    gpus_per_node: int
    """GPUs per node: groups that fit in one node talk over NVLink, the others over the NIC."""
    inter_node_gbps: float
    """Bandwidth per GPU and direction of the NIC, GB/s (the GPU spec's ``nic_bandwidth_gbps`` by default)."""

    def crosses_nodes(self, group_span: int) -> bool:
        """Whether a group of ``group_span`` consecutive ranks (aligned to its size) spans nodes."""
        return group_span > self.gpus_per_node or self.gpus_per_node % group_span != 0


@dataclass(frozen=True)
class MegatronJob:
    """A job read from a Megatron command line."""

    job: JobFile
    """The job as the job YAML's schema holds it."""
    ignored: tuple[str, ...]
    """The arguments set aside: flags the model does not use (listed once, not silently dropped)."""
    notes: tuple[str, ...]
    """What was derived or assumed, in a line each (e.g. the padded vocabulary, the NIC bandwidth)."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' must be a whole number >= 1")
    return value


def _flag_table() -> argparse.ArgumentParser:
    """The Megatron flags the model uses, with Megatron's defaults (:data:`MEGATRON_FLAGS`)."""
    parser = argparse.ArgumentParser(
        prog="Megatron arguments", add_help=False, allow_abbrev=False, exit_on_error=False
    )
    integers = {
        "--pipeline-model-parallel-size": 1,
        "--tensor-model-parallel-size": 1,
        "--context-parallel-size": 1,
        "--expert-model-parallel-size": 1,
        "--expert-tensor-parallel-size": None,
        "--num-layers": None,
        "--hidden-size": None,
        "--ffn-hidden-size": None,
        "--num-attention-heads": None,
        "--num-query-groups": None,
        "--seq-length": None,
        "--micro-batch-size": None,
        "--global-batch-size": None,
        "--num-experts": None,
        "--moe-router-topk": 2,
        "--moe-ffn-hidden-size": None,
        "--num-layers-per-virtual-pipeline-stage": None,
        "--num-virtual-stages-per-pipeline-rank": None,
        "--vocab-size": None,
        "--padded-vocab-size": None,
        "--make-vocab-size-divisible-by": MAKE_VOCAB_SIZE_DIVISIBLE_BY,
    }
    for flag, default in integers.items():
        parser.add_argument(flag, type=_positive, default=default)
    for flag in ("--sequence-parallel", "--group-query-attention", "--swiglu", "--bf16", "--fp16"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--fp8-format", choices=("e4m3", "hybrid"))
    parser.add_argument("--recompute-granularity", choices=("full", "selective"))
    parser.add_argument("--recompute-method", choices=("uniform", "block"))
    return parser


MEGATRON_FLAGS = _flag_table()
"""The Megatron flags ``estimate`` reads; the rest of a command line is listed as ignored."""

UNCOVERED_FLAGS: dict[str, str] = {
    "--use-tp-pp-dp-mapping": "it orders ranks other than Megatron's default, which the node layout follows",
    "--pipeline-model-parallel-layout": "an uneven layer layout is not read from the command line",
    "--decoder-first-pipeline-num-layers": "an uneven first stage is not modelled",
    "--decoder-last-pipeline-num-layers": "an uneven last stage is not modelled",
    "--overlap-moe-expert-parallel-comm": "the combined 1F1B schedule is not modelled by the offline planner",
}
"""Megatron flags that change the work in a way ``estimate`` does not model, each refused with why."""

_REQUIRED = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--micro-batch-size")


def read_megatron_job(arguments: Sequence[str], layout: NodeLayout, gpu: str, spec: GpuSpec) -> MegatronJob:
    """The job a Megatron command line runs on ``layout`` with ``gpu`` (module docstring).

    Args:
        arguments: The Megatron arguments (what follows ``--``), the script name allowed first.
        layout: The GPUs and nodes.
        gpu: The GPU spec as given (a name or a path), for the job.
        spec: That spec, loaded.

    Returns:
        The job, the ignored arguments and what was derived.

    Raises:
        MegatronCommandLineError: A flag's value is malformed, a needed flag is missing, or the flags
            describe a job Megatron would refuse or the model does not cover; the message names the flag.
    """
    args, ignored = _parse(arguments)
    for flag in ignored:
        name = flag.split("=", 1)[0]
        if name in UNCOVERED_FLAGS:
            raise MegatronCommandLineError(
                f"{name}: {UNCOVERED_FLAGS[name]}; drop it to estimate the job without it (the figures then "
                "describe that job)"
            )
    missing = [flag for flag in _REQUIRED if getattr(args, _dest(flag)) is None]
    if missing:
        raise MegatronCommandLineError(
            f"the Megatron arguments have no {', '.join(missing)}: estimate needs the model's shape and "
            "batch (pass the command line you train with after --)"
        )
    _refuse_uncovered(args)
    notes: list[str] = []
    pp, tp = args.pipeline_model_parallel_size, args.tensor_model_parallel_size
    data_parallel = _data_parallel(layout, pp, tp)
    virtual = _virtual_stages(args, pp)
    if args.num_layers % (pp * virtual):
        raise MegatronCommandLineError(
            f"--num-layers {args.num_layers} does not split evenly over --pipeline-model-parallel-size {pp}"
            + (f" x {virtual} virtual stages" if virtual > 1 else "")
            + ": pick a pipeline size (and virtual stages) that divides the layers"
        )
    global_batch = args.global_batch_size or args.micro_batch_size * data_parallel
    if global_batch % (args.micro_batch_size * data_parallel):
        raise MegatronCommandLineError(
            f"--global-batch-size {global_batch} is not a multiple of --micro-batch-size "
            f"{args.micro_batch_size} x data-parallel size {data_parallel} ({layout.num_gpus} GPUs / "
            f"(PP {pp} x TP {tp})): Megatron refuses it"
        )
    if args.global_batch_size is None:
        notes.append(
            f"no --global-batch-size: {global_batch} (one microbatch per pipeline, Megatron's default)"
        )
    (pipeline_gbps, data_parallel_gbps), link_notes = _links(layout, pp, tp, data_parallel)
    notes += link_notes
    model, model_notes = _model(args, tp)
    notes += model_notes
    moe = _moe(args, layout, tp, data_parallel)
    if moe is not None and moe.all_to_all_bandwidth_gbps is not None:
        notes.append(
            f"the expert-parallel group spans nodes: its all-to-all at {layout.inter_node_gbps:g} GB/s"
        )
    job = JobFile(
        name=f"megatron-{args.num_layers}l-h{args.hidden_size}-pp{pp}-tp{tp}-dp{data_parallel}",
        description=f"from a Megatron command line on {layout.num_gpus} x {spec.name}",
        gpu=gpu,
        model=model,
        pipeline_stages=pp,
        virtual_stages=virtual,
        tensor_parallel=tp,
        data_parallel=data_parallel,
        sequence_parallel=args.sequence_parallel,
        micro_batch_size=args.micro_batch_size,
        global_batch_size=global_batch,
        params_dtype="bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
        fp8=args.fp8_format is not None,
        moe=moe,
        pipeline_bandwidth_gbps=pipeline_gbps,
        data_parallel_bandwidth_gbps=data_parallel_gbps,
    )
    return MegatronJob(job, tuple(ignored), tuple(notes))


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _parse(arguments: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The table's flags and the rest, a bad value refused naming its flag."""
    arguments = list(arguments)
    if arguments and not arguments[0].startswith("-"):
        arguments = arguments[1:]  # the script: pretrain_gpt.py
    try:
        return MEGATRON_FLAGS.parse_known_args(arguments, argparse.Namespace())
    except argparse.ArgumentError as error:
        raise MegatronCommandLineError(f"Megatron argument {error}") from None


def _refuse_uncovered(args: argparse.Namespace) -> None:
    """Refuse flags whose effect the time/power model does not cover, or that Megatron would refuse."""
    if args.context_parallel_size > 1:
        raise MegatronCommandLineError(
            f"--context-parallel-size {args.context_parallel_size}: context parallelism is not modelled; "
            "estimate the job with --context-parallel-size 1"
        )
    if args.recompute_granularity == "full":
        raise MegatronCommandLineError(
            "--recompute-granularity full: full activation recompute (another forward pass per backward) "
            "is not modelled; estimate without it, or with --recompute-granularity selective"
        )
    if args.expert_tensor_parallel_size not in (None, 1):
        raise MegatronCommandLineError(
            f"--expert-tensor-parallel-size {args.expert_tensor_parallel_size}: the MoE model assumes 1; "
            "estimate with --expert-tensor-parallel-size 1"
        )
    if args.num_query_groups is not None and not args.group_query_attention:
        raise MegatronCommandLineError(
            "--num-query-groups takes effect only with --group-query-attention (Megatron ignores it "
            "otherwise): add --group-query-attention, or drop --num-query-groups"
        )
    if args.bf16 and args.fp16:
        raise MegatronCommandLineError("--bf16 and --fp16 both given: Megatron takes one; drop the other")
    if args.num_experts is None and (args.expert_model_parallel_size > 1 or args.moe_ffn_hidden_size):
        raise MegatronCommandLineError(
            "--expert-model-parallel-size or --moe-ffn-hidden-size without --num-experts: add --num-experts"
        )


def _data_parallel(layout: NodeLayout, pp: int, tp: int) -> int:
    """Megatron's data-parallel size: the world over PP x TP."""
    if layout.num_gpus % (pp * tp):
        raise MegatronCommandLineError(
            f"{layout.num_gpus} GPUs do not split into --pipeline-model-parallel-size {pp} x "
            f"--tensor-model-parallel-size {tp} = {pp * tp}: give a GPU count that is a multiple of it"
        )
    return layout.num_gpus // (pp * tp)


def _virtual_stages(args: argparse.Namespace, pp: int) -> int:
    """Model chunks per pipeline stage from either virtual-pipeline flag (1 without)."""
    per_stage, chunks = args.num_layers_per_virtual_pipeline_stage, args.num_virtual_stages_per_pipeline_rank
    if per_stage is not None and chunks is not None:
        raise MegatronCommandLineError(
            "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank both given: "
            "Megatron takes one; drop the other"
        )
    if per_stage is None:
        return chunks or 1
    if args.num_layers % (pp * per_stage):
        raise MegatronCommandLineError(
            f"--num-layers {args.num_layers} is not a multiple of --pipeline-model-parallel-size {pp} x "
            f"--num-layers-per-virtual-pipeline-stage {per_stage}"
        )
    return args.num_layers // (pp * per_stage)


def _links(
    layout: NodeLayout, pp: int, tp: int, dp: int
) -> tuple[tuple[float | None, float | None], list[str]]:
    """The NIC bandwidth for the pipeline transfers and the gradient sync where their groups span nodes."""
    nic = layout.inter_node_gbps
    pipeline = nic if layout.num_gpus > layout.gpus_per_node else None
    data = nic if dp > 1 and layout.crosses_nodes(tp * dp) else None
    crossing = [name for name, value in (("pipeline transfers", pipeline), ("gradient sync", data)) if value]
    notes = [f"{' and '.join(crossing)} cross nodes: {nic:g} GB/s per GPU (the NIC)"] if crossing else []
    if pp == 1:
        pipeline = None
    return (pipeline, data), notes


def _model(args: argparse.Namespace, tp: int) -> tuple[ModelSection, list[str]]:
    """The model's shape as Megatron derives it (FFN width and padded vocabulary when not given)."""
    notes = []
    ffn = args.ffn_hidden_size
    if ffn is None:
        ffn = int(4 * args.hidden_size * 2 / 3 / 64) * 64 if args.swiglu else 4 * args.hidden_size
        notes.append(f"no --ffn-hidden-size: {ffn}, as Megatron derives it")
    vocab = args.padded_vocab_size
    if vocab is None:
        if args.vocab_size is None:
            raise MegatronCommandLineError(
                "the Megatron arguments give no --vocab-size (Megatron reads it from the tokenizer): add "
                "--vocab-size N, the tokenizer's vocabulary (e.g. 32000 for Llama-2, 50257 for GPT-2)"
            )
        multiple = args.make_vocab_size_divisible_by * tp
        vocab = -(-args.vocab_size // multiple) * multiple
        notes.append(
            f"vocabulary {args.vocab_size} padded to {vocab} (a multiple of {multiple}, as Megatron pads)"
        )
    model = ModelSection(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        ffn_hidden_size=ffn,
        num_attention_heads=args.num_attention_heads,
        seq_length=args.seq_length,
        vocab_size=vocab,
        num_query_groups=args.num_query_groups if args.group_query_attention else None,
        gated_mlp=args.swiglu,
    )
    if args.recompute_granularity == "selective":
        notes.append("--recompute-granularity selective: modelled as no recompute (core attention only)")
    return model, notes


def _moe(args: argparse.Namespace, layout: NodeLayout, tp: int, dp: int) -> MoeSection | None:
    """The MoE section, its all-to-all over the NIC where the expert-parallel group spans nodes."""
    if args.num_experts is None:
        return None
    ep = args.expert_model_parallel_size
    if args.moe_router_topk > args.num_experts or args.num_experts % ep or (tp * dp) % ep:
        raise MegatronCommandLineError(
            f"--num-experts {args.num_experts} --moe-router-topk {args.moe_router_topk} "
            f"--expert-model-parallel-size {ep}: top-k must not exceed the experts, the expert-parallel size "
            f"must divide the experts and TP x DP = {tp * dp}"
        )
    if tp > 1 and not args.sequence_parallel:
        raise MegatronCommandLineError(
            "MoE with --tensor-model-parallel-size > 1 needs --sequence-parallel (megatron-core refuses it)"
        )
    return MoeSection(
        num_experts=args.num_experts,
        topk=args.moe_router_topk,
        expert_parallel=ep,
        ffn_hidden_size=args.moe_ffn_hidden_size,
        all_to_all_bandwidth_gbps=layout.inter_node_gbps if ep > 1 and layout.crosses_nodes(ep) else None,
    )
