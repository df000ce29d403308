"""Clock leases: a file per GPU, in a machine-wide run directory, saying who locked its clocks.

:class:`~megatron_energy.dvfs.guard.ClockGuard` writes a lease (atomically) when it first arms a GPU: the
GPU's identity (index, and UUID and name for a real GPU; the state file for a simulated one), the clock
locked, the trainer's and its watchdog's pids with their start times (``/proc/<pid>/stat`` field 22, so a
reused pid is not mistaken for the owner) and the host name. The guard removes it after a normal reset, the
watchdog after resetting for a dead trainer. A lease left behind means both died (e.g. both SIGKILLed): the
next start of the suite on that GPU in control mode calls :func:`repair_stale_lease`, which resets the GPU's
locked clocks through the same zeus call the guard uses and says which job left them locked. A lease whose
owner still runs is left alone: another job holds the GPU.

The run directory is ``$MEGATRON_ENERGY_RUN_DIR`` if set, else ``/run/megatron_energy`` if writable, else
``$XDG_RUNTIME_DIR/megatron_energy``, else ``/tmp/megatron_energy-<uid>``. A reboot may clear it (tmpfs),
which is fine: a reboot clears the clock locks too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron_energy.atomic import write_atomically

if TYPE_CHECKING:
    from zeus.device.gpu.common import GPUs

logger = logging.getLogger(__name__)

RUN_DIR_ENV = "MEGATRON_ENERGY_RUN_DIR"
LEASE_SCHEMA_VERSION = 1


def run_dir() -> Path:
    """The machine-wide folder holding the leases (created if missing); see the module docstring."""
    override = os.environ.get(RUN_DIR_ENV)
    if override:
        return Path(override)
    candidates = [Path("/run/megatron_energy")]
    if os.environ.get("XDG_RUNTIME_DIR"):
        candidates.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "megatron_energy")
    for candidate in candidates:
        try:
            candidate.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return Path(tempfile.gettempdir()) / f"megatron_energy-{os.getuid()}"


@dataclass(frozen=True)
class OwnerProcess:
    """A process that owns a lease: its pid and its start time (clock ticks since boot; None if unknown)."""

    pid: int
    start_ticks: int | None

    @classmethod
    def of(cls, pid: int) -> OwnerProcess:
        """The process ``pid`` as it runs now."""
        return cls(pid, process_start_ticks(pid))

    def is_alive(self) -> bool:
        """Whether this very process still runs (a reused pid with another start time, a zombie: no)."""
        if self.start_ticks is None:  # no /proc when the lease was written: the pid is all there is
            return _pid_exists(self.pid)
        return process_start_ticks(self.pid) == self.start_ticks and not _is_zombie(self.pid)


def process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` from ``/proc/<pid>/stat`` field 22 (clock ticks after boot); None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # field 3 on, after the command name in parentheses
    return int(fields[22 - 3])


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only (PermissionError: exists, another user's)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].startswith("Z")


def gpu_identity(gpus: GPUs, index: int) -> dict[str, Any]:
    """What names GPU ``index`` across processes: the state file of simulated GPUs, else UUID and name."""
    state_path = getattr(gpus, "state_path", None)
    if state_path is not None:
        return {"backend": "simulated", "index": index, "state_path": str(Path(state_path).resolve())}
    identity: dict[str, Any] = {"backend": "zeus", "index": index, "name": str(gpus.get_name(index))}
    uuid = _nvml_uuid(gpus, index)
    if uuid is not None:
        identity["uuid"] = uuid
    return identity


def _nvml_uuid(gpus: GPUs, index: int) -> str | None:
    """The NVIDIA GPU's UUID (stable whatever ``CUDA_VISIBLE_DEVICES`` says), or None where not available."""
    handle = getattr(gpus.gpus[index], "handle", None)
    if handle is None:
        return None
    try:
        import pynvml

        uuid = pynvml.nvmlDeviceGetUUID(handle)
    except Exception as error:  # no NVML, an AMD GPU: the index and name identify it
        logger.info("no UUID for GPU %d: %s", index, error)
        return None
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


def lease_path(gpus: GPUs, index: int, folder: Path | None = None) -> Path:
    """The lease file of GPU ``index`` in ``folder`` (default :func:`run_dir`)."""
    identity = gpu_identity(gpus, index)
    key = identity.get("uuid") or f"{identity.get('state_path') or identity['name']}#{index}"
    digest = hashlib.sha256(str(key).encode()).hexdigest()[:16]
    return (folder if folder is not None else run_dir()) / f"gpu-{digest}.json"


def write_lease(
    path: Path,
    gpus: GPUs,
    index: int,
    clock_mhz: int | None,
    watchdog_pid: int | None,
    memory_clock_mhz: int | None = None,
) -> None:
    """Record that this process (and its watchdog) locked GPU ``index``'s clocks at ``clock_mhz``.

    ``memory_clock_mhz``: the memory clock it locked too (``None``: none), so a repair resets that as well.
    """
    owners = {"trainer": OwnerProcess.of(os.getpid())}
    if watchdog_pid is not None:
        owners["watchdog"] = OwnerProcess.of(watchdog_pid)
    lease = {
        "schema_version": LEASE_SCHEMA_VERSION,
        "gpu": gpu_identity(gpus, index),
        "locked_clock_mhz": clock_mhz,
        **({"locked_memory_clock_mhz": memory_clock_mhz} if memory_clock_mhz is not None else {}),
        "host": socket.gethostname(),
        "owners": {role: {"pid": p.pid, "start_ticks": p.start_ticks} for role, p in owners.items()},
        "locked_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    write_atomically(path, json.dumps(lease, indent=2))


def remove_lease(path: Path, trainer_pid: int) -> None:
    """Remove the lease at ``path`` if the trainer ``trainer_pid`` owns it (a newer job's lease stays)."""
    lease = read_lease(path)
    if lease is not None and lease["owners"].get("trainer", {}).get("pid") == trainer_pid:
        path.unlink(missing_ok=True)


def repair_stale_lease(gpus: GPUs, index: int, folder: Path | None = None) -> tuple[bool, str | None]:
    """Reset GPU ``index``'s clocks if a job that died left them locked; call before this job locks them.

    Args:
        gpus: The GPUs, opened for clock control.
        index: The GPU this process will control.
        folder: The run directory (default :func:`run_dir`).

    Returns:
        ``(usable, message)``: ``usable`` is False when another live job holds the GPU; ``message`` is the
        one line to show (None when there was no lease, or the lease is this process's own).
    """
    path = lease_path(gpus, index, folder)
    lease = read_lease(path)
    if lease is None:
        return True, None
    owners = {role: OwnerProcess(o["pid"], o.get("start_ticks")) for role, o in lease["owners"].items()}
    trainer = owners.get("trainer")
    if trainer is not None and trainer == OwnerProcess.of(os.getpid()):
        return True, None
    job = f"pids {', '.join(f'{r} {o.pid}' for r, o in owners.items())} on {lease.get('host')}"
    if lease.get("host") != socket.gethostname() or any(owner.is_alive() for owner in owners.values()):
        return False, (
            f"GPU {index} is held by another job ({job}, clock {lease.get('locked_clock_mhz')} MHz, lease "
            f"{path}); leaving its clocks alone"
        )
    try:
        if lease.get("locked_memory_clock_mhz") is not None:
            gpus.reset_memory_locked_clocks(index)
        gpus.reset_gpu_locked_clocks(index)
    except Exception as error:
        return (
            False,
            f"GPU {index} was left locked by a job that died ({job}) and could not be reset: {error}",
        )
    path.unlink(missing_ok=True)
    return True, (
        f"GPU {index}: a job that died ({job}, locked at {lease.get('locked_at')}) left its SM clock "
        f"locked at {lease.get('locked_clock_mhz')} MHz; reset it to the default"
    )


def read_lease(path: Path) -> dict[str, Any] | None:
    """The lease at ``path``, or None if there is none; an unreadable one is logged and treated as none."""
    try:
        lease = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        logger.warning("ignoring unreadable clock lease %s: %s", path, error)
        return None
    if not isinstance(lease, dict) or not isinstance(lease.get("owners"), dict):
        logger.warning("ignoring malformed clock lease %s", path)
        return None
    return lease
