"""The whole job's power at scale: one replica's modelled power summed over its data-parallel copies.

A replica is one pipeline (its stages' GPUs, each stage a tensor-parallel group whose GPUs draw alike); a job
of N GPUs runs N / (stages × TP) identical replicas. How their iterations line up decides what the grid sees:

* **in phase** (the worst case: the data-parallel gradient sync waits for the slowest replica and so aligns
  them all): the job's power is the replica's times the number of replicas, exactly;
* **spread**: each replica starts its iteration at an offset drawn (seeded) uniformly from
  ``[0, spread × iteration)``. Replicas are identical and periodic, so the job's power over an iteration is
  the replica's circularly convolved with the histogram of offsets: computed on a grid of ``step_s`` (offsets
  rounded to it) by one FFT, whatever the number of replicas, with every replica counted and the energy
  kept.

The job's power over a few iterations is the one iteration tiled (steady state), read by
:func:`~megatron_energy.power_swing.swing_figures`. Every figure is *modelled*.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from megatron_energy.errors import EnergyValueError
from megatron_energy.power_swing import (
    DEFAULT_RESOLUTION_S,
    PowerTrace,
    SwingFigures,
    summed,
    swing_figures,
)

OFFSET_STEP_S = 1e-3
"""Grid of a spread job's power and of the replicas' start offsets: far below the figures' resolution."""


@dataclass(frozen=True)
class JobScale:
    """A job size and how its data-parallel replicas line up in time (the scenario of :func:`job_power`).

    Attributes:
        gpus: The job's GPUs: a whole number of replicas (pipeline stages × tensor-parallel size each).
        spread: Replicas start their iterations at offsets drawn uniformly from ``[0, spread × iteration)``;
            0 puts them all in phase (the worst case), 1 spreads them over the whole iteration.
        iterations: Iterations in the job's power trace (whole ones: the band is read by an FFT).
        seed: Seed of the offsets' draw (the same seed, the same job power).
    """

    gpus: int
    spread: float = 0.0
    iterations: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise EnergyValueError(f"a job needs at least one GPU, got {self.gpus}")
        if not 0.0 <= self.spread <= 1.0:
            raise EnergyValueError(
                f"spread {self.spread!r} is not a share of the iteration: give 0 (in phase) to 1 (uniform)"
            )
        if self.iterations < 1:
            raise EnergyValueError(f"the job's trace needs at least one iteration, got {self.iterations}")

    @property
    def in_phase(self) -> bool:
        """Whether every replica starts its iteration at the same time."""
        return self.spread == 0.0

    def replicas(self, gpus_per_replica: int) -> int:
        """Data-parallel replicas of ``gpus_per_replica`` GPUs each; an error when they do not divide."""
        if gpus_per_replica < 1 or self.gpus % gpus_per_replica:
            raise EnergyValueError(
                f"{self.gpus} GPUs are not a whole number of replicas of {gpus_per_replica} GPUs "
                "(pipeline stages x tensor-parallel size); give a multiple of it"
            )
        return self.gpus // gpus_per_replica


@dataclass(frozen=True)
class JobPower:
    """The whole job's power over a few iterations, and what it does to the grid (*modelled*).

    Attributes:
        scale: The scenario: GPUs, spread of the replicas, iterations.
        replicas: Data-parallel replicas in the job.
        trace: The job's power in watts over ``scale.iterations`` iterations (modelled).
        figures: The trace's swing, ramps and band energy at the resolution asked for (watts, W/s).
    """

    scale: JobScale
    replicas: int
    trace: PowerTrace
    figures: SwingFigures


def replica_power(stage_traces: Sequence[PowerTrace], tensor_parallel: int) -> PowerTrace:
    """One replica's power: each stage's GPU trace times its tensor-parallel group's GPUs, summed.

    Args:
        stage_traces: Each pipeline stage's GPU power over one iteration
            (:func:`~megatron_energy.sim.power_timeline.stage_power_traces`).
        tensor_parallel: GPUs per stage (a tensor-parallel group draws alike).

    Returns:
        The replica's power over the iteration (``len(stage_traces) × tensor_parallel`` GPUs).
    """
    if tensor_parallel < 1:
        raise EnergyValueError(f"tensor-parallel size must be at least 1, got {tensor_parallel}")
    return summed(list(stage_traces)).scaled(tensor_parallel)


def job_power(
    replica: PowerTrace,
    gpus_per_replica: int,
    scale: JobScale,
    resolution_s: float = DEFAULT_RESOLUTION_S,
    step_s: float = OFFSET_STEP_S,
) -> JobPower:
    """The job's power at ``scale`` from one replica's power over one iteration (*modelled*).

    Args:
        replica: One replica's power over one iteration (:func:`replica_power`), periodic.
        gpus_per_replica: The replica's GPUs (pipeline stages × tensor-parallel size).
        scale: GPUs, spread of replica start offsets, iterations, seed.
        resolution_s: Bin width of the figures.
        step_s: Grid of the offsets and of the spread job's power (ignored in phase).

    Returns:
        The job's power trace and its figures.
    """
    replicas = scale.replicas(gpus_per_replica)
    iteration = replica.scaled(replicas) if scale.in_phase else _spread(replica, replicas, scale, step_s)
    trace = iteration.tiled(scale.iterations)
    return JobPower(scale, replicas, trace, swing_figures(trace, resolution_s))


def _spread(replica: PowerTrace, replicas: int, scale: JobScale, step_s: float) -> PowerTrace:
    """``replicas`` copies of ``replica`` started at seeded uniform offsets, summed over one iteration."""
    if not step_s > 0:
        raise EnergyValueError(f"the offset step must be positive, got {step_s!r} s")
    period = replica.duration_s
    bins = max(1, round(period / step_s))
    width = period / bins
    edges = replica.edges_s[0] + width * np.arange(bins + 1)
    one = np.diff(replica.energy_until(edges)) / width
    offsets = np.random.default_rng(scale.seed).uniform(0.0, scale.spread * period, replicas)
    counts = np.bincount(np.rint(offsets / width).astype(int) % bins, minlength=bins)
    power = np.fft.irfft(np.fft.rfft(one) * np.fft.rfft(counts), n=bins)
    return PowerTrace(edges, power, replica.source)
