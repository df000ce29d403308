"""What a killed job left on this machine's GPUs, and its reset (the ``megatron-energy clocks`` command).

**Leases** (:mod:`~megatron_energy.dvfs.lease`): every lease file in the run directory, typed
(:class:`Lease`): the GPU, the clocks locked, each owner process and whether it still runs. A lease is
*stale* when it was written on this host and none of its owners runs: the job died and its clock guard and
watchdog (:mod:`~megatron_energy.dvfs.guard`) could not reset. **Clocks** (:func:`read_gpu_clocks`): each
GPU's SM and memory clocks now against their maxima, read-only: NVML through zeus's handle on real GPUs
(``measured``), the state file of a simulated GPU's lease (``modelled``).

**Reset** (:func:`reset_leftovers`) goes the way the plugin's own repair goes, and only there:

- a stale lease of a real GPU: :func:`~megatron_energy.dvfs.lease.repair_stale_lease`, the call the next start
  of the plugin on that GPU makes (the guard's zeus reset of the SM clock, and the memory clock where one was
  locked; the lease is then removed). Refused first, touching nothing, when this process may not set clocks
  (:func:`~megatron_energy.dvfs.backends.permission_problem`: no ``SYS_ADMIN`` and no zeusd), as the plugin
  refuses;
- a stale lease of a simulated GPU: the watchdog's reset of its state file
  (:func:`~megatron_energy.dvfs.simulated_state.reset_state_file`), then the lease is removed;
- a stale lease of a real GPU on a machine where no GPU library works (a CPU node sharing the run directory):
  only the file is removed; there is no clock here to reset;
- a lease whose owner still runs, or written on another host, is never touched.

Without ``apply`` nothing changes: each :class:`ResetAction` says what would be done.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from megatron_energy.dvfs.backends import PERMISSION_REMEDY, open_zeus_gpus, permission_problem
from megatron_energy.dvfs.lease import OwnerProcess, lease_path, read_lease, repair_stale_lease
from megatron_energy.dvfs.simulated_state import read_state, reset_state_file
from megatron_energy.stats import Source

if TYPE_CHECKING:
    from zeus.device.gpu.common import GPUs


@dataclass(frozen=True)
class LeaseOwner:
    """A process a lease names."""

    role: str
    """``trainer`` or ``watchdog``."""
    pid: int
    """Its pid."""
    alive: bool
    """Whether that very process still runs (a reused pid does not count)."""


@dataclass(frozen=True)
class Lease:
    """One lease file, as :func:`~megatron_energy.dvfs.lease.write_lease` wrote it."""

    path: Path
    """The file."""
    backend: str
    """``zeus`` (a real GPU) or ``simulated``."""
    index: int
    """The GPU's index in its owner's process."""
    gpu: str
    """What names the GPU: its name and UUID, or a simulated GPU's state file."""
    state_path: Path | None
    """A simulated GPU's state file; ``None`` for a real GPU."""
    locked_clock_mhz: int | None
    """The SM clock its owner locked first."""
    locked_memory_clock_mhz: int | None
    """The memory clock its owner locked, if any."""
    host: str
    """The host it was written on."""
    locked_at: str
    """When (ISO 8601, UTC)."""
    owners: tuple[LeaseOwner, ...]
    """The processes that own it."""

    @property
    def on_this_host(self) -> bool:
        """Whether it was written on this host (only then can its owners be checked)."""
        return self.host == socket.gethostname()

    @property
    def stale(self) -> bool:
        """Written here and no owner runs: the job died with its clocks locked."""
        return self.on_this_host and not any(owner.alive for owner in self.owners)

    def describe(self) -> str:
        """``trainer 123 (dead), watchdog 124 (dead) on host-a, SM clock locked at 1200 MHz at <time>``."""
        owners = ", ".join(f"{o.role} {o.pid} ({'running' if o.alive else 'dead'})" for o in self.owners)
        memory = (
            f", memory clock at {self.locked_memory_clock_mhz} MHz"
            if self.locked_memory_clock_mhz is not None
            else ""
        )
        locked = f"SM clock locked at {self.locked_clock_mhz} MHz{memory} at {self.locked_at}"
        return f"{owners} on {self.host}, {locked}"


def read_leases(folder: Path) -> tuple[list[Lease], list[Path]]:
    """Every lease in ``folder``, and the lease files that could not be read (left alone)."""
    leases, unreadable = [], []
    for path in sorted(folder.glob("gpu-*.json")) if folder.is_dir() else []:
        data = read_lease(path)
        try:
            leases.append(_lease(path, data))
        except (TypeError, KeyError, ValueError):
            unreadable.append(path)
    return leases, unreadable


def _lease(path: Path, data: dict[str, Any] | None) -> Lease:
    """The typed lease of ``data`` (as read from ``path``)."""
    if data is None:
        raise ValueError(f"{path} is not a lease")
    gpu = data["gpu"]
    state = gpu.get("state_path")
    name = state if state is not None else " ".join(str(gpu[key]) for key in ("name", "uuid") if key in gpu)
    return Lease(
        path=path,
        backend=str(gpu["backend"]),
        index=int(gpu["index"]),
        gpu=name,
        state_path=None if state is None else Path(state),
        locked_clock_mhz=data.get("locked_clock_mhz"),
        locked_memory_clock_mhz=data.get("locked_memory_clock_mhz"),
        host=str(data.get("host", "")),
        locked_at=str(data.get("locked_at", "")),
        owners=tuple(
            LeaseOwner(
                role, int(owner["pid"]), OwnerProcess(int(owner["pid"]), owner.get("start_ticks")).is_alive()
            )
            for role, owner in data["owners"].items()
        ),
    )


@dataclass(frozen=True)
class GpuClocks:
    """One GPU's clocks now, against their maxima."""

    index: int
    """The GPU's index (this process's, or the simulated GPU's in its state file)."""
    name: str
    """Its name (a simulated GPU: its state file)."""
    sm_mhz: int | None
    """The SM clock now (``None``: not readable)."""
    max_sm_mhz: int | None
    """The highest SM clock."""
    memory_mhz: int | None
    """The memory clock now."""
    max_memory_mhz: int | None
    """The highest memory clock."""
    locked_sm_mhz: int | None
    """The locked SM clock where the backend tells it (simulated GPUs); ``None``: not locked, or unknown."""
    source: Source
    """``measured`` (NVML) or ``modelled`` (a simulated GPU's state)."""


@dataclass(frozen=True)
class MachineGpus:
    """This machine's real GPUs as zeus opens them, for reading and resetting."""

    gpus: GPUs | None
    """The GPUs; ``None`` where no GPU library works (or it sees no GPU)."""
    why_none: str
    """Why there are none (empty when there are)."""

    @classmethod
    def open(cls) -> MachineGpus:
        """Open them (nothing is set: zeus only opens its library and reads)."""
        gpus, failure = open_zeus_gpus()
        if gpus is None or len(gpus) == 0:
            return cls(None, failure or "zeus sees no GPU")
        return cls(gpus, "")


def read_gpu_clocks(gpus: GPUs) -> list[GpuClocks]:
    """The clocks of every real GPU in ``gpus``, read through NVML on zeus's handles; nothing is set."""
    import pynvml

    clocks = []
    for index in range(len(gpus)):
        handle = getattr(gpus.gpus[index], "handle", None)

        def read(call: str, kind: int, handle: Any = handle) -> int | None:
            try:
                return int(getattr(pynvml, call)(handle, kind))
            except Exception:  # not readable on this GPU or driver: shown as unknown
                return None

        clocks.append(
            GpuClocks(
                index=index,
                name=str(gpus.get_name(index)),
                sm_mhz=read("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM),
                max_sm_mhz=read("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM),
                memory_mhz=read("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_MEM),
                max_memory_mhz=read("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_MEM),
                locked_sm_mhz=None,
                source="measured",
            )
        )
    return clocks


def simulated_clocks(lease: Lease) -> GpuClocks | None:
    """A simulated GPU's clocks from its lease's state file; ``None`` when the file is gone or unreadable."""
    if lease.state_path is None:
        return None
    try:
        state = read_state(lease.state_path)
        gpu = next(gpu for gpu in state["gpus"] if gpu["index"] == lease.index)
    except (OSError, ValueError, KeyError, StopIteration):
        return None
    default = int(state["default_sm_clock_mhz"])
    return GpuClocks(
        index=lease.index,
        name=str(lease.state_path),
        sm_mhz=int(gpu["sm_clock_mhz"]),
        max_sm_mhz=default,
        memory_mhz=gpu.get("memory_clock_mhz"),
        max_memory_mhz=None,
        locked_sm_mhz=gpu.get("locked_sm_clock_mhz"),
        source="modelled",
    )


Outcome = Literal["would reset", "reset", "failed", "left alone", "would remove", "removed"]


@dataclass(frozen=True)
class ResetAction:
    """What the reset did, or would do, about one lease."""

    lease: Lease
    """The lease."""
    outcome: Outcome
    """What became of it."""
    detail: str
    """Why, in words."""

    def line(self) -> str:
        """One line for the command's output."""
        return (
            f"{self.outcome}: {self.lease.backend} GPU {self.lease.index} ({self.lease.gpu}): {self.detail}"
        )


def reset_leftovers(
    leases: list[Lease], gpus: GPUs | None, apply: bool, lease_dir: Path | None = None
) -> list[ResetAction]:
    """Reset what each stale lease says a dead job left locked (see the module docstring).

    Args:
        leases: The run directory's leases (:func:`read_leases`).
        gpus: This machine's real GPUs, opened through zeus; ``None`` where no GPU library works.
        apply: Act; without it, only say what would be done.
        lease_dir: The run directory the leases are in (default :func:`~megatron_energy.dvfs.lease.run_dir`).

    Returns:
        One action per lease, in the leases' order.
    """
    paths = {} if gpus is None else {lease_path(gpus, index, lease_dir): index for index in range(len(gpus))}
    refusal = None if gpus is None or not apply else permission_problem(gpus)
    return [_reset(lease, gpus, paths.get(lease.path), apply, lease_dir, refusal) for lease in leases]


def _reset(
    lease: Lease,
    gpus: GPUs | None,
    index: int | None,
    apply: bool,
    lease_dir: Path | None,
    refusal: str | None,
) -> ResetAction:
    """The action for one lease; ``refusal``: why this process may not set real GPUs' clocks, if so."""
    if not lease.on_this_host:
        return ResetAction(lease, "left alone", f"written on {lease.host}; its owners cannot be checked here")
    if not lease.stale:
        return ResetAction(lease, "left alone", f"its job still runs ({lease.describe()})")
    if lease.backend == "simulated":
        if not apply:
            return ResetAction(lease, "would reset", f"a dead job's clocks ({lease.describe()})")
        try:
            if lease.state_path is not None and lease.state_path.exists():
                reset_state_file(lease.state_path, [lease.index])
            lease.path.unlink(missing_ok=True)
        except (OSError, ValueError, KeyError) as error:
            return ResetAction(lease, "failed", f"{error}")
        return ResetAction(lease, "reset", f"to the default clocks; lease removed ({lease.describe()})")
    if gpus is None:
        outcome: Outcome = "removed" if apply else "would remove"
        if apply:
            lease.path.unlink(missing_ok=True)
        return ResetAction(
            lease, outcome, f"the stale lease; no GPU is visible here to reset ({lease.describe()})"
        )
    if index is None:
        return ResetAction(
            lease,
            "left alone",
            f"its GPU is not visible to this process (CUDA_VISIBLE_DEVICES?) ({lease.describe()})",
        )
    if not apply:
        return ResetAction(
            lease, "would reset", f"GPU {index}'s clocks, left by a dead job ({lease.describe()})"
        )
    if refusal is not None:
        return ResetAction(lease, "failed", f"not reset: {refusal}. {PERMISSION_REMEDY}")
    usable, message = repair_stale_lease(gpus, index, lease_dir)
    return ResetAction(lease, "reset" if usable else "failed", message or "nothing was locked")
