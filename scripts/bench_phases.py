"""Iso-time energy saving of instruction-level vs phase-level clocks at several switch latencies (modelled).

For each example job (``configs/examples/*.yaml``) and each switch latency: the stock iteration (every
instruction at its fastest clock), the Perseus plan at ``iso-time`` made executable under the latency
(instruction level), and that plan refined by the phase optimiser (``--energy-mode all``: phase level), all
simulated from the job's *modelled* profile (its GPU spec's time/power model, FLOP/byte counts of the model
shape, the per-class split of :mod:`megatron_energy.phases.modelled`). Savings are against the stock
iteration at the same latency; every plan keeps the stock iteration time.

Energy accounting of the iteration tail: the simulator charges a modelled tail (gradient sync, optimizer
step) at idle power, which no clock changes; here every column instead charges it by the same time/power
model at the clock in force (stock: the fastest; instruction level: the rank's last instruction's clock;
phase level: its phase clocks), so the three columns compare like with like.

Usage: ``python scripts/bench_phases.py [--latencies 10ms,1ms,100us,10us] [--jobs NAME ...]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

from megatron_energy.config import EnergyTarget
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.job import JobConfig
from megatron_energy.optimiser import PlanningJob
from megatron_energy.perseus.optimiser import PerseusOptimiser
from megatron_energy.phases.optimiser import PhaseOptimiser
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan

EXAMPLES = Path(__file__).resolve().parents[1] / "configs" / "examples"
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_latency(text: str) -> float:
    """``10ms``, ``100us`` or ``0.01s`` as seconds."""
    for unit in ("us", "ms", "s"):
        if text.endswith(unit):
            return float(text.removesuffix(unit)) * UNITS[unit]
    return float(text)


def last_clocks(plan: Plan) -> list[int]:
    """Each rank's last instruction clock in the plan's target point (the clock its tail runs at)."""
    return [list(plan.target_point.clock_table(stage).values())[-1] for stage in range(plan.num_stages)]


def tail_correction_j(job: JobConfig, profile: Profile, clocks: list[int], model: GpuPowerModel) -> float:
    """Per iteration, all stages: the tail at the model's power at each rank's clock, less idle power."""
    tail = job.iteration_tail(model.spec)
    work = WorkProfile(0.0, tail.optimizer_s, tail.dp_sync_s)
    time_s = tail.dp_sync_s + tail.optimizer_s
    return sum(model.energy_j(work, clock) - profile.idle_power_w * time_s for clock in clocks)


def bench(config: JobConfig, latencies: list[float], clock_stride: int, points: int) -> list[str]:
    """The table rows of one job."""
    spec = config.spec()
    model = GpuPowerModel(spec)
    clocks = spec.sm_clocks_mhz[::clock_stride]
    profile = Profile.synthetic(config.shape, spec, config.pipeline_stages, config.virtual_stages, clocks)
    layers = config.shape.num_layers // (config.pipeline_stages * config.virtual_stages)
    rows = []
    for latency_s in latencies:
        job = PlanningJob(
            config.orders(),
            config.fingerprint(),
            EnergyTarget("iso-time"),
            switch_latency_s=latency_s,
            comm=config.comm_spec(spec),
            tail=config.iteration_tail(spec),
            frontier_points=points,
            kept_points=2,
            layers_per_chunk=layers,
        )
        instruction = PerseusOptimiser().plan(profile, job)
        phase = PhaseOptimiser().plan(profile, job, base=instruction)
        top = [max(clocks)] * config.pipeline_stages
        stock = instruction.baseline.energy_j + tail_correction_j(config, profile, top, model)
        correction = tail_correction_j(config, profile, last_clocks(instruction), model)
        inst_j = instruction.target_point.energy_j + correction
        phase_j = phase.target_point.energy_j + correction
        slower = phase.target_point.iteration_time_s / instruction.baseline.iteration_time_s - 1
        rows.append(
            f"| {config.name} | {_latency(latency_s)} | {stock:,.0f} | {1 - inst_j / stock:.1%} "
            f"| {1 - phase_j / stock:.1%} | {slower:+.2%} |"
        )
        print(rows[-1], flush=True)
    return rows


def _latency(seconds: float) -> str:
    return f"{seconds * 1e3:g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:g} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latencies", default="10ms,1ms,100us,10us")
    parser.add_argument("--jobs", nargs="*", help="example job names (default: every example)")
    parser.add_argument("--clock-stride", type=int, default=4, help="use every Nth clock of the spec's grid")
    parser.add_argument("--points", type=int, default=8, help="frontier deadlines in the Perseus sweep")
    args = parser.parse_args()
    latencies = [parse_latency(part) for part in args.latencies.split(",")]
    print("| job | switch latency | stock J/iter (pipeline) | instruction level | phase level | time |")
    print("|---|---|---|---|---|---|")
    for path in sorted(EXAMPLES.glob("*.yaml")):
        config = JobConfig.load(path)
        if args.jobs and config.name not in args.jobs:
            continue
        bench(config, latencies, args.clock_stride, args.points)
    print("all figures modelled (GPU spec time/power model, per-class phase split); savings at iso-time")


if __name__ == "__main__":
    main()
