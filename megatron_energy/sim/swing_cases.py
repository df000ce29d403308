"""Stock clocks, a plan and a filler floor side by side: each one replica's power, per GPU and at scale.

A case is one way the job could run, as one replica's modelled power over an iteration (its stages' GPU
traces, :func:`~megatron_energy.sim.power_timeline.stage_power_traces`, times the tensor-parallel size): the
stock clocks, the plan's clocks, or the stock clocks with a **filler floor**, today's remedy (GB200's
firmware floor, PyTorch's power damper): every GPU held by filler work at ``share`` × the stock peak of the
busiest GPU, which costs ∫ max(0, floor − P) dt (:func:`~megatron_energy.power_swing.floor_energy_j`).
Every figure is *modelled*.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from megatron_energy.errors import EnergyValueError
from megatron_energy.power_swing import (
    DEFAULT_RESOLUTION_S,
    PowerTrace,
    SwingFigures,
    floor_energy_j,
    floored,
    swing_figures,
)
from megatron_energy.sim.job_power import JobPower, JobScale, job_power, replica_power


@dataclass(frozen=True)
class SwingCase:
    """One way the job runs, as one replica's power over an iteration (*modelled*).

    Attributes:
        name: ``"stock"``, ``"plan"`` or ``"filler floor"``.
        replica: One replica's power over one iteration in watts, the filler's included.
        gpus_per_replica: The replica's GPUs (pipeline stages × tensor-parallel size).
        floor_w: The power every GPU is held at or above by filler (``None`` but for a filler floor).
        filler_j: The filler's energy per replica and iteration (0 but for a filler floor).
    """

    name: str
    replica: PowerTrace
    gpus_per_replica: int
    floor_w: float | None = None
    filler_j: float = 0.0

    @property
    def iteration_s(self) -> float:
        """The iteration time of the case."""
        return self.replica.duration_s

    def per_gpu(self, iterations: int, resolution_s: float = DEFAULT_RESOLUTION_S) -> SwingFigures:
        """The figures of the replica's mean GPU over ``iterations`` iterations."""
        return swing_figures(self.replica.scaled(1 / self.gpus_per_replica).tiled(iterations), resolution_s)

    def at(self, scale: JobScale, resolution_s: float = DEFAULT_RESOLUTION_S) -> JobPower:
        """The whole job's power at ``scale`` (:func:`~megatron_energy.sim.job_power.job_power`)."""
        return job_power(self.replica, self.gpus_per_replica, scale, resolution_s)


def swing_cases(
    stock: Sequence[PowerTrace],
    plan: Sequence[PowerTrace] | None,
    tensor_parallel: int,
    floor_share: float,
    resolution_s: float = DEFAULT_RESOLUTION_S,
) -> list[SwingCase]:
    """Stock, the plan (when given) and the stock clocks under a filler floor, in that order.

    Args:
        stock: Each stage's GPU power over one iteration at stock clocks.
        plan: The same under the plan's clocks, or ``None``.
        tensor_parallel: GPUs per stage.
        floor_share: The filler floor as a share of the busiest GPU's stock peak (read at ``resolution_s``).
        resolution_s: Bin width the floor is held at.

    Returns:
        The cases.
    """
    if not 0.0 < floor_share <= 1.0:
        raise EnergyValueError(
            f"a filler floor of {floor_share!r} x the stock peak is not a share: give one in (0, 1], e.g. 0.8"
        )
    gpus = len(stock) * tensor_parallel
    cases = [SwingCase("stock", replica_power(stock, tensor_parallel), gpus)]
    if plan is not None:
        cases.append(SwingCase("plan", replica_power(plan, tensor_parallel), gpus))
    floor_w = floor_share * max(float(trace.binned(resolution_s).power_w.max()) for trace in stock)
    held = [floored(trace, floor_w, resolution_s) for trace in stock]
    filler_j = tensor_parallel * sum(floor_energy_j(trace, floor_w, resolution_s) for trace in stock)
    cases.append(SwingCase("filler floor", replica_power(held, tensor_parallel), gpus, floor_w, filler_j))
    return cases


@dataclass(frozen=True)
class ScaledCase:
    """One case's power at one job scale (*modelled*).

    Attributes:
        case: The case (stock, plan, filler floor).
        job: Its whole job's power at the scale (``job.scale``).
    """

    case: SwingCase
    job: JobPower

    @property
    def filler_j(self) -> float:
        """The filler's energy per iteration over the whole job (0 but for a filler floor)."""
        return self.case.filler_j * self.job.replicas


def at_scales(
    cases: Sequence[SwingCase], scales: Sequence[JobScale], resolution_s: float = DEFAULT_RESOLUTION_S
) -> list[list[ScaledCase]]:
    """Every case at every scale: one list per scale, the cases in their order."""
    return [[ScaledCase(case, case.at(scale, resolution_s)) for case in cases] for scale in scales]
