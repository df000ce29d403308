"""A training job described in YAML: model shape, parallelism, batch and GPU (``configs/examples/*.yaml``).

Example::

    name: gpt3-xl-pp4-h100
    gpu: h100-sxm                # a spec in configs/gpus/
    model: gpt3-1.3b             # a known shape, or a mapping of TransformerShape fields
    pipeline_stages: 4
    virtual_stages: 1            # model chunks per stage (interleaved schedule when > 1)
    tensor_parallel: 1
    data_parallel: 8
    micro_batch_size: 4
    global_batch_size: 512       # or num_microbatches (per pipeline)

Every key, its type, default and meaning is in the schema, :class:`~megatron_energy.job_file.JobFile`, which
reads the file (``docs/reference/job-yaml.md`` lists them); :meth:`JobConfig.from_file` is the one builder of
a job from it, for a YAML file and for a Megatron command line (``megatron-energy estimate``) alike, after the
checks that span keys (layers over stages, the batch over the data-parallel size, MoE against the parallelism;
MoE jobs with ``tensor_parallel`` > 1 need ``sequence_parallel: true``, as megatron-core does).

:class:`JobConfig` also derives what the simulator needs: Megatron's instruction orders, the pipeline DAG with
its transfer cost and iteration tail, and a modelled profile. The transfer and tail figures are *modelled*:

* a pipeline transfer is one microbatch's hidden states in bf16 (split over the tensor-parallel group with
  sequence parallelism), at the spec's P2P latency plus bytes over ``pipeline_bandwidth_gbps``;
* the data-parallel sync is a reduce-scatter plus all-gather (distributed optimizer, no overlap with the
  backward pass) of bf16 gradients of the largest stage, ``2 (dp-1)/dp`` times its bytes over
  ``data_parallel_bandwidth_gbps``;
* an MoE layer's expert all-to-alls (dispatch and combine) are in its instructions' time, at the spec's P2P
  latency plus the bytes it sends over ``moe.all_to_all_bandwidth_gbps`` (``pipeline.moe``);
* the optimizer step is Adam over the rank's 1/dp shard: ``ADAM_BYTES_PER_PARAMETER`` bytes of HBM traffic per
  parameter (fp32 parameter, gradient and two moments read, three written, bf16 copy written).
"""

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.errors import EnergyValueError
from megatron_energy.job_file import JobFile, read_job_file
from megatron_energy.optimisers.interface import PlanningJob, planning_job
from megatron_energy.pipeline.collectives import CollectiveWorkload, edge_parameters, layer_parameters
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import CommSpec, IterationTail
from megatron_energy.pipeline.job_collectives import CollectiveSetup
from megatron_energy.pipeline.moe import MoeShape
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.schedule_tables import check_schedule_arguments
from megatron_energy.pipeline.workload import MEMORY_EFFICIENCY
from megatron_energy.plan import FINGERPRINT_DIGITS, fingerprint
from megatron_energy.target import EnergyTarget

GRADIENT_BYTES = 2
ADAM_BYTES_PER_PARAMETER = 30


class JobConfigError(EnergyValueError):
    """A job config is invalid; the message names the file and the problem."""


@dataclass(frozen=True)
class JobConfig:
    """One Megatron training job.

    Attributes:
        name: Job name.
        gpu: GPU spec name (``configs/gpus/<gpu>.yaml``).
        shape: Model shape with this job's micro-batch size and tensor-parallel degree.
        pipeline_stages: Pipeline-parallel size.
        virtual_stages: Model chunks per pipeline stage (virtual pipeline size); 1 without interleaving.
        data_parallel: Data-parallel size.
        num_microbatches: Microbatches per pipeline per iteration.
        sequence_parallel: Whether Megatron's sequence parallelism is on (splits pipeline transfers by TP).
        pipeline_bandwidth_gbps: Bandwidth of pipeline transfers; None = the spec's P2P figure.
        data_parallel_bandwidth_gbps: Bandwidth of the gradient sync; None = the spec's P2P figure.
        model_name: The known shape the model came from, if any.
        description: Free text.
    """

    name: str
    gpu: str
    shape: TransformerShape
    pipeline_stages: int
    virtual_stages: int = 1
    data_parallel: int = 1
    num_microbatches: int = 1
    sequence_parallel: bool = False
    pipeline_bandwidth_gbps: float | None = None
    data_parallel_bandwidth_gbps: float | None = None
    model_name: str | None = None
    description: str = ""

    @property
    def tensor_parallel(self) -> int:
        """Tensor-parallel size."""
        return self.shape.tensor_parallel

    @property
    def micro_batch_size(self) -> int:
        """Sequences per microbatch."""
        return self.shape.micro_batch_size

    @property
    def global_batch_size(self) -> int:
        """Sequences per iteration over all data-parallel replicas."""
        return self.micro_batch_size * self.num_microbatches * self.data_parallel

    @property
    def num_gpus(self) -> int:
        """GPUs of the whole job."""
        return self.pipeline_stages * self.tensor_parallel * self.data_parallel

    @classmethod
    def load(cls, path: str | Path) -> "JobConfig":
        """Read a job from YAML.

        Args:
            path: The YAML file.

        Returns:
            The job.

        Raises:
            JobConfigError: If the file is missing, not YAML, or describes an invalid job.
        """
        source = Path(path)
        try:
            data = yaml.safe_load(source.read_text(encoding="utf-8"))
        except OSError as error:
            raise JobConfigError(f"cannot read job config {source}: {error.strerror}") from None
        except yaml.YAMLError as error:
            raise JobConfigError(f"job config {source} is not valid YAML: {error}") from None
        return cls.from_dict(data, source=str(source))

    @classmethod
    def from_dict(cls, data: object, source: str = "<job config>") -> "JobConfig":
        """Build a job from the mapping a YAML file holds (see the module docstring for the keys).

        Args:
            data: The parsed YAML.
            source: Where the data came from, for error messages.

        Returns:
            The job.

        Raises:
            JobConfigError: On unknown or missing keys, wrong types or values, or a job Megatron would refuse.
        """
        try:
            return _build(read_job_file(data))
        except (ValueError, TypeError) as error:
            raise JobConfigError(f"job config {source}: {error}") from None

    @classmethod
    def from_file(cls, file: JobFile, source: str = "<job config>") -> "JobConfig":
        """Build a job from the job YAML's schema (a file read, or a Megatron command line's ``estimate``).

        Args:
            file: The job as :class:`~megatron_energy.job_file.JobFile` holds it.
            source: Where it came from, for error messages.

        Raises:
            JobConfigError: On a job Megatron would refuse (layers over stages, the batch, MoE parallelism).
        """
        try:
            return _build(file)
        except (ValueError, TypeError) as error:
            raise JobConfigError(f"job config {source}: {error}") from None

    def spec(self) -> GpuSpec:
        """The GPU spec named by ``gpu``."""
        return load_gpu_spec(self.gpu)

    def fingerprint(self) -> str:
        """The job's fingerprint: every plan made for this job carries it (``plan --config``)."""
        fields = dataclasses.asdict(self) | {"shape": self.shape.identity()}
        return fingerprint(kind="job-config", **fields)[:FINGERPRINT_DIGITS]

    def orders(self) -> PipelineOrders:
        """Megatron's instruction order on every pipeline rank."""
        return pipeline_orders(self.pipeline_stages, self.num_microbatches, self.virtual_stages)

    def comm_spec(self, spec: GpuSpec | None = None) -> CommSpec:
        """Modelled cost of one pipeline transfer (see the module docstring)."""
        spec = spec or self.spec()
        split = self.tensor_parallel if self.sequence_parallel else 1
        return CommSpec(
            latency_s=spec.p2p_latency_s,
            bandwidth_gbps=self.pipeline_bandwidth_gbps or spec.p2p_bandwidth_gbps,
            activation_bytes=self.shape.activation_bytes() // split,
        )

    def iteration_tail(self, spec: GpuSpec | None = None) -> IterationTail:
        """Modelled data-parallel gradient sync and optimizer step (see the module docstring)."""
        spec = spec or self.spec()
        parameters = _largest_stage_parameters(self.shape, self.pipeline_stages)
        dp = self.data_parallel
        dp_sync_s = 0.0
        if dp > 1:
            traffic = 2 * (dp - 1) / dp * parameters * GRADIENT_BYTES
            bandwidth_gbps = self.data_parallel_bandwidth_gbps or spec.p2p_bandwidth_gbps
            dp_sync_s = spec.p2p_latency_s + traffic / (bandwidth_gbps * 1e9)
        optimizer_bytes = ADAM_BYTES_PER_PARAMETER * parameters / dp
        optimizer_s = optimizer_bytes / (spec.memory_bandwidth_gbps * 1e9 * MEMORY_EFFICIENCY)
        return IterationTail(dp_sync_s=dp_sync_s, optimizer_s=optimizer_s)

    def collective_setup(self, spec: GpuSpec | None = None) -> CollectiveSetup:
        """The job's collectives before the orders (``pipeline.job_collectives``), every lever free.

        Links: the data-parallel group and pipeline transfers over NVLink unless the job gives their bandwidth
        below NVLink's (then over the NIC, at that bandwidth). The distributed optimizer is assumed (gradient
        reduce-scatter and parameter all-gather per bucket).
        """
        nvlink = (spec or self.spec()).nvlink_bandwidth_gbps
        dp_bandwidth = self.data_parallel_bandwidth_gbps or nvlink
        pp_bandwidth = self.pipeline_bandwidth_gbps or nvlink
        return CollectiveSetup(
            data_parallel=self.data_parallel,
            sequence_parallel=self.sequence_parallel,
            distributed_optimizer=True,
            dp_link="nic" if dp_bandwidth < nvlink else "nvlink",
            pp_link="nic" if pp_bandwidth < nvlink else "nvlink",
            dp_bandwidth_gbps=dp_bandwidth,
            pp_bandwidth_gbps=pp_bandwidth,
        )

    def collective_workload(self, spec: GpuSpec | None = None) -> CollectiveWorkload:
        """What the job's collectives are built from (links: :meth:`collective_setup`)."""
        spec = spec or self.spec()
        return self.collective_setup(spec).workload(self.shape, self.orders(), spec)

    def build_dag(self, orders: PipelineOrders | None = None, spec: GpuSpec | None = None) -> PipelineDag:
        """The iteration DAG with modelled transfers and tail.

        Args:
            orders: Instruction orders; Megatron's (:meth:`orders`) when ``None``.
            spec: The GPU spec; loaded from ``gpu`` when ``None``.
        """
        spec = spec or self.spec()
        return PipelineDag.build(
            orders if orders is not None else self.orders(),
            comm=self.comm_spec(spec),
            tail=self.iteration_tail(spec),
        )

    def planning_job(
        self,
        target: EnergyTarget,
        frontier_points: int,
        switch_latency_s: float | None = None,
        spec: GpuSpec | None = None,
    ) -> PlanningJob:
        """The job as every optimiser plans it (``plan --config``, ``simulate --compare``).

        Args:
            target: The planning target.
            frontier_points: Deadlines in the frontier sweep.
            switch_latency_s: The clock-switch latency; the GPU spec's when ``None``.
            spec: The GPU spec; loaded from ``gpu`` when ``None``.
        """
        spec = spec or self.spec()
        workload = self.collective_workload(spec)
        return planning_job(
            workload.orders,
            self.fingerprint(),
            target,
            spec,
            shape=self.shape,
            switch_latency_s=switch_latency_s,
            comm=self.comm_spec(spec),
            tail=self.iteration_tail(spec),
            collectives=workload,
            layers_per_chunk=workload.layers_per_chunk,
            frontier_points=frontier_points,
        )

    def synthetic_profile(self, spec: GpuSpec | None = None) -> Profile:
        """A modelled profile of this job's instructions at every clock of the GPU spec."""
        return Profile.synthetic(self.shape, spec or self.spec(), self.pipeline_stages, self.virtual_stages)


def _largest_stage_parameters(shape: TransformerShape, num_stages: int) -> float:
    """Parameters on one GPU of the largest pipeline stage (its layers plus the embedding or output layer)."""
    return shape.num_layers / num_stages * layer_parameters(shape) + edge_parameters(shape)


def _shape(file: JobFile) -> TransformerShape:
    """The model shape from ``model`` (a known name or fields) and the job's batch, TP and precision."""
    overrides: dict[str, Any] = {
        "tensor_parallel": file.tensor_parallel,
        "micro_batch_size": file.micro_batch_size,
        "params_dtype": file.params_dtype,
        "fp8": file.fp8,
    }
    if file.seq_length is not None:
        overrides["seq_length"] = file.seq_length
    if isinstance(file.model, str):
        return TransformerShape.from_name(file.model, **overrides)
    return TransformerShape(**{**file.model.model_dump(), **overrides})


def _moe(file: JobFile) -> MoeShape | None:
    """The job's ``moe`` section, checked against its parallelism (see the module docstring)."""
    if file.moe is None:
        return None
    moe = MoeShape(**file.moe.model_dump())
    if (file.tensor_parallel * file.data_parallel) % moe.expert_parallel:
        raise ValueError(
            f"moe.expert_parallel {moe.expert_parallel} does not divide tensor_parallel x data_parallel = "
            f"{file.tensor_parallel * file.data_parallel}: megatron-core forms expert-parallel groups from "
            "those GPUs (with --expert-tensor-parallel-size 1); pick a divisor"
        )
    if file.tensor_parallel > 1 and not file.sequence_parallel:
        raise ValueError(
            "moe with tensor_parallel > 1 needs sequence_parallel: true (megatron-core refuses MoE with "
            "tensor parallelism otherwise)"
        )
    return moe


def _num_microbatches(file: JobFile) -> int:
    """Microbatches per pipeline from ``num_microbatches`` or ``global_batch_size`` (exactly one)."""
    if (file.num_microbatches is None) == (file.global_batch_size is None):
        raise ValueError("give exactly one of num_microbatches and global_batch_size")
    if file.num_microbatches is not None:
        return file.num_microbatches
    assert file.global_batch_size is not None
    per_iteration = file.micro_batch_size * file.data_parallel
    if file.global_batch_size % per_iteration:
        raise ValueError(
            f"global_batch_size {file.global_batch_size} is not a multiple of micro_batch_size x "
            f"data_parallel = {per_iteration}"
        )
    return file.global_batch_size // per_iteration


def _build(file: JobFile) -> JobConfig:
    """The job a schema-checked file describes, after the checks that span its keys."""
    shape = _shape(file)
    num_microbatches = _num_microbatches(file)
    stages, chunks = file.pipeline_stages, file.virtual_stages
    if shape.num_layers % (stages * chunks):
        raise ValueError(
            f"{shape.num_layers} layers do not split evenly over {stages} stages x {chunks} virtual stages"
        )
    check_schedule_arguments(stages, num_microbatches, chunks)
    moe = _moe(file)
    if moe is not None:
        shape = dataclasses.replace(shape, moe=moe)
    return JobConfig(
        name=file.name,
        gpu=file.gpu,
        shape=shape,
        pipeline_stages=stages,
        virtual_stages=chunks,
        data_parallel=file.data_parallel,
        num_microbatches=num_microbatches,
        sequence_parallel=file.sequence_parallel,
        pipeline_bandwidth_gbps=file.pipeline_bandwidth_gbps,
        data_parallel_bandwidth_gbps=file.data_parallel_bandwidth_gbps,
        model_name=file.model if isinstance(file.model, str) else None,
        description=file.description,
    )
