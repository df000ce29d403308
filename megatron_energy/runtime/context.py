"""What one rank knows about the training job it sits in, independent of Megatron's globals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from megatron_energy.config import EnergyConfig
from megatron_energy.dvfs.kernel_classes import ClassMix
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.energy_dir import JobFacts, PlanningInputs
from megatron_energy.pipeline.chunk_layers import ChunkLayers
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.job_collectives import CollectiveSetup
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.workload import TransformerShape, instruction_mixes


@dataclass(frozen=True)
class JobContext:
    """The parallel layout, executed schedule, batch shape and logging sinks of one rank.

    Built from Megatron's parallel state and arguments by ``megatron_energy.megatron.session_factory`` on
    real runs, and directly by the tests.
    """

    pipeline_rank: int
    """This rank's pipeline stage (0-based)."""

    orders: PipelineOrders
    """Every pipeline rank's instruction order as the schedule executes it (group size included); every DAG
    of the job is built from it."""

    data_parallel_rank: int
    """Which data-parallel replica this rank belongs to."""

    data_parallel_size: int
    """Number of data-parallel replicas."""

    tensor_parallel_size: int = 1
    """Tensor-parallel degree (ranks of one stage that run the same instructions)."""

    shape: TransformerShape | None = None
    """The model's transformer shape; used for fingerprints and for simulated instruction times."""

    layers: ChunkLayers | None = None
    """Decoder layers of every model chunk when ``--pipeline-model-parallel-layout`` places them; ``None``:
    Megatron's even split of ``shape.num_layers``. Simulated instruction times and the fingerprint follow
    it."""

    collectives: CollectiveSetup | None = None
    """The job's collectives as Megatron configured them (parallel sizes, DDP and overlap flags,
    communicator budgets); with ``shape`` and the GPU spec they become the workload the collective scheduler
    plans (``PlanningJob.collectives``). ``None``: not known (the collective scheduler cannot plan)."""

    full_iteration_graph: bool = False
    """Megatron captures the whole training step as one CUDA graph (``--cuda-graph-impl full_iteration``):
    steps replay it without hooks, so clocks are requested by time (``runtime.running.graph_requests``), no
    kernel timeline is recorded and no collective is planned (``collectives`` is ``None``)."""

    global_rank: int = 0
    """This rank in the default process group."""

    world_size: int = 1
    """Ranks in the default process group."""

    local_device_index: int = 0
    """Index of this rank's GPU among the visible devices (``CUDA_VISIBLE_DEVICES`` order)."""

    log_interval: int = 10
    """Steps between energy log lines (Megatron's ``--log-interval``)."""

    log_sinks: tuple[Callable[[str, float, int], Any], ...] = field(default_factory=tuple)
    """Scalar writers ``(name, value, step)``: TensorBoard / W&B when Megatron has them enabled."""

    megatron_log_energy: bool = False
    """Megatron's own ``--log-energy`` is on: the run's totals are printed beside its total."""

    @property
    def pipeline_size(self) -> int:
        """Number of pipeline stages."""
        return self.orders.num_stages

    @property
    def num_microbatches(self) -> int:
        """Microbatches per iteration (per replica)."""
        return self.orders.num_microbatches

    @property
    def num_chunks(self) -> int:
        """Model chunks per stage (virtual pipeline size); 1 without interleaving."""
        return self.orders.num_chunks

    @property
    def is_logging_rank(self) -> bool:
        """Whether this rank prints the job-wide log line (the last rank, as Megatron does)."""
        return self.global_rank == self.world_size - 1

    def compute_mixes(self, spec: GpuSpec) -> dict[Work, ClassMix] | None:
        """The workload model's kernel classes of every instruction class (``None`` without a shape)."""
        if self.shape is None:
            return None
        return instruction_mixes(self.shape, spec, self.pipeline_size, self.num_chunks, self.layers)

    def job_facts(self, gpu_name: str) -> JobFacts:
        """The job facts a cached profile or plan depends on (any change to them invalidates the cache).

        Args:
            gpu_name: The GPU model the profile was taken on.
        """
        setup = self.collectives
        return JobFacts(
            model=self.shape,
            pipeline_size=self.pipeline_size,
            num_chunks=self.num_chunks,
            tensor_parallel_size=self.tensor_parallel_size,
            data_parallel_size=self.data_parallel_size,
            num_microbatches=self.num_microbatches,
            microbatch_group_size=self.orders.microbatch_group_size,
            gpu=gpu_name,
            # every rank computes the same fingerprint: the setup without this rank's own bucket layout
            collectives=None if setup is None else replace(setup, buckets=None),
            layers=self.layers,
            combined_1f1b=self.orders.is_combined,
            full_iteration_graph=self.full_iteration_graph,
        )


def planning_inputs(config: EnergyConfig, spec: GpuSpec) -> PlanningInputs:
    """The planning inputs a cached plan depends on besides the job: a change to any of them re-plans.

    Args:
        config: The ``--energy-*`` configuration (mode, target, phase switching, memory clock).
        spec: The GPU spec the plan is modelled with (its switch latency and every other figure).
    """
    return PlanningInputs(
        mode=config.mode,
        target=str(config.target),
        switch_latency_s=spec.switch_latency_s,
        phase_switching=config.phase_switching,
        gpu_spec={name: value for name, value in asdict(spec).items() if name != "sources"},
        memory_clock=config.memory_clock,
    )
