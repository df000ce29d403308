"""Issue 43, item 2: one switch-latency rule (``dvfs.clock_switch``), the same in its three users.

The simulator's latency-aware pass, the phase optimiser's check of its switch times and the simulated GPU run
the same one-stage iteration (four instructions, each clock requested as it starts) and must agree on every
instruction's time and energy: with instructions longer than the latency (each switch lands inside the
instruction that asked for it) and shorter (each request is overtaken by the next before it lands, so it never
lands).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_energy.dvfs.clock_switch import SwitchState, landed_switches, lands_at_s, straddle
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.simulated import SimulatedGPUs
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.kernel.switch_times import SwitchRequest, simulate
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Instruction, Work
from megatron_energy.pipeline.orders import PipelineOrders
from megatron_energy.pipeline.profile import ClockOption, Profile
from megatron_energy.sim import Simulator

SPEC = load_gpu_spec("h100-sxm")
MODEL = GpuPowerModel(SPEC)
LATENCY_S = SPEC.switch_latency_s
LOW, HIGH = 1200, SPEC.default_sm_clock_mhz
ORDER = tuple(Instruction(0, 0, mb, kind) for mb in (0, 1) for kind in ("forward", "backward"))
CLOCKS = (LOW, HIGH, LOW, HIGH)
"""F0 asks for the low clock, B0 for the high one, and so on: four switches an iteration."""


def _works(scale: float) -> dict[str, WorkProfile]:
    """A forward and a backward pass, ``scale`` switch latencies long at the high clock (roughly)."""
    return {
        "forward": WorkProfile(0.6 * scale * LATENCY_S, 0.4 * scale * LATENCY_S),
        "backward": WorkProfile(1.4 * scale * LATENCY_S, 0.6 * scale * LATENCY_S),
    }


def _simulator_run(works: dict[str, WorkProfile]) -> list[tuple[float, float, float]]:
    """(start, time, energy) of each instruction in the simulator's latency-aware pass."""
    options = {
        Work(0, 0, kind): [ClockOption(c, MODEL.time_s(w, c), MODEL.energy_j(w, c)) for c in (HIGH, LOW)]
        for kind, w in works.items()
    }
    profile = Profile(options, SPEC.name, "modelled", SPEC.blocked_power_w, SPEC.idle_power_w)
    dag = PipelineDag.build(PipelineOrders((ORDER,), num_microbatches=2))
    clocks = dict(zip(dag.stage_order(0), CLOCKS, strict=True))
    result = Simulator(dag, profile, switch_latency_s=LATENCY_S).run(clocks)
    pieces = [piece for piece in result.timeline if piece.kind in ("forward", "backward")]
    return [(piece.start_s, piece.end_s - piece.start_s, piece.energy_j) for piece in pieces]


def _gpu_run(works: dict[str, WorkProfile], state: Path) -> list[tuple[float, float, float]]:
    """(start, time, energy) of each instruction on a simulated GPU, each clock locked as it starts."""
    gpus = SimulatedGPUs(SPEC, state_path=state)
    gpus.lock_clocks(0, CLOCKS[-1], CLOCKS[-1])  # the steady state: the previous iteration's last clock
    gpus.wait(0, 1.0, blocked=False)
    start_s = gpus.virtual_time_s(0)
    runs = []
    for instruction, clock in zip(ORDER, CLOCKS, strict=True):
        began_s = gpus.virtual_time_s(0) - start_s
        gpus.lock_clocks(0, clock, clock)
        time_s, energy_j = gpus.execute(0, works[instruction.kind])
        runs.append((began_s, time_s, energy_j))
    return runs


def _phase_check_run(works: dict[str, WorkProfile], starts_s: list[float]) -> tuple[float, float]:
    """Time and energy of the instructions as phases, each clock requested at its instruction's start."""
    requests = [
        SwitchRequest(phase, clock, start_s, start_s)
        for phase, (clock, start_s) in enumerate(zip(CLOCKS, starts_s, strict=True))
    ]
    sequence = [works[instruction.kind] for instruction in ORDER]
    run = simulate(MODEL, sequence, CLOCKS[-1], requests, [1.0] * len(requests), LATENCY_S)
    return run.time_s, run.energy_j


@pytest.mark.parametrize("scale", [3.0, 0.3], ids=["switches-land-inside", "requests-overtaken"])
def test_the_simulator_the_phase_check_and_the_simulated_gpu_agree(tmp_path: Path, scale: float) -> None:
    works = _works(scale)
    simulated = _simulator_run(works)
    on_gpu = _gpu_run(works, tmp_path / "gpu.json")
    for (start_s, time_s, energy_j), (gpu_start_s, gpu_time_s, gpu_energy_j) in zip(
        simulated, on_gpu, strict=True
    ):
        assert gpu_start_s == pytest.approx(start_s, rel=1e-9, abs=1e-12)
        assert gpu_time_s == pytest.approx(time_s, rel=1e-9)
        assert gpu_energy_j == pytest.approx(energy_j, rel=1e-9)
    checked_s, checked_j = _phase_check_run(works, [start_s for start_s, _, _ in simulated])
    assert checked_s == pytest.approx(sum(time_s for _, time_s, _ in simulated), rel=1e-9)
    assert checked_j == pytest.approx(sum(energy_j for _, _, energy_j in simulated), rel=1e-9)
    at_high = sum(MODEL.energy_j(works[instruction.kind], HIGH) for instruction in ORDER)
    if scale < 1:  # every request was overtaken: the high clock ran throughout
        assert checked_j == pytest.approx(at_high, rel=1e-9)
    else:
        assert checked_j < at_high


def test_a_request_lands_after_the_latency_unless_a_newer_one_overtakes_it() -> None:
    state = SwitchState(HIGH, HIGH, 0.0).requested_at(LOW, 1.0, LATENCY_S)
    assert state == SwitchState(HIGH, LOW, lands_at_s(1.0, LATENCY_S))
    assert state.requested_at(LOW, 1.0 + LATENCY_S / 2, LATENCY_S) is state, "a repeat is dropped"
    assert state.requested_at(LOW, 1.0 + LATENCY_S, LATENCY_S).effective_mhz == LOW, "landed"
    overtaken = state.requested_at(HIGH, 1.0 + LATENCY_S / 2, LATENCY_S)
    assert overtaken == SwitchState(HIGH, HIGH, 1.0 + 1.5 * LATENCY_S), "the low clock never lands"
    latency = LATENCY_S
    requests = [(0.0, LOW, latency), (latency / 2, HIGH, 1.5 * latency), (3 * latency, LOW, 4 * latency)]
    assert landed_switches(requests) == [(1.5 * LATENCY_S, HIGH), (4 * LATENCY_S, LOW)]


def test_work_cut_by_a_landing_runs_pro_rata_at_each_clock() -> None:
    cut = straddle(0.25, 1.0, 100.0, 2.0, 80.0)
    assert cut == (0.25 + 0.75 * 2.0, 0.25 * 100.0 + 0.75 * 80.0, 0.25, 25.0)
    assert straddle(1.5, 1.0, 100.0, 2.0, 80.0) == (1.0, 100.0, 1.0, 100.0), "landed after it: all old"
