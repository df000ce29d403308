"""The calibration's measuring side without a GPU: a stand-in NVML module at the boundary, real threads."""
# ruff: noqa: N802  (the stand-in has NVML's function names)

import math
import threading
import time

import pytest

from megatron_energy.dvfs.calibration_nvml import (
    POWER_CAP_REASON,
    BurstRun,
    Loop,
    LoopTiming,
    SetterTripwires,
    run_calibration,
)
from megatron_energy.dvfs.kernel_classes import KernelClass
from megatron_energy.dvfs.spec import load_gpu_spec

TIMING = LoopTiming(loop_s=0.6, duty_s=0.6, burst_s=0.02, gap_s=0.04, ramp_s=0.1, poll_s=0.002)

PERIOD_S = 0.02
"""The stand-in's energy counter advances every 20 ms (NVML's ~100 ms, scaled down with the loops)."""


class FakeNvml:
    """NVML's read functions over a GPU whose power and clock the test's loops set; setters exist too."""

    __name__ = "fake_pynvml"
    NVML_CLOCK_SM = 1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._origin = time.perf_counter()
        self._changes = [(0.0, 120.0)]  # (time since origin, watts)
        self.clock_mhz = 1980
        self.reasons = 0
        self.setter_calls = 0

    def set(self, power_w: float, clock_mhz: int, reasons: int = 0) -> None:
        with self._lock:
            self._changes.append((time.perf_counter() - self._origin, power_w))
            self.clock_mhz = clock_mhz
            self.reasons = reasons

    def _energy_j(self, until_s: float) -> float:
        total = 0.0
        for (start, watts), (end, _) in zip(
            self._changes, [*self._changes[1:], (math.inf, 0.0)], strict=True
        ):
            if start >= until_s:
                break
            total += watts * (min(end, until_s) - start)
        return total

    # the read-only functions the calibration may call
    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        with self._lock:
            now = time.perf_counter() - self._origin
            return int(1000 * self._energy_j(math.floor(now / PERIOD_S) * PERIOD_S))

    def nvmlDeviceGetClockInfo(self, handle, which):
        return self.clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons

    def nvmlDeviceGetPowerUsage(self, handle):
        with self._lock:
            return int(1000 * self._changes[-1][1])

    def nvmlDeviceGetSupportedMemoryClocks(self, handle):
        return [3201, 2201]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle, memory_clock):
        assert memory_clock == 3201
        return list(range(1980, 344, -15))

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return 700_000

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    # setters: must never be reached
    def nvmlDeviceSetGpuLockedClocks(self, handle, low, high):
        self.setter_calls += 1

    def nvmlDeviceResetGpuLockedClocks(self, handle):
        self.setter_calls += 1

    def nvmlDeviceSetPowerManagementLimit(self, handle, limit):
        self.setter_calls += 1


def held(nvml: FakeNvml, power_w: float, clock_mhz: int, reasons: int = 0):
    def run(seconds: float) -> tuple[float, int]:
        nvml.set(power_w, clock_mhz, reasons)
        time.sleep(seconds)
        return seconds, 100

    return run


def bursts(nvml: FakeNvml, power_w: float):
    """Bursts at ``power_w`` (NVML reads the top clock in them), then idle gaps at 118 W."""

    def run(seconds: float, burst_s: float, gap_s: float) -> BurstRun:
        began, windows = time.perf_counter(), []
        while time.perf_counter() - began < seconds:
            start = time.perf_counter()
            nvml.set(power_w, 1980)
            time.sleep(burst_s)
            windows.append((start, time.perf_counter()))
            nvml.set(118.0, 1980)
            time.sleep(gap_s)
        return BurstRun(
            time.perf_counter() - began, burst_s * len(windows), 10 * len(windows), tuple(windows)
        )

    return run


def loops(nvml: FakeNvml) -> dict[str, Loop]:
    return {
        "gemm_bf16_8192": Loop(
            held(nvml, 698.0, 1380, POWER_CAP_REASON),
            "matmul",
            lambda n, s: n / s,
            KernelClass.GEMM_BF16,
            bursts(nvml, 930.0),
        ),
        "copy": Loop(held(nvml, 480.0, 1980), "copy", None, KernelClass.MEMORY),
        "blocked": Loop(held(nvml, 140.0, 1980), "spin"),
    }


def idle_on(nvml: FakeNvml):
    def idle(seconds: float) -> None:
        nvml.set(118.0, 1980)
        time.sleep(seconds)

    return idle


@pytest.mark.slow
def test_each_loop_reads_its_power_clock_reasons_and_the_counter_period():
    nvml = FakeNvml()
    run = run_calibration(nvml, "h0", loops(nvml), TIMING, idle=idle_on(nvml))
    gemm, duty, copy = run.loops
    assert (gemm.name, duty.name, copy.name) == ("gemm_bf16_8192", "gemm_bf16_8192@duty", "copy")
    assert gemm.power_w == pytest.approx(698.0, rel=0.04)
    assert gemm.median_sm_clock_mhz == 1380  # the clock the GPU chose under the cap
    assert gemm.power_cap_share == 1.0 and gemm.kernel_class == KernelClass.GEMM_BF16
    assert gemm.rate == pytest.approx(100 / 0.6)
    assert copy.power_w == pytest.approx(480.0, rel=0.04) and copy.power_cap_share == 0.0
    assert run.blocked.power_w == pytest.approx(140.0, rel=0.04)
    assert run.idle.power_w == pytest.approx(118.0, rel=0.04)
    assert run.counter_period_s == pytest.approx(PERIOD_S, rel=0.25)
    assert run.gpu_name == "NVIDIA H200" and run.power_limit_w == 700.0
    assert run.supported_sm_clocks_mhz[0] == 1980 and run.supported_memory_clocks_mhz == (3201, 2201)
    assert nvml.setter_calls == 0


@pytest.mark.slow
def test_a_duty_cycled_run_knows_its_busy_share_and_the_clock_nvml_read_in_its_bursts():
    nvml = FakeNvml()
    duty = run_calibration(nvml, "h0", loops(nvml), TIMING, idle=idle_on(nvml)).loops[1]
    assert duty.is_duty and duty.burst_clock_mhz == 1980
    assert duty.busy_fraction == pytest.approx(1 / 3, abs=0.06)
    expected_w = 118.0 + duty.busy_fraction * (930.0 - 118.0)
    assert duty.power_w == pytest.approx(expected_w, rel=0.08)


@pytest.mark.slow
def test_a_setter_reached_stops_the_run_before_it_acts():
    nvml = FakeNvml()
    sneaky = loops(nvml)

    def clock_setting_loop(seconds: float) -> tuple[float, int]:
        nvml.nvmlDeviceSetGpuLockedClocks("h0", 1005, 1005)
        return seconds, 1

    sneaky["copy"] = Loop(clock_setting_loop, "sets a clock", None, KernelClass.MEMORY)
    with pytest.raises(AssertionError, match=r"fake_pynvml\.nvmlDeviceSetGpuLockedClocks"):
        run_calibration(nvml, "h0", sneaky, TIMING, idle=idle_on(nvml))
    assert nvml.setter_calls == 0  # the real setter never ran


def test_a_loop_too_short_for_the_counter_is_refused():
    nvml = FakeNvml()
    with pytest.raises(ValueError, match=r"fewer than twice|no NVML sample"):
        short = LoopTiming(loop_s=0.03, duty_s=0.03, ramp_s=0.0, poll_s=0.002)
        run_calibration(nvml, "h0", loops(nvml), short, idle=idle_on(nvml))


def test_missing_loops_are_named():
    nvml = FakeNvml()
    with pytest.raises(ValueError, match="blocked"):
        run_calibration(nvml, "h0", {k: v for k, v in loops(nvml).items() if k != "blocked"}, TIMING)
    with pytest.raises(ValueError, match="gemm_bf16"):
        run_calibration(nvml, "h0", {k: v for k, v in loops(nvml).items() if "gemm" not in k}, TIMING)


def test_tripwires_cover_every_setter_prefix():
    class Module:
        __name__ = "m"

        def nvmlDeviceClearAccountingPids(self):
            pass

        def nvmlDeviceGetName(self):
            return "x"

    module = Module()
    tripwires = SetterTripwires()
    tripwires.install(module)
    assert module.nvmlDeviceGetName() == "x"
    with pytest.raises(AssertionError):
        module.nvmlDeviceClearAccountingPids()
    assert tripwires.calls == ["m.nvmlDeviceClearAccountingPids"]


def with_fp8(nvml: FakeNvml) -> dict[str, Loop]:
    """The loops and an fp8 product that caps lower: two classes, so the curve can be fitted."""
    fp8 = Loop(
        held(nvml, 699.0, 1260, POWER_CAP_REASON),
        "fp8",
        lambda n, s: 1.8 * n / s,
        KernelClass.GEMM_FP8,
        bursts(nvml, 930.0),
    )
    return {"gemm_bf16_8192": loops(nvml)["gemm_bf16_8192"], "gemm_fp8_8192": fp8, **loops(nvml)}


@pytest.mark.slow
def test_calibrate_writes_the_calibrated_spec_and_compares_every_value(tmp_path, monkeypatch, capsys):
    import json

    import torch

    from megatron_energy.cli import main
    from megatron_energy.dvfs import calibration_loops, calibration_nvml

    nvml = FakeNvml()
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda index: f"h{index}"
    monkeypatch.setattr(calibration_loops, "pynvml", nvml)  # NVML faked at its boundary
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(calibration_loops, "torch_loops", lambda copy_gib, top_mhz: with_fp8(nvml))

    def short(nvml_module, handle, loop_set, timing, progress):
        assert (timing.loop_s, timing.duty_s) == (6.0, 4.0)  # the command's defaults
        return calibration_nvml.run_calibration(
            nvml_module, handle, loop_set, TIMING, idle_on(nvml), progress
        )

    monkeypatch.setattr(calibration_loops, "run_calibration", short)
    out = tmp_path / "gpus" / "h200.calibrated.yaml"
    assert main(["calibrate", "--out", str(out), "--json", str(tmp_path / "c.json")]) == 0
    calibrated = load_gpu_spec(str(out))
    assert calibrated.idle_power_w == pytest.approx(118.0, rel=0.04)
    assert calibrated.sources["idle_power_w"].startswith("measured NVIDIA H200")
    assert set(calibrated.class_activity) == {KernelClass.GEMM_FP8}
    recorded = json.loads((tmp_path / "c.json").read_text())
    assert recorded["run"]["gpu_name"] == "NVIDIA H200"
    assert [w["name"] for w in recorded["fit"]["workloads"]] == ["gemm_bf16_8192", "gemm_fp8_8192"]
    printed = capsys.readouterr().out
    assert printed.startswith("gemm_bf16_8192 ")  # one line per loop as it ends
    assert "clocks measured, predictions modelled" in printed
    assert "shipped vs calibrated (h200.yaml -> h200.calibrated.yaml), per value:" in printed
    idle = next(line for line in printed.splitlines() if line.split()[:1] == ["idle_power_w"])
    assert idle.endswith("measured") and "shipped" in idle and "calibrated" in idle
    latency = next(line for line in printed.splitlines() if line.split()[:1] == ["switch_latency_s"])
    assert latency.endswith("carried") and "(same)" in latency
    assert printed.rstrip().endswith(f"use it with --energy-gpu-spec {out}")
    assert nvml.setter_calls == 0
    # the recorded run is fitted again without a GPU, to the same spec
    again = tmp_path / "again" / "h200.calibrated.yaml"
    assert main(["calibrate", "--from-json", str(tmp_path / "c.json"), "--out", str(again)]) == 0
    assert load_gpu_spec(str(again)) == calibrated
    assert main(["calibrate", "--loop-s", "1.5"]) == 2
    assert "--loop-s 1.5: give 2 to 20 s" in capsys.readouterr().out


def test_calibrate_on_a_machine_without_a_gpu_says_so_in_one_line(tmp_path, capsys):
    import torch

    from megatron_energy.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["calibrate", "--out", str(tmp_path / "x.yaml")]) == 2
    assert capsys.readouterr().out == (
        "megatron-energy calibrate: no CUDA GPU is visible to torch: calibrate measures a GPU, run it on a "
        "machine with one\n"
    )
    assert not (tmp_path / "x.yaml").exists()
