"""open_gpus and the permission paths, with NVML mocked at its boundary (the pynvml functions zeus calls)."""

import logging
import os
import sys

import pytest
import zeus.device.common
import zeus.device.gpu
import zeus.device.gpu.nvidia
from zeus.device.gpu.nvidia import pynvml

from megatron_energy.dvfs.backends import CudaWithoutNvmlError, open_gpus
from megatron_energy.dvfs.controller import FrequencyController
from megatron_energy.dvfs.simulated import SimulatedGPUs
from megatron_energy.runtime.assembly import handle_lines

H200_CLOCKS = list(range(1980, 344, -15))
REMEDY_WORDS = (
    "root",
    "SYS_ADMIN",
    "zeusd",
    "ZEUSD_SOCK_PATH",
    "--energy-dry-run",
    "--energy-backend simulated",
)


class FakeNvml:
    """The NVML calls zeus makes for one H200; setters raise NO_PERMISSION unless told otherwise."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.setters_allowed = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        answers = {
            "nvmlInit": None,
            "nvmlShutdown": None,
            "nvmlDeviceGetCount": 1,
            "nvmlDeviceGetHandleByIndex": "handle-0",
            "nvmlDeviceGetName": "NVIDIA H200",
            "nvmlDeviceGetSupportedMemoryClocks": [3201, 2201],
            "nvmlDeviceGetArchitecture": pynvml.NVML_DEVICE_ARCH_HOPPER,
            "nvmlDeviceGetTotalEnergyConsumption": 123_456,
        }
        for name, answer in answers.items():
            monkeypatch.setattr(pynvml, name, self._answer(name, answer))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetC2cModeInfoV", self._fail(pynvml.NVML_ERROR_NOT_SUPPORTED))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedGraphicsClocks", self._graphics_clocks)
        for name in (
            "nvmlDeviceSetGpuLockedClocks",
            "nvmlDeviceResetGpuLockedClocks",
            "nvmlDeviceSetPowerManagementLimit",
            "nvmlDeviceSetMemoryLockedClocks",
            "nvmlDeviceResetMemoryLockedClocks",
        ):
            monkeypatch.setattr(pynvml, name, self._setter(name))

    def setter_calls(self) -> list[str]:
        return [call for call in self.calls if "Set" in call or "Reset" in call]

    def _answer(self, name, answer):
        def call(*args):
            self.calls.append(name)
            return answer

        return call

    @staticmethod
    def _graphics_clocks(handle, memory_clock_mhz):
        if memory_clock_mhz is None:  # real pynvml: c_uint(None) raises
            raise TypeError("'NoneType' object cannot be interpreted as an integer")
        return H200_CLOCKS

    def _fail(self, code):
        def call(*args):
            raise pynvml.NVMLError(code)

        return call

    def _setter(self, name):
        def call(*args):
            self.calls.append(name)
            if not self.setters_allowed:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

        return call


@pytest.fixture(autouse=True)
def fresh_zeus(monkeypatch):
    """No cached GPU singleton or NVML probe between tests; no zeusd or device filter from the environment."""
    for name in (
        "ZEUSD_SOCK_PATH",
        "ZEUSD_HOST_PORT",
        "CUDA_VISIBLE_DEVICES",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(zeus.device.gpu, "_gpus", None)
    zeus.device.gpu.nvidia.nvml_is_available.cache_clear()
    yield
    zeus.device.gpu.nvidia.nvml_is_available.cache_clear()


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml()
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def sys_admin(monkeypatch):
    def set_capability(has: bool) -> None:
        monkeypatch.setattr(zeus.device.common, "has_sys_admin", lambda: has)

    return set_capability


@pytest.fixture
def no_gpu_library(monkeypatch):
    monkeypatch.setattr(zeus.device.gpu, "nvml_is_available", lambda: False)
    monkeypatch.setattr(zeus.device.gpu, "amdsmi_is_available", lambda: False)


def assert_names_remedies(text):
    for word in REMEDY_WORDS:
        assert word in text


def test_auto_without_gpu_falls_back_to_simulated_and_says_so_loudly(no_gpu_library, tmp_path):
    handle = open_gpus("auto", None, dry_run=False, state_path=tmp_path / "s.json")
    assert isinstance(handle.gpus, SimulatedGPUs)
    assert (handle.backend, handle.mode, handle.energy_source) == ("simulated", "control", "modelled")
    assert "no GPU found" in handle.reason
    assert handle.spec.name == "h200"
    warning = handle.warning
    assert (
        warning is not None and "simulated NVIDIA H200" in warning and "GPU spec h200, the default" in warning
    )
    assert "every energy and time figure it logs is modelled, not measured" in warning
    assert "--energy-backend simulated" in warning and "--energy-backend zeus" in warning
    lines = handle_lines(handle, 0)
    assert lines[1] == f"[energy] WARNING: {warning}" and handle_lines(handle, 1) == []
    pinned = open_gpus("auto", "h100-sxm", dry_run=False, state_path=tmp_path / "t.json").warning
    assert pinned is not None and "(GPU spec h100-sxm)" in pinned
    assert open_gpus("simulated", None, dry_run=False, state_path=tmp_path / "u.json").warning is None


def test_auto_refuses_to_simulate_where_cuda_sees_gpus_nvml_cannot_open(no_gpu_library, monkeypatch):
    class Cuda:
        @staticmethod
        def device_count() -> int:
            return 8

    class Torch:
        cuda = Cuda

    monkeypatch.setitem(sys.modules, "torch", Torch)
    with pytest.raises(CudaWithoutNvmlError) as refusal:
        open_gpus("auto", None, dry_run=False)
    message = str(refusal.value)
    assert "CUDA sees 8 GPU(s) but zeus cannot open them" in message and "\n" not in message
    assert "libnvidia-ml.so.1" in message and "--energy-backend simulated --energy-gpu-spec NAME" in message


def test_simulated_backend_honours_spec_and_dry_run(tmp_path):
    handle = open_gpus(
        "simulated", "a100-sxm-80gb", dry_run=True, num_simulated_gpus=2, state_path=tmp_path / "s"
    )
    assert handle.mode == "dry-run"
    assert len(handle.gpus) == 2
    assert handle.spec.name == "a100-sxm-80gb"


def test_zeus_backend_without_gpu_is_monitor_only_not_a_crash(no_gpu_library, caplog):
    with caplog.at_level(logging.WARNING):
        handle = open_gpus("zeus", None, dry_run=False)
    assert handle.mode == "monitor-only"
    assert len(handle.gpus) == 0
    assert_names_remedies(handle.reason)


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="unknown GPU backend"):
        open_gpus("cuda", None, dry_run=False)


def test_no_permission_probe_turns_monitor_only_with_one_message(nvml, sys_admin, caplog):
    sys_admin(True)
    with caplog.at_level(logging.WARNING):
        handle = open_gpus("auto", None, dry_run=False)
    assert handle.backend == "zeus"
    assert handle.mode == "monitor-only"
    assert nvml.setter_calls() == ["nvmlDeviceResetGpuLockedClocks"]  # the single probe, on our GPU only
    assert "no permission" in handle.reason
    assert_names_remedies(handle.reason)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert handle.gpus.get_total_energy_consumption(0) == 123_456  # energy still measured
    assert handle.energy_source == "measured"
    assert handle.spec.name == "h200"  # matched from "NVIDIA H200"


def test_without_sys_admin_nothing_is_tried(nvml, sys_admin):
    sys_admin(False)
    handle = open_gpus("zeus", None, dry_run=False)
    assert handle.mode == "monitor-only"
    assert "SYS_ADMIN" in handle.reason
    assert nvml.setter_calls() == []


def test_dry_run_never_calls_a_setter_even_to_probe(nvml, sys_admin):
    sys_admin(True)
    handle = open_gpus("zeus", None, dry_run=True)
    assert handle.mode == "dry-run"
    controller = FrequencyController.from_handle(handle, 0)
    controller.request(1200)
    assert controller.flush(5)
    controller.close()
    assert [r.clock_mhz for r in controller.switch_records()] == [1200]
    assert nvml.setter_calls() == []


def test_permitted_probe_gives_control(nvml, sys_admin):
    sys_admin(True)
    nvml.setters_allowed = True
    handle = open_gpus("zeus", None, dry_run=False)
    assert handle.mode == "control"
    assert nvml.setter_calls() == ["nvmlDeviceResetGpuLockedClocks"]


def test_setter_refused_later_turns_controller_monitor_only_with_one_warning(nvml, sys_admin, caplog):
    sys_admin(True)
    nvml.setters_allowed = True
    handle = open_gpus("zeus", None, dry_run=False)
    nvml.setters_allowed = False  # e.g. permission withdrawn after the probe
    controller = FrequencyController.from_handle(handle, 0)
    with caplog.at_level(logging.WARNING):
        controller.request(1200)
        assert controller.flush(5)
        assert not controller.request(1500)
    controller.close(reset_clocks=False)
    assert not controller.active
    assert controller.switch_records() == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert_names_remedies(warnings[0])
    assert nvml.setter_calls().count("nvmlDeviceSetGpuLockedClocks") == 1


def test_unreachable_zeusd_falls_back_to_nvml_monitoring(nvml, sys_admin, monkeypatch, tmp_path):
    sys_admin(False)
    monkeypatch.setenv("ZEUSD_SOCK_PATH", str(tmp_path / "no-daemon.sock"))
    handle = open_gpus("zeus", None, dry_run=False)
    assert handle.mode == "monitor-only"
    assert "zeusd is configured but unusable" in handle.reason
    assert handle.gpus.get_total_energy_consumption(0) == 123_456
    assert nvml.setter_calls() == []
    assert os.environ["ZEUSD_SOCK_PATH"] == str(tmp_path / "no-daemon.sock")  # environment restored
