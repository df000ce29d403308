"""Perseus-format profiles drawn at random from a family: test and benchmark inputs we did not hand-tune.

A :class:`ProfileFamily` describes how profiles vary; :func:`family_profile` draws one from a seed. Every
(stage, chunk, kind) gets, independently:

* a time at the maximum clock: the family's forward time, times the stage's imbalance factor (one per stage,
  uniform in ``1 ± stage_imbalance``; the first and last stage's raised by ``first_stage_extra`` and
  ``last_stage_extra``, the work of the embedding and of the LM head and loss), times a backward/forward ratio
  for backward passes;
* a clock sensitivity ``s`` (the fraction of its time that scales with ``1/f``; the rest is memory- or
  latency-bound): ``t(f) = t_max · ((1 − s) + s · f_max / f)``;
* a power at the maximum clock and a power exponent ``γ``: ``P(f) = P_static + (P_max − P_static) ·
  (f / f_max)^γ``, and ``e(f) = P(f) · t(f)``;
* optionally multiplicative noise on every row's time and energy (``noise``, a relative standard deviation),
  as a measured profile has: neighbouring clocks may then swap order, which :meth:`Profile.row_warnings`
  reports.

The default family is the one of issue 13: the A100 grid 1410→900 MHz in 30 MHz steps, 85 W blocked and idle
power, stages ±25 % apart. :func:`balanced_family` is the pipeline Megatron users tune for: stages within
±2.5 % (so at most 5 % apart) but for a heavier first and last stage. Draws are reproducible: the same
family and seed give the same profile on every platform (numpy's ``PCG64`` generator).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megatron_energy.pipeline.instruction import KINDS, Work
from megatron_energy.pipeline.profile import ClockOption, Profile

A100_CLOCKS_MHZ: tuple[int, ...] = tuple(range(1410, 899, -30))
"""The A100 SM clocks 1410→900 MHz in 30 MHz steps (18 clocks)."""


@dataclass(frozen=True)
class ProfileFamily:
    """How the profiles of a family vary (ranges are sampled uniformly).

    Attributes:
        num_stages: Pipeline stages.
        num_chunks: Model chunks per stage (virtual pipeline size).
        clocks_mhz: The SM clocks every instruction is profiled at.
        forward_s: Forward time at the maximum clock of a balanced stage.
        stage_imbalance: Each stage's time factor is uniform in ``[1 − x, 1 + x]``.
        first_stage_extra: The first stage's factor is raised by a fraction drawn from this range (the
            embedding's work).
        last_stage_extra: The last stage's factor is raised by a fraction drawn from this range (the LM head
            and loss).
        backward_ratio: Backward time over forward time at the maximum clock.
        sensitivity: Fraction of an instruction's time that scales with ``1/f``.
        max_power_w: Power at the maximum clock.
        static_power_w: Power that does not scale with the clock.
        power_exponent: ``γ`` in ``P(f) − P_static ∝ f^γ`` (voltage falls with the clock, so above 1).
        noise: Relative standard deviation of multiplicative noise on each row's time and energy.
        blocked_power_w: Power while blocked on pipeline communication.
        idle_power_w: Power while idle after a stage's last instruction.
        gpu_name: The profile's GPU name.
    """

    num_stages: int
    num_chunks: int = 1
    clocks_mhz: tuple[int, ...] = A100_CLOCKS_MHZ
    forward_s: float = 0.030
    stage_imbalance: float = 0.25
    first_stage_extra: tuple[float, float] = (0.0, 0.0)
    last_stage_extra: tuple[float, float] = (0.0, 0.0)
    backward_ratio: tuple[float, float] = (1.7, 2.3)
    sensitivity: tuple[float, float] = (0.3, 1.0)
    max_power_w: tuple[float, float] = (220.0, 400.0)
    static_power_w: tuple[float, float] = (60.0, 110.0)
    power_exponent: tuple[float, float] = (1.5, 3.0)
    noise: float = 0.0
    blocked_power_w: float = 85.0
    idle_power_w: float = 85.0
    gpu_name: str = "a100-family"

    def __post_init__(self) -> None:
        if self.num_stages < 1 or self.num_chunks < 1:
            raise ValueError(f"need at least one stage and chunk, got {self.num_stages}, {self.num_chunks}")
        if not self.clocks_mhz or len(set(self.clocks_mhz)) != len(self.clocks_mhz):
            raise ValueError(f"clocks must be distinct and not empty, got {self.clocks_mhz}")
        if not 0 <= self.stage_imbalance < 1:
            raise ValueError(f"stage_imbalance must be in [0, 1), got {self.stage_imbalance}")
        if self.forward_s <= 0 or self.noise < 0:
            raise ValueError(f"forward_s must be positive and noise non-negative, got {self}")
        for name in (
            "first_stage_extra",
            "last_stage_extra",
            "backward_ratio",
            "sensitivity",
            "max_power_w",
            "static_power_w",
            "power_exponent",
        ):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name} must be a range 0 <= low <= high, got {(low, high)}")
        if self.sensitivity[1] > 1:
            raise ValueError(f"sensitivity must lie in [0, 1], got {self.sensitivity}")
        if self.static_power_w[1] >= self.max_power_w[0]:
            raise ValueError("static power must stay below the power at the maximum clock")


def family_profile(family: ProfileFamily, seed: int) -> Profile:
    """Draw one (modelled) profile of ``family``.

    Args:
        family: The family.
        seed: The draw; the same family and seed give the same profile.

    Returns:
        A profile of ``family.num_stages`` stages and ``family.num_chunks`` chunks at every clock of the
        family, with the family's blocked and idle power.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    clocks = np.asarray(family.clocks_mhz, dtype=float)
    f_max = clocks.max()
    stage_factor = rng.uniform(1 - family.stage_imbalance, 1 + family.stage_imbalance, family.num_stages)
    edges = np.random.Generator(np.random.PCG64([seed, 1]))  # apart, so the other draws stay as they were
    stage_factor[0] *= 1 + edges.uniform(*family.first_stage_extra)
    stage_factor[-1] *= 1 + edges.uniform(*family.last_stage_extra)
    options: dict[Work, list[ClockOption]] = {}
    for stage in range(family.num_stages):
        for chunk in range(family.num_chunks):
            for kind in KINDS:
                ratio = rng.uniform(*family.backward_ratio) if kind == "backward" else 1.0
                t_max = family.forward_s * stage_factor[stage] * ratio
                sensitivity = rng.uniform(*family.sensitivity)
                p_max = rng.uniform(*family.max_power_w)
                p_static = rng.uniform(*family.static_power_w)
                exponent = rng.uniform(*family.power_exponent)
                times = t_max * ((1 - sensitivity) + sensitivity * f_max / clocks)
                powers = p_static + (p_max - p_static) * (clocks / f_max) ** exponent
                energies = powers * times
                if family.noise > 0:
                    times = times * np.exp(rng.normal(0.0, family.noise, clocks.size))
                    energies = energies * np.exp(rng.normal(0.0, family.noise, clocks.size))
                options[Work(stage, chunk, kind)] = [
                    ClockOption(int(clock), float(t), float(e))
                    for clock, t, e in zip(family.clocks_mhz, times, energies, strict=True)
                ]
    return Profile(options, family.gpu_name, "modelled", family.blocked_power_w, family.idle_power_w)


def balanced_family(num_stages: int, num_chunks: int = 1, noise: float = 0.0) -> ProfileFamily:
    """The balanced pipelines Megatron users tune for, on the default family's grid and powers.

    Stages lie within ±2.5 % of each other, but for the first, 2–8 % heavier (the embedding), and the last,
    5–15 % heavier (the LM head and loss).

    Args:
        num_stages: Pipeline stages.
        num_chunks: Model chunks per stage.
        noise: Relative profile noise (:attr:`ProfileFamily.noise`).

    Returns:
        The family.
    """
    return ProfileFamily(
        num_stages,
        num_chunks,
        stage_imbalance=0.025,
        first_stage_extra=(0.02, 0.08),
        last_stage_extra=(0.05, 0.15),
        noise=noise,
    )
