"""A collective (or any bandwidth-bound kernel) with a CTA budget, and what it does to compute beside it.

*Modelled*, with these parameters from the GPU spec (``configs/gpus/*.yaml``): ``sm_count`` (S),
``cta_bandwidth_gbps`` (beta), the link's bandwidth (B: ``nvlink_bandwidth_gbps``, ``nic_bandwidth_gbps`` or
``pcie_bandwidth_gbps``, or the job's own figure), ``idle_power_w`` (P_idle), ``dynamic_power_max_w`` (P_dyn),
``memory_power_w`` (P_mem), ``memory_core_activity`` (a), ``power_limit_w``.

**Duration.** A collective with ``c`` CTAs that sends ``T`` bytes per GPU (``traffic_factor x bytes``) takes::

    d(c) = latency + T / min(B, c * beta)

Each CTA (one NCCL channel) drives at most ``beta``; the link saturates at ``c_sat = B / beta`` CTAs, beyond
which more CTAs buy nothing. With a knee sharpness ``p`` (:attr:`CommLoad.knee`) the minimum is smoothed into
the generalised mean ``(B^-p + (c * beta)^-p)^(-1/p)``, which approaches it as ``p`` grows. Assumptions: the
link is the bottleneck once saturated (no PCIe or HBM limit below B); the per-CTA rate does not depend on the
SM clock (CTAs spread one to an SM are bandwidth-bound, far above the memory saturation clock); protocol
overheads are folded into ``beta`` and ``latency``. That is its
duration *alone*; beside compute its rate changes over its life (see Placement).

**Placement.** Alone, the block scheduler spreads the ``c`` CTAs over ``c`` idle SMs. Launched while compute
fills every SM, its CTAs go to the first SMs that free up, as many to one SM as its occupancy allows
(``ctas_per_sm``: threads, registers, shared memory per CTA), and stay there for the kernel's life: it then
holds ``ceil(c / ctas_per_sm)`` SMs and, when its per-SM bandwidths are known, drives at most ``s`` per SM
held once it runs alone (``sm_bandwidth_gbps``) and ``s_b`` beside compute (``sm_beside_gbps``): beside
compute a packed SM's copy shares L2 and HBM with it. Its rate (:meth:`CommLoad.rate_gbps`)::

    r = min(B, c * beta, h * s)        alone        (the last term for packed loads only)
    r = min(B, c * beta, h * s_b)      beside compute

Measured on one H200 (``lab/gpu_contention.py``, kernel timelines of 2026-12-02): a Triton copy of 8 CTAs
of 256 threads launched beside bf16 GEMMs, packed 4 to an SM on 2 SMs, moved 58.5 GB/s per SM beside them
while they ran above the power cap (~1800 MHz by their times: the bursts of
``lab/contention_check.py``) and ~77 GB/s per SM alone at 1980 MHz: less than the clock
ratio gives, so the rate beside is taken as measured, not scaled by the clock. NCCL's CTAs (512+ threads,
large shared buffers) are assumed to fit one per SM (``ctas_per_sm=1``, unmeasured).

**Contention.** While the collective runs, the SMs it holds (``h``: ``c`` spread, ``ceil(c / ctas_per_sm)``
packed) are lost to compute beside it: compute's progress rate is ``(1 - h/S)`` of its rate alone, at the
same clock, and ``1/gamma`` of that when the load says so (:attr:`CommLoad.compute_slowdown`: L2 and HBM
shared with a packed copy slowed bf16 GEMMs by a further ~6 % on one H200, kernel timelines); a collective's
memory-bandwidth contention is not modelled otherwise (its HBM traffic is ~3 x its link rate, a few % of HBM
bandwidth).

**Power.** Power of the GPU while the collective runs beside compute at clock ``f``::

    P = P_idle + (1 - h/S) * (P_compute(f) - P_idle) + P_comm(c, f)
    P_comm(c, f) = (h/S) * a * P_dyn * v(f)^2 * max(f, f_sat)/f_max  +  P_mem * hbm_rate / hbm_full

``P_compute(f)`` is the compute's own busy power at ``f`` (its profile option), ``P_comm`` the collective's
*dynamic* power: its CTAs' core activity (a, as for memory-bound work) and its HBM traffic (``hbm_rate`` =
``hbm_bytes_per_byte`` x its rate ``r(f)``; ``hbm_full`` the achieved full HBM bandwidth, the rate at which
``P_mem`` was calibrated). Beside compute ``P_comm`` is always this estimate of its marginal power: a dynamic
power measured alone (:attr:`CommLoad.measured_dynamic_power_w`) also holds the chip-wide activity it wakes
(L2, memory controllers, fabric), which the compute beside it already pays. Measured on one H200
(``lab/gpu_contention.py``, 2026-12-02): in windows mostly filled by power-capped GEMMs (median 1470 MHz
alone), a copy of 8 to 132 CTAs beside them, drawing 103-414 W above blocked power alone, left the median SM
clock at 1455-1485 MHz; adding its alone power would have cut it to 765-1380 MHz (modelled).

When ``P`` exceeds the power limit the GPU lowers its clock: the effective clock is the highest profiled clock
at or below the requested one at which ``P`` fits (the lowest when none does), and the compute's rate is
``(1 - h/S) / gamma x t(f_requested) / t(f_effective)``. A collective alone (no compute beside it) draws
``P_blocked + P_comm``, with its measured dynamic power, when it has one, in place of ``P_comm``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from megatron_energy.dvfs.model import GpuPowerModel
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.errors import EnergyValueError

HBM_FULL_FRACTION = 0.885
"""Achieved fraction of peak HBM bandwidth at which ``memory_power_w`` was calibrated (H200: 4250 of 4800
GB/s, ``configs/gpus/h200.yaml``)."""

NCCL_HBM_BYTES_PER_BYTE = 3.0
"""HBM bytes a ring collective moves per byte it sends: read the input, write the received chunk, read it
again to reduce or forward (assumed)."""


def saturated_rate_gbps(link_gbps: float, ctas_gbps: float, knee: float | None) -> float:
    """The saturation law of the module docstring: ``min(B, c x beta)``, or its generalised mean with a knee.

    Args:
        link_gbps: The saturated bandwidth ``B``.
        ctas_gbps: What the CTAs drive without a limit, ``c x beta``.
        knee: Sharpness ``p`` of the knee (``None``: the hard minimum).
    """
    if knee is None:
        return min(link_gbps, ctas_gbps)
    return float((link_gbps**-knee + ctas_gbps**-knee) ** (-1.0 / knee))


@dataclass(frozen=True)
class CommLoad:
    """A bandwidth-bound kernel with a CTA budget on one link (a collective, or a local copy).

    Attributes:
        ctas: CTAs (SMs) it runs on.
        link_bandwidth_gbps: Bandwidth of the link it saturates, GB/s per direction.
        cta_bandwidth_gbps: Bandwidth one CTA drives, GB/s.
        hbm_bytes_per_byte: HBM traffic per byte moved over the link.
        latency_s: Fixed cost per launch.
        measured_dynamic_power_w: Its dynamic power measured while it ran alone (power minus blocked
            power); replaces the estimate of :meth:`ContentionModel.comm_dynamic_power_w` when given.
        ctas_per_sm: CTAs one SM takes when they are packed (its occupancy); 1 spreads them.
        sm_bandwidth_gbps: Bandwidth one SM it holds drives when packed and alone, however many of its CTAs
            it holds (None: no limit).
        sm_beside_gbps: The same beside compute (None: ``sm_bandwidth_gbps``).
        compute_slowdown: ``gamma >= 1``: compute beside it progresses at ``(1 - h/S) / gamma`` of its rate
            alone (module docstring, Contention).
        packed: Launched beside compute that fills every SM, so its CTAs are packed for its whole life
            (module docstring); only a packed load is held to the per-SM bandwidths.
        knee: Sharpness ``p`` of the saturation knee: the rate is the generalised mean
            ``(B^-p + (c x beta)^-p)^(-1/p)`` rather than ``min(B, c x beta)`` (None: the hard minimum).
    """

    ctas: int
    link_bandwidth_gbps: float
    cta_bandwidth_gbps: float
    hbm_bytes_per_byte: float = NCCL_HBM_BYTES_PER_BYTE
    latency_s: float = 0.0
    measured_dynamic_power_w: float | None = None
    ctas_per_sm: int = 1
    sm_bandwidth_gbps: float | None = None
    sm_beside_gbps: float | None = None
    compute_slowdown: float = 1.0
    packed: bool = False
    knee: float | None = None

    def __post_init__(self) -> None:
        if self.ctas < 1 or self.ctas_per_sm < 1:
            raise EnergyValueError(
                f"a collective needs at least one CTA and one CTA per SM, got {self.ctas}, {self.ctas_per_sm}"
            )
        per_sm = (self.sm_bandwidth_gbps, self.sm_beside_gbps)
        if not all(v is None or (math.isfinite(v) and v > 0) for v in per_sm):
            raise EnergyValueError(f"per-SM bandwidths must be positive, got {per_sm}")
        if not (math.isfinite(self.compute_slowdown) and self.compute_slowdown >= 1.0):
            raise EnergyValueError(f"the compute slowdown must be >= 1, got {self.compute_slowdown}")
        values = (self.link_bandwidth_gbps, self.cta_bandwidth_gbps)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise EnergyValueError(f"bandwidths must be positive, got {values}")
        if self.hbm_bytes_per_byte < 0 or self.latency_s < 0:
            raise EnergyValueError("HBM bytes per byte and latency must not be negative")
        if self.knee is not None and not (math.isfinite(self.knee) and self.knee > 0):
            raise EnergyValueError(f"the knee's sharpness must be positive, got {self.knee}")

    @property
    def held_sms(self) -> int:
        """SMs its CTAs occupy: one each when spread, ``ceil(c / ctas_per_sm)`` when packed."""
        return math.ceil(self.ctas / self.ctas_per_sm) if self.packed else self.ctas

    def rate_gbps(self, beside: bool) -> float:
        """Its rate ``r`` (module docstring), beside compute or alone.

        ``min(B, c x beta)`` (or its smooth form with :attr:`knee`); a packed load also at most
        :attr:`held_sms` x its per-SM bandwidth there.
        """
        rate = saturated_rate_gbps(self.link_bandwidth_gbps, self.ctas * self.cta_bandwidth_gbps, self.knee)
        per_sm = self.sm_bandwidth_gbps
        if beside and self.sm_beside_gbps is not None:
            per_sm = self.sm_beside_gbps
        if per_sm is None or not self.packed:
            return rate
        return min(rate, self.held_sms * per_sm)

    @property
    def bandwidth_gbps(self) -> float:
        """Its rate alone."""
        return self.rate_gbps(beside=False)

    @property
    def saturation_ctas(self) -> float:
        """CTAs beyond which the link is saturated (``B / beta``)."""
        return self.link_bandwidth_gbps / self.cta_bandwidth_gbps

    def duration_s(self, traffic_bytes: float) -> float:
        """Time alone to send ``traffic_bytes`` per GPU: latency plus bytes over :attr:`bandwidth_gbps`."""
        if traffic_bytes < 0:
            raise EnergyValueError(f"traffic must not be negative, got {traffic_bytes}")
        return self.latency_s + traffic_bytes / (self.bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class OverlapState:
    """Compute beside a collective (modelled).

    Attributes:
        rate: Progress of the compute relative to running alone at the requested clock (0..1].
        power_w: Total GPU power while both run.
        clock_mhz: The profiled clock the compute is priced at (lower than requested when the power cap
            binds).
        comm_power_w: The collective's dynamic part of ``power_w``: the estimate of
            :meth:`ContentionModel.comm_dynamic_power_w` beside compute, never a power measured alone.
    """

    rate: float
    power_w: float
    clock_mhz: int
    comm_power_w: float


class ContentionModel:
    """Durations, SM shares and powers of collectives beside compute on one GPU spec (module docstring)."""

    def __init__(self, spec: GpuSpec):
        """Use ``spec``'s SM count, power figures and voltage curve."""
        self.spec = spec
        self._power = GpuPowerModel(spec)
        self._hbm_full_gbps = spec.memory_bandwidth_gbps * HBM_FULL_FRACTION

    def describe(self) -> str:
        """One line naming the parameters, for reports of *modelled* figures."""
        spec = self.spec
        return (
            f"modelled contention ({spec.name}: {spec.sm_count} SMs, "
            f"{spec.cta_bandwidth_gbps:g} GB/s per CTA, "
            f"NVLink {spec.nvlink_bandwidth_gbps:g} / NIC {spec.nic_bandwidth_gbps:g} / PCIe "
            f"{spec.pcie_bandwidth_gbps:g} GB/s, compute slows by the collective's SM share)"
        )

    def sm_share(self, load: CommLoad) -> float:
        """Share of the SMs the collective holds (``h / S``, at most 1)."""
        return min(1.0, load.held_sms / self.spec.sm_count)

    def comm_dynamic_power_w(self, load: CommLoad, clock_mhz: float, alone: bool = True) -> float:
        """Dynamic power of the collective at ``clock_mhz``: its CTAs' core activity and its HBM traffic.

        Alone, a load with a measured dynamic power gives that instead (at any clock); beside compute
        (``alone=False``) the estimate holds (module docstring).
        """
        if alone and load.measured_dynamic_power_w is not None:
            return load.measured_dynamic_power_w
        spec = self.spec
        v_rel = self._power.voltage_v(clock_mhz) / spec.voltage_max_v
        f_max = float(spec.max_sm_clock_mhz)
        f_core = max(clock_mhz, self._power.saturation_clock_mhz) / f_max
        core = self.sm_share(load) * spec.memory_core_activity * spec.dynamic_power_max_w * v_rel**2 * f_core
        rate_gbps = load.rate_gbps(beside=not alone)
        hbm = spec.memory_power_w * min(1.0, rate_gbps * load.hbm_bytes_per_byte / self._hbm_full_gbps)
        return core + hbm

    def alone_power_w(self, load: CommLoad, clock_mhz: float) -> float:
        """Power of the GPU while only the collective runs (blocked power plus its dynamic power)."""
        return self.spec.blocked_power_w + self.comm_dynamic_power_w(load, clock_mhz)

    def overlap(
        self,
        load: CommLoad,
        clock_mhz: int,
        clocks: Sequence[int],
        time_s: Callable[[int], float],
        power_w: Callable[[int], float],
    ) -> OverlapState:
        """Compute at requested ``clock_mhz`` beside the collective ``load``.

        Args:
            load: The collective.
            clock_mhz: The compute's requested clock.
            clocks: Clocks the compute can be priced at (its profiled clocks).
            time_s: The compute's time alone at a clock of ``clocks``.
            power_w: The compute's busy power alone at a clock of ``clocks``.

        Returns:
            Its rate, the power and the profiled clock it is priced at.
        """
        share = self.sm_share(load)
        idle, limit = self.spec.idle_power_w, self.spec.power_limit_w
        candidates = sorted((c for c in clocks if c <= clock_mhz), reverse=True) or [min(clocks)]
        chosen = candidates[-1]
        for clock in candidates:
            comm_w = self.comm_dynamic_power_w(load, clock, alone=False)
            total = idle + (1 - share) * (power_w(clock) - idle) + comm_w
            if total <= limit + 1e-9:
                chosen = clock
                break
        comm_w = self.comm_dynamic_power_w(load, chosen, alone=False)
        total = idle + (1 - share) * (power_w(chosen) - idle) + comm_w
        rate = (1 - share) / load.compute_slowdown * time_s(clock_mhz) / time_s(chosen)
        return OverlapState(rate, total, chosen, comm_w)
