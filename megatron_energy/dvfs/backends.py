"""Open the GPUs a rank works with: real ones through zeus, or simulated ones, and decide what we may do.

:func:`open_gpus` returns a :class:`GpuHandle`: a zeus ``GPUs`` object (``zeus.device.get_gpus()`` for
NVIDIA through NVML or zeusd, AMD through amdsmi; :class:`~megatron_energy.dvfs.simulated.SimulatedGPUs`
otherwise) plus the mode the run is in:

- ``"control"``: clocks may be set;
- ``"dry-run"``: the controller records what it would set and calls no setter (asked for with
  ``--energy-dry-run``; nothing on the GPU is changed, not even to probe permissions);
- ``"monitor-only"``: clock control is unavailable (no permission, no usable GPU library, unsupported GPU);
  energy is still measured where a counter exists, clocks are left untouched.

Permission is judged without touching the GPU where possible: zeusd (``ZEUSD_SOCK_PATH`` /
``ZEUSD_HOST_PORT``) is only used by zeus when the daemon grants GPU control, and without zeusd the process
needs ``SYS_ADMIN`` (root usually has it). Only when those say yes and the run is not a dry run is the one
probe made: resetting the locked SM clock of the rank's own GPU, which is the state the run starts from
anyway. Before it, in control mode, the GPU's clock lease (:mod:`~megatron_energy.dvfs.lease`) is checked:
a lease left by a job that died has its clocks reset (one line on stderr says so); a lease of a job that
still runs makes this one monitor-only, leaving that job's clocks alone. zeus is imported lazily, inside the
functions.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from megatron_energy.config import Backend
from megatron_energy.dvfs.lease import repair_stale_lease
from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.errors import EnergyValueError

if TYPE_CHECKING:
    from zeus.device.gpu.common import GPUs

    from megatron_energy.dvfs.emulation import Emulation

logger = logging.getLogger(__name__)

Mode = Literal["control", "dry-run", "monitor-only"]

DEFAULT_SIMULATED_SPEC = "h200"
_ZEUSD_ENV = ("ZEUSD_SOCK_PATH", "ZEUSD_HOST_PORT")

PERMISSION_REMEDY = (
    "To let megatron_energy set clocks: run as root, or grant the process CAP_SYS_ADMIN, or run the zeus "
    "daemon (zeusd) with GPU control enabled and set ZEUSD_SOCK_PATH."
)
"""What gives a process permission to set clocks."""
REMEDIES = (
    f"{PERMISSION_REMEDY} To rehearse without changing clocks use --energy-dry-run; to run without a GPU use "
    "--energy-backend simulated."
)


class CudaWithoutNvmlError(EnergyValueError):
    """``--energy-backend auto`` where CUDA sees GPUs that zeus cannot open (a container without NVML)."""


def monitor_only_message(why: str) -> str:
    """Return the one message shown when clock control is unavailable: why, what happens, the remedies."""
    return (
        f"GPU clock control unavailable: {why}. Continuing in monitor-only mode (energy is measured where "
        f"the GPU has a counter; clocks are left untouched). {REMEDIES}"
    )


@dataclass(frozen=True)
class GpuHandle:
    """The GPUs a rank uses and what it may do with them.

    Attributes:
        gpus: zeus ``GPUs`` object (real, or :class:`~megatron_energy.dvfs.simulated.SimulatedGPUs`); may be
            empty (``len(gpus) == 0``) when no GPU library works.
        mode: ``"control"``, ``"dry-run"`` or ``"monitor-only"``.
        reason: Why this backend and mode (one sentence or the monitor-only message).
        backend: ``"zeus"`` or ``"simulated"``.
        spec: The GPU spec (always for simulated GPUs; for real GPUs when one matches the GPU's name).
        warning: What rank 0 must say loudly at start, or None: ``auto`` found no GPU and chose simulated
            ones, so every figure is modelled (which spec, and how to pin the backend).
    """

    gpus: GPUs
    mode: Mode
    reason: str
    backend: Literal["zeus", "simulated"]
    spec: GpuSpec | None
    warning: str | None = None

    @property
    def energy_source(self) -> Literal["measured", "modelled"]:
        """Where energy figures from these GPUs come from."""
        return "modelled" if self.backend == "simulated" else "measured"


def open_gpus(
    backend: Backend,
    spec_name: str | None,
    dry_run: bool,
    *,
    local_index: int | None = None,
    num_simulated_gpus: int | None = None,
    state_path: str | os.PathLike[str] | None = None,
    emulation: Emulation | None = None,
) -> GpuHandle:
    """Open real or simulated GPUs and decide the mode; never raises for a missing GPU or permission.

    Problems with real GPUs are logged once (a warning with the remedies) and also returned in
    ``GpuHandle.reason``.

    Args:
        backend: ``"zeus"`` (real GPUs), ``"simulated"``, or ``"auto"`` (real if any, else simulated).
        spec_name: GPU spec of the simulated GPUs (default ``"h200"``); for real GPUs, overrides the spec
            matched from the GPU's name.
        dry_run: Never change a clock (not even to probe permission); the controller only records.
        local_index: The GPU this rank controls (CUDA-visible index), the only one the permission probe
            touches; default ``$LOCAL_RANK`` (0 when unset or when fewer GPUs are visible).
        num_simulated_gpus: How many simulated GPUs; default ``$LOCAL_WORLD_SIZE`` or 1.
        state_path: State file of the simulated GPUs (see :mod:`~megatron_energy.dvfs.simulated`).
        emulation: How simulated GPUs depart from exact (counter noise, hidden energies, work between two
            schedules); exact when ``None``.

    ``auto`` without a GPU zeus can open runs on simulated GPUs and says so loudly (``GpuHandle.warning``),
    unless CUDA sees GPUs in this process: a GPU node whose container lacks NVML would otherwise log a
    model's figures as its own, so that is refused.

    Raises:
        ValueError: For an unknown backend or spec name.
        CudaWithoutNvmlError: ``auto`` where CUDA sees GPUs that zeus cannot open.
    """
    if backend not in ("auto", "zeus", "simulated"):
        raise ValueError(f"unknown GPU backend {backend!r}; use auto, zeus or simulated")
    if backend == "simulated":
        return _open_simulated(
            spec_name,
            dry_run,
            num_simulated_gpus,
            state_path,
            local_index,
            "--energy-backend simulated",
            emulation,
        )
    gpus, failure = open_zeus_gpus()
    if gpus is None or len(gpus) == 0:
        why = f"no GPU found ({failure or 'zeus sees no GPU'})"
        if backend == "auto":
            _refuse_cuda_without_nvml(why)
            handle = _open_simulated(
                spec_name, dry_run, num_simulated_gpus, state_path, local_index, f"auto: {why}", emulation
            )
            warning = auto_simulated_warning(
                why, load_gpu_spec(spec_name or DEFAULT_SIMULATED_SPEC), not spec_name
            )
            return replace(handle, warning=warning)
        return _monitor_only(_empty_gpus(), why, None)
    if local_index is None:
        local_index = _default_local_index(len(gpus))
    spec = load_gpu_spec(spec_name) if spec_name else _spec_for_name(gpus.get_name(0))
    if dry_run:
        note = f"; note: {failure}" if failure else ""
        return GpuHandle(
            gpus, "dry-run", f"dry run on {gpus.get_name(0)}: {_control_route(gpus)}{note}", "zeus", spec
        )
    if failure is not None:  # zeusd was configured but unusable; these GPUs are plain NVML ones
        return _monitor_only(gpus, failure, spec)
    refusal = _claim(gpus, local_index) or _why_no_control(gpus, local_index)
    if refusal is not None:
        return _monitor_only(gpus, refusal, spec)
    return GpuHandle(
        gpus, "control", f"clock control on {gpus.get_name(0)}: {_control_route(gpus)}", "zeus", spec
    )


def supported_sm_clocks_mhz(gpus: GPUs, index: int) -> list[int]:
    """Return GPU ``index``'s supported SM clocks at its highest memory clock. Units: MHz.

    zeus's ``get_supported_graphics_clocks`` defaults the memory clock to None, which real NVML rejects
    (``TypeError`` inside pynvml on an H200), so the memory clock is always passed.
    """
    memory_clock_mhz = max(gpus.get_supported_memory_clocks(index))
    return gpus.get_supported_graphics_clocks(index, memory_clock_mhz)


def _open_simulated(
    spec_name: str | None,
    dry_run: bool,
    num_gpus: int | None,
    state_path: str | os.PathLike[str] | None,
    local_index: int | None,
    why: str,
    emulation: Emulation | None = None,
) -> GpuHandle:
    from megatron_energy.dvfs.simulated import SimulatedGPUs

    spec = load_gpu_spec(spec_name or DEFAULT_SIMULATED_SPEC)
    if num_gpus is None:
        num_gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = SimulatedGPUs(spec, num_gpus=num_gpus, state_path=state_path, emulation=emulation)
    reason = f"simulated {spec.display_name} x{num_gpus} ({why}); all energy figures are modelled"
    if dry_run:
        return GpuHandle(gpus, "dry-run", reason, "simulated", spec)
    held = _claim(gpus, local_index if local_index is not None else _default_local_index(num_gpus))
    if held is not None:
        return GpuHandle(gpus, "monitor-only", monitor_only_message(held), "simulated", spec)
    return GpuHandle(gpus, "control", reason, "simulated", spec)


def auto_simulated_warning(why: str, spec: GpuSpec, default_spec: bool) -> str:
    """What ``auto`` says on finding no GPU: simulated GPUs of which spec, every figure modelled."""
    chosen = ", the default; --energy-gpu-spec NAME picks another" if default_spec else ""
    return (
        f"--energy-backend auto found no GPU ({why}): this run is on a simulated {spec.display_name} (GPU "
        f"spec {spec.name}{chosen}), and every "
        "energy and time figure it logs is modelled, not measured. Pin the backend: --energy-backend "
        "simulated to rehearse on the model, --energy-backend zeus to require real GPUs."
    )


def _refuse_cuda_without_nvml(why: str) -> None:
    """Raise where CUDA sees GPUs in this process although zeus opened none (``auto`` must not simulate).

    Only a process that imported torch is asked (a training rank); offline commands never are.

    Raises:
        CudaWithoutNvmlError: CUDA sees at least one GPU.
    """
    torch = sys.modules.get("torch")
    try:
        visible = 0 if torch is None else int(torch.cuda.device_count())
    except Exception:  # a broken CUDA install: no GPU to speak of
        visible = 0
    if visible:
        raise CudaWithoutNvmlError(
            f"--energy-backend auto: CUDA sees {visible} GPU(s) but zeus cannot open them ({why}); a "
            "simulated GPU would log a model's figures as this GPU's, so none stands in: make NVML reachable "
            "(the driver's libnvidia-ml.so.1 in the container, the nvidia-ml-py package), or pin "
            "--energy-backend simulated --energy-gpu-spec NAME to rehearse on the model"
        )


def _default_local_index(num_gpus: int) -> int:
    """``$LOCAL_RANK``, or 0 when unset or when fewer GPUs are visible (one visible GPU per process)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return local_rank if local_rank < num_gpus else 0


def _claim(gpus: GPUs, index: int) -> str | None:
    """Reset GPU ``index``'s clocks if a dead job's lease says it left them locked (and log it).

    Returns:
        Why this job must not control the GPU (another job that still runs holds it), or None.
    """
    usable, note = repair_stale_lease(gpus, index)
    if usable and note is not None:
        logger.warning(note)
    return None if usable else note


def open_zeus_gpus() -> tuple[GPUs | None, str | None]:
    """Return (zeus GPUs or None, a description of what failed or None).

    If zeusd is configured but unusable (unreachable, no GPU-control scope), the GPUs are opened again
    through plain NVML for monitoring and the zeusd problem is returned as the failure.
    """
    from zeus.device import get_gpus
    from zeus.device.gpu.nvidia import NVIDIAGPUs, nvml_is_available
    from zeus.exception import ZeusBaseError

    try:
        return get_gpus(), None
    except (ZeusBaseError, ImportError, OSError) as error:
        failure = f"{type(error).__name__}: {error}"
    zeusd_configured = any(name in os.environ for name in _ZEUSD_ENV)
    if not zeusd_configured or not nvml_is_available():
        return None, failure
    try:
        with _without_env(_ZEUSD_ENV):
            return NVIDIAGPUs(), f"zeusd is configured but unusable ({failure})"
    except ZeusBaseError as error:
        return None, f"{failure}; NVML without zeusd also failed: {error}"


def _why_no_control(gpus: GPUs, index: int) -> str | None:
    """Return why clocks cannot be set on GPU ``index``, or None if they can; probes once if it must."""
    from zeus.device.gpu.common import ZeusGPUNoPermissionError, ZeusGPUNotSupportedError
    from zeus.exception import ZeusBaseError

    refusal = permission_problem(gpus)
    if refusal is not None:
        return refusal
    try:
        gpus.reset_gpu_locked_clocks(index)
    except ZeusGPUNoPermissionError as error:
        return f"GPU {index} refused the clock reset probe: no permission ({error})"
    except ZeusGPUNotSupportedError as error:
        return f"GPU {index} ({gpus.get_name(index)}) does not support locked clocks ({error})"
    except ZeusBaseError as error:
        return f"the clock reset probe on GPU {index} failed: {type(error).__name__}: {error}"
    return None


def permission_problem(gpus: GPUs) -> str | None:
    """Why this process may not set the clocks of ``gpus``, judged without touching them; None if it may try.

    zeusd grants clock control to whoever reaches it; without zeusd the process needs ``SYS_ADMIN``.
    """
    from zeus.device.common import has_sys_admin

    if not _uses_zeusd(gpus) and not has_sys_admin():
        return "this process has no SYS_ADMIN capability and zeusd is not configured (ZEUSD_SOCK_PATH unset)"
    return None


def _uses_zeusd(gpus: GPUs) -> bool:
    from zeus.device.gpu.nvidia import ZeusdNVIDIAGPU

    return any(isinstance(gpu, ZeusdNVIDIAGPU) for gpu in gpus.gpus)


def _control_route(gpus: GPUs) -> str:
    from zeus.device.common import has_sys_admin

    if _uses_zeusd(gpus):
        endpoint = os.environ.get("ZEUSD_SOCK_PATH") or os.environ.get("ZEUSD_HOST_PORT")
        return f"clock setters go through zeusd at {endpoint}"
    capability = "has" if has_sys_admin() else "lacks"
    return f"clock setters go to the vendor library directly (this process {capability} SYS_ADMIN)"


def _monitor_only(gpus: GPUs, why: str, spec: GpuSpec | None) -> GpuHandle:
    message = monitor_only_message(why)
    logger.warning(message)
    return GpuHandle(gpus, "monitor-only", message, "zeus", spec)


def _empty_gpus() -> GPUs:
    from zeus.device.gpu.common import EmptyGPUs

    return EmptyGPUs()


def _spec_for_name(gpu_name: str) -> GpuSpec | None:
    """Return the spec whose name appears in the GPU's reported name (e.g. ``"NVIDIA H200"`` -> h200)."""
    from megatron_energy.dvfs.spec import available_gpu_specs

    reported = gpu_name.lower().replace(" ", "-")
    try:
        matches = [name for name in available_gpu_specs() if name.split("-")[0] in reported]
        if "80gb" in reported:
            matches = [name for name in matches if "40gb" not in name] or matches
        return load_gpu_spec(matches[0]) if matches else None
    except (FileNotFoundError, ValueError) as error:  # no configs installed: run without a spec
        logger.info("no GPU spec for %s: %s", gpu_name, error)
        return None


@contextlib.contextmanager
def _without_env(names: tuple[str, ...]) -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)
