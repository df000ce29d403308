"""The calibration's measuring side without a GPU: a stand-in NVML module at the boundary, real threads."""
# ruff: noqa: N802  (the stand-in has NVML's function names)

import math
import threading
import time

import pytest

from megatron_energy.dvfs.calibration import calibrate_spec, comparison_lines
from megatron_energy.dvfs.calibration_nvml import Loop, SetterTripwires, run_calibration
from megatron_energy.dvfs.spec import load_gpu_spec

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
        self.setter_calls = 0

    def set(self, power_w: float, clock_mhz: int) -> None:
        with self._lock:
            self._changes.append((time.perf_counter() - self._origin, power_w))
            self.clock_mhz = clock_mhz

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


def held(nvml: FakeNvml, power_w: float, clock_mhz: int):
    def run(seconds: float) -> tuple[float, int]:
        nvml.set(power_w, clock_mhz)
        time.sleep(seconds)
        return seconds, 100

    return run


def loops(nvml: FakeNvml) -> dict[str, Loop]:
    return {
        "compute": Loop(held(nvml, 690.0, 1500), "matmul", lambda n, s: n / s),
        "memory": Loop(held(nvml, 574.0, 1980), "copy"),
        "blocked": Loop(held(nvml, 140.0, 1980), "spin"),
    }


def idle_on(nvml: FakeNvml):
    def idle(seconds: float) -> None:
        nvml.set(118.0, 1980)
        time.sleep(seconds)

    return idle


def test_each_loop_reads_its_power_clock_and_the_counter_period():
    nvml = FakeNvml()
    run = run_calibration(nvml, "h0", loops(nvml), loop_s=0.6, poll_s=0.002, ramp_s=0.1, idle=idle_on(nvml))
    assert run.compute.power_w == pytest.approx(690.0, rel=0.04)
    assert run.memory.power_w == pytest.approx(574.0, rel=0.04)
    assert run.blocked.power_w == pytest.approx(140.0, rel=0.04)
    assert run.idle.power_w == pytest.approx(118.0, rel=0.04)
    assert run.compute.median_sm_clock_mhz == 1500  # the clock the GPU chose under the cap
    assert run.compute.rate == pytest.approx(100 / 0.6)
    assert run.counter_period_s == pytest.approx(PERIOD_S, rel=0.25)
    assert run.gpu_name == "NVIDIA H200" and run.power_limit_w == 700.0
    assert run.supported_sm_clocks_mhz[0] == 1980 and run.supported_memory_clocks_mhz == (3201, 2201)
    assert nvml.setter_calls == 0
    # the spec it makes says per value what was measured and what was carried
    shipped = load_gpu_spec("h200")
    spec = calibrate_spec(shipped, run, name="h200.calibrated")
    lines = comparison_lines(shipped, spec)
    assert lines[0].startswith("shipped vs calibrated")
    idle = next(line for line in lines if line.split()[0] == "idle_power_w")
    assert idle.endswith("measured") and "shipped" in idle and "calibrated" in idle
    latency = next(line for line in lines if line.split()[0] == "switch_latency_s")
    assert latency.endswith("carried") and "(same)" in latency


def test_a_setter_reached_stops_the_run_before_it_acts():
    nvml = FakeNvml()
    sneaky = loops(nvml)

    def clock_setting_loop(seconds: float) -> tuple[float, int]:
        nvml.nvmlDeviceSetGpuLockedClocks("h0", 1005, 1005)
        return seconds, 1

    sneaky["memory"] = Loop(clock_setting_loop, "sets a clock")
    with pytest.raises(AssertionError, match=r"fake_pynvml\.nvmlDeviceSetGpuLockedClocks"):
        run_calibration(nvml, "h0", sneaky, loop_s=0.3, poll_s=0.002, ramp_s=0.05, idle=idle_on(nvml))
    assert nvml.setter_calls == 0  # the real setter never ran


def test_a_loop_too_short_for_the_counter_is_refused():
    nvml = FakeNvml()
    with pytest.raises(ValueError, match=r"fewer than twice|no NVML sample"):
        run_calibration(nvml, "h0", loops(nvml), loop_s=0.03, poll_s=0.002, ramp_s=0.0, idle=idle_on(nvml))


def test_missing_loops_are_named():
    nvml = FakeNvml()
    with pytest.raises(ValueError, match="blocked"):
        run_calibration(nvml, "h0", {k: v for k, v in loops(nvml).items() if k != "blocked"}, loop_s=1.0)


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
    monkeypatch.setattr(calibration_loops, "torch_loops", lambda copy_gib, top_mhz: loops(nvml))

    def short(nvml_module, handle, loop_set, loop_s, poll_s):
        assert loop_s == 3.0  # the command's default: 4 loops of 3 s fit its ~60 s
        return calibration_nvml.run_calibration(
            nvml_module, handle, loop_set, 0.4, poll_s=0.002, ramp_s=0.05, idle=idle_on(nvml)
        )

    monkeypatch.setattr(calibration_loops, "run_calibration", short)
    out = tmp_path / "gpus" / "h200.calibrated.yaml"
    assert main(["calibrate", "--out", str(out), "--json", str(tmp_path / "c.json")]) == 0
    calibrated = load_gpu_spec(str(out))
    assert calibrated.idle_power_w == pytest.approx(118.0, rel=0.04)
    assert calibrated.sources["idle_power_w"].startswith("measured NVIDIA H200")
    assert json.loads((tmp_path / "c.json").read_text())["run"]["gpu_name"] == "NVIDIA H200"
    printed = capsys.readouterr().out
    assert "shipped vs calibrated (h200.yaml -> h200.calibrated.yaml), per value:" in printed
    assert printed.rstrip().endswith(f"use it with --energy-gpu-spec {out}")
    assert nvml.setter_calls == 0
    assert main(["calibrate", "--loop-s", "1.5"]) == 2
    assert "--loop-s 1.5: give 2 to 10 s" in capsys.readouterr().out


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
