"""Fault injection on the launcher path: every fault ends in one outcome on every rank and a finished job.

One zygote (megatron-core imported, ``zygote.start_zygote``) forks two gloo worlds of two ranks each (PP=2,
simulated h100-sxm GPUs, a 2-clock profiling grid). Each rank runs a list of *jobs* one after the other,
each exactly as ``python -m megatron_energy.launch`` runs one: the ``--energy-*`` flags parsed by the
launcher's parser, its listeners (``DeferredSession``), its unpatched-path hooks around megatron-core's real
1F1B schedule, and ``close_listeners`` at the end. Before a job, rank 0 may damage the energy dir; during a
job, a rank may have a fault injected. Each rank leaves one result per job (its log lines, the phase after
every step, its losses, its simulated GPU's state after the job) as soon as the job ends.

World ``main`` runs the faults below; world ``peer`` only runs the two concurrent jobs, started together
with ``main``'s on one shared ``--energy-dir``. ``main``'s last job runs a cached plan until the test
SIGKILLs rank 1 with its clock watchdog and the ranks' parent process.

Every test asserts what the brief of this module asks: no hang (gloo collectives time out after
``COLLECTIVE_TIMEOUT_S``, and no step, less the planner's own run, nor the time around the steps may take
``WAIT_LIMIT_S``), training finished (every step, finite losses), the same outcome on every rank (read from
each rank's own log lines), the simulated GPU back at stock clocks after the job, and nothing deleted (a
damaged file is found byte for byte in a quarantine folder).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import io
import json
import math
import os
import pickle
import re
import select
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import connection
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp
from fault_optimisers import TEST_OPTIMISERS
from megatron_harness import (
    TINY_GPT_SCRIPT,
    PipelineWorld,
    free_port,
    install_cpu_shims,
    warnings_silenced,
)
from zygote import start_zygote

from megatron_energy.dvfs.lease import OwnerProcess, lease_path
from megatron_energy.energy_dir import MANIFEST, QUARANTINE_PREFIX, JobFacts, JobRecord
from megatron_energy.events import read_trace
from megatron_energy.log import configure_logging
from megatron_energy.megatron.console_log import leave_energy_records_to_their_handler
from megatron_energy.plan_file import load_plan, plan_text
from megatron_energy.runtime.planning_round.cache import JobCache
from megatron_energy.runtime.planning_round.cache_manifest import manifest_for
from megatron_energy.runtime.profiling.baseline_length import pilot_steps

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

COLLECTIVE_TIMEOUT_S = 30
"""Longest wait of a gloo collective in these worlds: a rank left alone in a collective fails after this."""

WAIT_LIMIT_S = 20.0
"""No single step of a job, nor its set-up and close together, may take this long: a rank waiting for a
collective that never comes, or for a timeout of its own, sits still for ``COLLECTIVE_TIMEOUT_S`` or so. The
step that waits for rank 0's planner is allowed the planner's own run on top (the planner is niced: on a
loaded two-core machine it once took 24.7 s). The whole job is not timed: ten steps of two ranks on a loaded
two-core machine can take half a minute."""

WORLD_LIMIT_S = 600.0
"""Longest wait for the whole fault world (every job of both worlds), however loaded the machine."""

DEATH_LIMIT_S = 20.0
"""How soon the ranks must be gone after their parent is SIGKILLed."""

GPU_SPEC = "h100-sxm"
GRID_MHZ = (1980, 1500)
STOCK_PROFILING_STEPS = 1 + pilot_steps(1) + 1  # settling, the baseline pilot (exact energies), 1 synchronous
PROFILING_STEPS = STOCK_PROFILING_STEPS + 2 * (len(GRID_MHZ) - 1)  # then a settling and a measured step
RUN_STEPS = 2
JOB_STEPS = PROFILING_STEPS + RUN_STEPS
NUM_MICROBATCHES = 4
MEGATRON_ARGS = [
    "--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2",
    "--seq-length", "8", "--max-position-embeddings", "8", "--vocab-size", "64",
    "--micro-batch-size", "2", "--global-batch-size", str(2 * NUM_MICROBATCHES), "--train-iters", "1000",
    "--lr", "1e-4", "--pipeline-model-parallel-size", "2", "--log-interval", "3",
    "--mock-data", "--tokenizer-type", "NullTokenizer",
]  # fmt: skip

STOCK_FALLBACK = "stock (planning failed)"
NOT_OPTIMISING = "not optimising, training continues at stock clocks"


# ------------------------------------------------------------------------------------------------ jobs


@dataclass(frozen=True)
class Job:
    """One launcher run inside a world, with the fault it meets."""

    name: str
    energy_dir: str
    """Folder under the run root used as ``--energy-dir``."""
    prepare: str | None = None
    """A key of :func:`prepare`: what rank 0 does to the energy dir before the job (every rank waits)."""
    fault: str | None = None
    """A key of :func:`inject`: what is injected on ``fault_rank`` while the job runs."""
    fault_rank: int = 0
    mode: str = "perseus"
    """``--energy-mode``; the test optimisers are registered in every rank."""
    steps: int = JOB_STEPS
    together: bool = False
    """Start together with the other world (both worlds' ranks meet at a barrier first)."""
    until_killed: bool = False
    """Keep training (cached plan running) until the test kills the world."""
    trace: bool = False
    """Add ``--energy-trace <energy dir>/trace.jsonl`` (one file per rank)."""


@dataclass(frozen=True)
class World:
    """The jobs two ranks run, in order."""

    name: str
    jobs: tuple[Job, ...]


@dataclass(frozen=True)
class RankResult:
    """What one rank saw of one job."""

    job: str
    rank: int
    phases: tuple[str, ...]
    """The session's phase after each step (``no session`` when it did not start)."""
    losses: tuple[float, ...]
    lines: tuple[str, ...]
    """Everything the rank printed during the job (stdout and stderr, energy lines included)."""
    seconds: float
    step_seconds: tuple[float, ...]
    """Wall time of each step (the first includes the session's start, the planning step the planning)."""
    state: dict[str, Any] | None
    """The rank's simulated GPU state file after the job."""
    error: str | None = None
    """The traceback, if the job raised on this rank."""


@dataclass(frozen=True)
class KillTarget:
    """What the test needs to kill a rank of the last job, and to check on it afterwards."""

    rank: int
    pid: int
    start_ticks: int | None
    watchdog_pid: int | None
    state_path: str
    lease_path: str


DAMAGED_FILES = ("profile.csv", "baseline.json", "plan.json")
DAMAGES = ("corrupt", "truncated", "tampered")


def _damaged_jobs() -> tuple[Job, ...]:
    return tuple(
        Job(f"{damage}-{name}", f"{damage}-{name}", prepare=f"{damage}:{name}")
        for name in DAMAGED_FILES
        for damage in DAMAGES
    )


CONCURRENT = (
    Job("concurrent-first", "shared", together=True),
    Job("concurrent-again", "shared", together=True),
)
MAIN_JOBS = (
    *CONCURRENT,
    Job("clean", "clean"),
    Job("cache-hit", "clean"),
    *_damaged_jobs(),
    Job("foreign-folder", "foreign-folder", prepare="foreign-folder"),
    Job("foreign-plan", "foreign-plan", prepare="foreign-plan"),
    Job("not-a-baseline", "not-a-baseline", prepare="not-a-baseline"),
    Job("disk-full-rank0", "disk-full-rank0", fault="disk-full-in-cache", fault_rank=0),
    Job("after-partial-store", "disk-full-rank0"),
    Job("disk-full-rank1", "disk-full-rank1", fault="disk-full", fault_rank=1),
    Job("gpu-held-rank1", "gpu-held-rank1", prepare="hold-rank1-gpu"),
    Job("planner-raises", "planner-raises", mode="fault-raises"),
    Job("rank1-cannot-run-plan", "rank1-cannot-run-plan", mode="fault-rank1-plan"),
    Job("trace-disk-full-rank1", "trace-disk-full-rank1", prepare="trace-to-full-disk-on-rank1", trace=True),
    Job("killed", "killed", prepare="copy-clean", until_killed=True, steps=10_000),
)
WORLDS = (World("main", MAIN_JOBS), World("peer", CONCURRENT))


# -------------------------------------------------------------------------- damage and preparations


def job_folder(energy_dir: Path) -> Path:
    """The one fingerprint folder of a job's energy dir (the one a load or store locked)."""
    (folder,) = [path.parent for path in energy_dir.glob("*/.lock")]
    return folder


def _scale_numbers(text: str, pattern: str, factor: float) -> str:
    """Multiply every number matched by group 2 of ``pattern`` (group 1 is kept) by ``factor``."""
    return re.sub(pattern, lambda m: f"{m[1]}{float(m[2]) * factor!r}", text)


def tamper(name: str, content: bytes) -> bytes:
    """The file with its energies scaled by 0.01, as a hand edit would leave it (the manifest stays stale)."""
    text = content.decode()
    if name == "profile.csv":
        lines = text.splitlines()
        energy = lines[0].split(",").index("energy")

        def scaled(row: str) -> str:
            cells = row.split(",")
            cells[energy] = repr(float(cells[energy]) * 0.01)
            return ",".join(cells)

        return ("\n".join([lines[0], *map(scaled, lines[1:])]) + "\n").encode()
    if name == "baseline.json":
        data = json.loads(text)
        data["stock_energy_by_rank"] = {k: v * 0.01 for k, v in data["stock_energy_by_rank"].items()}
        return json.dumps(data, indent=2).encode()
    return _scale_numbers(text, r'("energy_j": )([-0-9.eE+]+)', 0.01).encode()


def damage(damage_kind: str, name: str, content: bytes) -> bytes:
    """``content`` corrupted (bytes overwritten in the middle), truncated (first half) or tampered."""
    if damage_kind == "corrupt":
        middle, garbage = len(content) // 2, b"\x00\xffgarbage\xfe\x00"
        return content[:middle] + garbage + content[middle + len(garbage) :]
    if damage_kind == "truncated":
        return content[: len(content) // 2]
    return tamper(name, content)


def _resign(folder: Path, replacements: dict[str, bytes]) -> None:
    """Replace files and rewrite the manifest so that every checksum matches (a deliberate edit)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    contents = {name: (folder / name).read_bytes() for name in manifest["artefacts"]}
    contents.update(replacements)
    for name, content in replacements.items():
        (folder / name).write_bytes(content)
    (folder / MANIFEST).write_bytes(manifest_for(contents, manifest["fingerprint"]))


FOREIGN_FINGERPRINT = "0123456789abcdef" * 4
"""The fingerprint of "another job"."""


def prepare(key: str, root: Path, job: Job) -> None:
    """Rank 0, before ``job``: set its energy dir up from the clean job's, with the fault ``key`` names."""
    target = root / job.energy_dir
    if key == "hold-rank1-gpu":
        _hold_rank1_gpu(target)
        return
    if key == "trace-to-full-disk-on-rank1":  # every write of rank 1's trace fails with ENOSPC
        target.mkdir(parents=True)
        (target / "trace.jsonl.rank1").symlink_to("/dev/full")
        return
    shutil.copytree(root / "clean", target)
    folder = job_folder(target)
    if key == "copy-clean":
        return
    if key == "foreign-folder":
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["fingerprint"] = FOREIGN_FINGERPRINT
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))
    elif key == "foreign-plan":
        plan = load_plan(folder / "plan.json")
        foreign = dataclasses.replace(plan, fingerprint=FOREIGN_FINGERPRINT[: len(plan.fingerprint)])
        _resign(folder, {"plan.json": plan_text(foreign).encode()})
    elif key == "not-a-baseline":
        _resign(folder, {"baseline.json": b"[1, 2, 3]\n"})
    else:
        damage_kind, name = key.split(":")
        path = folder / name
        path.write_bytes(damage(damage_kind, name, path.read_bytes()))


def _hold_rank1_gpu(energy_dir: Path) -> None:
    """Leave a lease of a live process (the ranks' parent) on rank 1's simulated GPU: another job holds it."""
    from megatron_energy.dvfs.simulated import SimulatedGPUs
    from megatron_energy.dvfs.spec import load_gpu_spec

    gpus = SimulatedGPUs(load_gpu_spec(GPU_SPEC), state_path=energy_dir / "simulated" / "rank1.json")
    path = lease_path(gpus, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    owner = OwnerProcess.of(os.getppid())
    lease = {
        "schema_version": 1,
        "gpu": {"backend": "simulated", "index": 0, "state_path": str(gpus.state_path.resolve())},
        "locked_clock_mhz": 1200,
        "host": os.uname().nodename,
        "owners": {"trainer": {"pid": owner.pid, "start_ticks": owner.start_ticks}},
        "locked_at": "2025-01-01T00:00:00+00:00",
    }
    path.write_text(json.dumps(lease))


# ------------------------------------------------------------------------------------------- faults


class _DiskFull:
    """``tempfile`` as ``megatron_energy.atomic`` sees it, with ENOSPC for files under ``folder``.

    Every file the package writes goes through ``atomic.write_atomically``, which makes its temporary file
    with ``tempfile.mkstemp``: failing that call is what a full disk does to the package's writes.
    """

    def __init__(self, folder: Path, spare_writes: int = 0, skip: Path | None = None) -> None:
        self.folder = folder.resolve()
        self.spare_writes = spare_writes
        self.skip = None if skip is None else skip.resolve()

    def __getattr__(self, name: str) -> Any:
        return getattr(tempfile, name)

    def mkstemp(self, *args: Any, dir: Any = None, **kwargs: Any) -> tuple[int, str]:
        where = Path(dir or ".").resolve()
        inside = where.is_relative_to(self.folder) and not (self.skip and where.is_relative_to(self.skip))
        if inside:
            if self.spare_writes <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))
            self.spare_writes -= 1
        return tempfile.mkstemp(*args, dir=dir, **kwargs)


@contextlib.contextmanager
def inject(fault: str | None, energy_dir: Path) -> Iterator[None]:
    """Inject ``fault`` into this process for the ``with`` block."""
    import megatron_energy.atomic as atomic

    if fault is None:
        yield
        return
    if fault == "disk-full-in-cache":  # the cache's disk fills after its first artefact
        full = _DiskFull(energy_dir, spare_writes=1, skip=energy_dir / "simulated")
    elif fault == "disk-full":  # nothing can be written under --energy-dir
        full = _DiskFull(energy_dir)
    else:
        raise ValueError(fault)
    original = atomic.tempfile
    atomic.tempfile = full  # type: ignore[assignment]
    try:
        yield
    finally:
        atomic.tempfile = original


# ------------------------------------------------------------------------------------- the worlds


def _phase(listener: Any) -> str:
    if listener.session is not None:
        return listener.session.phase
    return "no session"


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _run_job(rank: int, job: Job, root: Path, world: PipelineWorld, meet: Any, ready: Any) -> RankResult:
    """One launcher run: flags parsed, listeners built, hooks installed, steps trained, listeners closed."""
    import torch.distributed as dist
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.training.global_vars import get_timers

    from megatron_energy import launch
    from megatron_energy.events import ListenerFanout
    from megatron_energy.megatron.hooks import install_hooks

    energy_dir = root / job.energy_dir
    if job.prepare is not None and rank == 0:
        prepare(job.prepare, root, job)
    dist.barrier()
    if job.together:
        meet.wait(timeout=WORLD_LIMIT_S)
    flags = [
        "--energy-optimise", "--energy-backend", "simulated", "--energy-gpu-spec", GPU_SPEC,
        "--energy-freq-grid", ",".join(map(str, GRID_MHZ)), "--energy-profile-iters", "1",
        "--energy-dir", str(energy_dir),
    ]  # fmt: skip
    if job.trace:
        flags += ["--energy-trace", str(energy_dir / "trace.jsonl")]
    config, _, _ = launch.split_command([*flags, str(TINY_GPT_SCRIPT)])
    config = dataclasses.replace(config, mode=job.mode)  # the parser only lists the packaged modes
    phases: list[str] = []
    losses: list[float] = []
    step_seconds: list[float] = []
    output = io.StringIO()
    start = datetime.datetime.now()
    with (
        contextlib.redirect_stdout(output),
        contextlib.redirect_stderr(output),
        inject(job.fault if rank == job.fault_rank else None, energy_dir),
    ):
        configure_logging(config.log_level, config.log_ranks)  # as the launcher does
        leave_energy_records_to_their_handler()
        listeners = launch.build_listeners(config)
        installation = install_hooks(ListenerFanout(listeners))
        world.config.timers = get_timers()
        try:
            for step in range(job.steps):
                began = time.perf_counter()
                losses += world.run(get_num_microbatches(), seed=step)
                world.zero_grads()
                phases.append(_phase(listeners[-1]))
                step_seconds.append(time.perf_counter() - began)
                if job.until_killed and step == 1:
                    _announce_ready(rank, listeners[-1], energy_dir, ready)
        finally:
            installation.uninstall()
            launch.close_listeners(listeners)
    seconds = (datetime.datetime.now() - start).total_seconds()
    state = _read_state(energy_dir / "simulated" / f"rank{rank}.json")
    lines = tuple(output.getvalue().splitlines())
    return RankResult(
        job.name, rank, tuple(phases), tuple(losses), lines, seconds, tuple(step_seconds), state
    )


def _announce_ready(rank: int, listener: Any, energy_dir: Path, ready: Any) -> None:
    """Tell the test this rank runs the cached plan with its clock locked, and how to kill it."""
    session = listener.session
    owner = OwnerProcess.of(os.getpid())
    target = KillTarget(
        rank=rank,
        pid=owner.pid,
        start_ticks=owner.start_ticks,
        watchdog_pid=session.guard.watchdog_pid,
        state_path=str(energy_dir / "simulated" / f"rank{rank}.json"),
        lease_path=str(lease_path(session.meter.gpus, 0)),
    )
    ready.send(target)  # one small message: a single atomic pipe write, whichever rank sends first


def _result_path(root: Path, world: str, job: str, rank: int) -> Path:
    return root / "results" / world / job / f"rank{rank}.pkl"


def _rank_main(rank: int, world_spec: World, port: int, root: str, meet: Any, ready: Any) -> None:
    import torch.distributed as dist
    from megatron.training.arguments import parse_and_validate_args

    from megatron_energy.optimisers import registry

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank)
    )
    dist.init_process_group(
        "gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    for name, factory in TEST_OPTIMISERS.items():
        registry.register(name, factory)
    import sys

    sys.argv = [str(TINY_GPT_SCRIPT), *MEGATRON_ARGS]
    with warnings_silenced(), contextlib.redirect_stdout(io.StringIO()):  # Megatron prints every argument
        parse_and_validate_args()
        world = PipelineWorld(2)
    base = Path(root)
    for job in world_spec.jobs:
        path = _result_path(base, world_spec.name, job.name, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            result = _run_job(rank, job, base, world, meet, ready)
        except Exception:
            failed = RankResult(job.name, rank, (), (), (), 0.0, (), None, error=traceback.format_exc())
            path.write_bytes(pickle.dumps(failed))
            raise
        path.write_bytes(pickle.dumps(result))


def _zygote(_index: int, worlds: tuple[World, ...], root: str, ready: Any) -> None:
    """Import megatron-core (if the forkserver has not), then fork every world's two ranks (they share it)."""
    install_cpu_shims()
    with warnings_silenced():  # warm every import a job makes, so both worlds start a job equally fast
        import megatron.core.models.gpt
        import megatron.core.pipeline_parallel.schedules
        import megatron.training.arguments  # noqa: F401

        import megatron_energy.dvfs.simulated
        import megatron_energy.optimisers.perseus.clock_optimiser
        import megatron_energy.runtime.assembly  # noqa: F401
    meet = mp.get_context("fork").Barrier(2 * len(worlds))
    contexts = [
        mp.start_processes(
            _rank_main,
            args=(world, free_port(), root, meet, ready),
            nprocs=2,
            join=False,
            start_method="fork",
        )
        for world in worlds
    ]
    for context in contexts:
        while not context.join():
            pass


# ------------------------------------------------------------------------------------------ fixture


@dataclass
class FaultRun:
    """The results of both worlds and what the kill left behind."""

    root: Path
    results: dict[tuple[str, str], list[RankResult]]
    kill_targets: list[KillTarget]
    died_within_s: dict[int, float | None]
    """Per rank of the killed job: seconds from the kill to its death (None: still alive)."""
    world_error: str | None
    """How the ranks' parent ended, if not cleanly (the kill, or a rank's traceback)."""

    def job(self, name: str, world: str = "main") -> list[RankResult]:
        """Both ranks' results of a job; fails with the world's traceback if it did not finish."""
        results = self.results.get((world, name))
        if results is None:
            errors = [r.error for rs in self.results.values() for r in rs if r.error]
            pytest.fail(f"job {name} of world {world} left no result; errors: {errors}; {self.world_error}")
        for result in results:
            assert result.error is None, f"job {name} raised on rank {result.rank}:\n{result.error}"
        return results


def _wait_for_exit(pid: int, timeout_s: float) -> float | None:
    """Seconds until process ``pid`` (not our child) ended, or None if it still runs after ``timeout_s``."""
    start = datetime.datetime.now()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return 0.0
    try:
        readable, _, _ = select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)
    return (datetime.datetime.now() - start).total_seconds() if readable else None


def _kill_world(targets: list[KillTarget], zygote_pid: int) -> dict[int, float | None]:
    """SIGKILL rank 1 with its watchdog (a lock left behind) and the ranks' parent; time the ranks' deaths."""
    one = targets[1]
    if one.watchdog_pid is not None:
        os.kill(one.watchdog_pid, signal.SIGKILL)
    os.kill(one.pid, signal.SIGKILL)
    os.kill(zygote_pid, signal.SIGKILL)
    return {target.rank: _wait_for_exit(target.pid, DEATH_LIMIT_S) for target in targets}


def _collect(root: Path) -> dict[tuple[str, str], list[RankResult]]:
    results: dict[tuple[str, str], list[RankResult]] = {}
    for world in WORLDS:
        for job in world.jobs:
            paths = [_result_path(root, world.name, job.name, rank) for rank in (0, 1)]
            if all(path.exists() for path in paths):
                results[(world.name, job.name)] = [pickle.loads(path.read_bytes()) for path in paths]
    return results


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory: pytest.TempPathFactory) -> FaultRun:
    """Run both worlds; kill ``main``'s last job once both its ranks run the cached plan."""
    root = tmp_path_factory.mktemp("faults")
    ready, announce = mp.get_context("spawn").Pipe(duplex=False)
    context = start_zygote(_zygote, (WORLDS, str(root), announce), join=False)
    assert context is not None
    announce.close()
    (zygote_pid,) = context.pids()
    zygote_ended = context.processes[0].sentinel
    targets: list[KillTarget] = []
    died: dict[int, float | None] = {}
    try:
        deadline = time.monotonic() + WORLD_LIMIT_S
        while len(targets) < 2 and time.monotonic() < deadline:
            waited = connection.wait([ready, zygote_ended], timeout=deadline - time.monotonic())
            if ready not in waited:
                break  # the world ended (or the deadline passed) without both ranks running the last job
            try:
                targets.append(ready.recv())
            except EOFError:  # every rank is gone
                break
        if len(targets) == 2:
            targets.sort(key=lambda target: target.rank)
            died = _kill_world(targets, zygote_pid)
    finally:
        if context.processes[0].is_alive():  # past the deadline: whatever hangs must not outlive the test
            os.kill(zygote_pid, signal.SIGKILL)
        world_error = None
        try:
            context.join(timeout=DEATH_LIMIT_S)
        except Exception as error:  # the parent's own error, or its death by the kill
            world_error = str(error)
    return FaultRun(root, _collect(root), targets, died, world_error)


# -------------------------------------------------------------------------------------- assertions


def quarantines(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{QUARANTINE_PREFIX}*"))


def lines_with(result: RankResult, text: str) -> list[str]:
    return [line for line in result.lines if text in line]


PLAN_TOOK_EFFECT = re.compile(r"plan took effect at iteration (\d+): computed in ([\d.]+) s")


def planner_wait(results: list[RankResult]) -> tuple[int, float] | None:
    """The step every rank waited in for rank 0's planner (simulated GPUs wait), and the planner's seconds.

    Read from rank 0's own line (the iteration it names is the one after the step that waited, 1-based).
    The planner is a child interpreter that lowers its own priority: on a loaded two-core machine it may
    run for longer than a collective's timeout, and that step is not a hang.
    """
    for line in results[0].lines:
        if found := PLAN_TOOK_EFFECT.search(line):
            return int(found[1]) - 2, float(found[2])
    return None


def assert_finished(results: list[RankResult], steps: int = JOB_STEPS) -> None:
    """Every step ran on both ranks, the last stage has finite losses, and nothing sat in a long wait.

    A step's wait is its wall time, less the planner's own run in the step that waited for the planner.
    """
    waited = planner_wait(results)
    for result in results:
        assert len(result.phases) == steps, (result.rank, result.phases)
        step_waits = list(result.step_seconds)
        if waited is not None:
            step, planner_s = waited
            step_waits[step] -= planner_s
        longest_step = max(step_waits)
        around_steps = result.seconds - sum(result.step_seconds)
        assert longest_step < WAIT_LIMIT_S, f"rank {result.rank}: a step waited {longest_step:.1f} s"
        assert around_steps < WAIT_LIMIT_S, f"rank {result.rank}: set-up and close took {around_steps:.1f} s"
    last = results[-1]
    assert len(last.losses) == steps * NUM_MICROBATCHES
    assert all(math.isfinite(loss) for loss in last.losses)


def assert_same_outcome(results: list[RankResult]) -> None:
    """Both ranks went through the same phases, step for step, and each logged the same number of fallbacks.

    (The reasons may differ: the rank that failed names its own error, the others that another rank did.)
    """
    assert results[0].phases == results[1].phases, [r.phases for r in results]
    fallbacks = [len(lines_with(result, NOT_OPTIMISING)) for result in results]
    assert fallbacks[0] == fallbacks[1] <= 1, [result.lines for result in results]


def assert_at_stock(results: list[RankResult]) -> None:
    """Each rank's simulated GPU has no locked clock and returns to stock after the job."""
    for result in results:
        assert result.state is not None, f"rank {result.rank} left no simulated GPU state"
        (gpu,) = result.state["gpus"]
        assert gpu["locked_sm_clock_mhz"] is None, (result.rank, gpu)
        assert (gpu["pending_sm_clock_mhz"] or gpu["sm_clock_mhz"]) == result.state["default_sm_clock_mhz"]


def assert_healthy_end(results: list[RankResult], steps: int = JOB_STEPS) -> None:
    assert_finished(results, steps)
    assert_same_outcome(results)
    assert_at_stock(results)


PLANNED_AFTER_PROFILING = ("profiling",) * (PROFILING_STEPS - 1) + ("planned",) * (RUN_STEPS + 1)
FALLBACK_AFTER_PROFILING = ("profiling",) * (PROFILING_STEPS - 1) + (STOCK_FALLBACK,) * (RUN_STEPS + 1)


# ------------------------------------------------------------------------------------------- tests


def test_a_clean_job_profiles_plans_and_caches(fault_run: FaultRun) -> None:
    results = fault_run.job("clean")
    assert_healthy_end(results)
    assert results[0].phases == PLANNED_AFTER_PROFILING
    assert lines_with(results[0], "energy cache empty for this job")
    folder = job_folder(fault_run.root / "clean")
    assert (folder / MANIFEST).exists() and not quarantines(folder)


def test_the_same_job_again_reuses_the_verified_cache(fault_run: FaultRun) -> None:
    results = fault_run.job("cache-hit")
    assert_healthy_end(results)
    assert results[0].phases == ("planned",) * JOB_STEPS
    assert lines_with(results[0], "energy cache hit")


EXPECTED_FAILURE = {
    "corrupt": ("does not match its checksum",),  # same size, other bytes
    "truncated": ("(truncated or grown)",),
    "tampered": ("does not match its checksum", "(truncated or grown)"),  # the edit may change the size
}


@pytest.mark.parametrize("damage_kind", DAMAGES)
@pytest.mark.parametrize("name", DAMAGED_FILES)
def test_a_damaged_cached_file_is_moved_aside_and_every_rank_profiles_again_or_plans_again(
    fault_run: FaultRun, name: str, damage_kind: str
) -> None:
    """A damaged profile or baseline: the folder moves aside whole and the job profiles again. A damaged plan
    (issue 44): it moves aside alone, and the plan is rebuilt from the verified profile without profiling."""
    results = fault_run.job(f"{damage_kind}-{name}")
    assert_healthy_end(results)
    plan_only = name == "plan.json"
    assert results[0].phases == (("planned",) * JOB_STEPS if plan_only else PLANNED_AFTER_PROFILING)
    (message,) = lines_with(results[0], "failed verification")
    assert name in message
    if plan_only:
        assert message.endswith("rebuilt the plan from the verified profile, without profiling again")
    else:
        assert message.endswith("profiling again") and "without" not in message
    assert any(reason in message for reason in EXPECTED_FAILURE[damage_kind]), message
    folder = job_folder(fault_run.root / f"{damage_kind}-{name}")
    (aside,) = quarantines(folder)
    assert str(aside) in message
    assert plan_only == ([path.name for path in aside.iterdir()] == [name]), "only the plan is set aside"
    clean = (job_folder(fault_run.root / "clean") / name).read_bytes()
    assert (aside / name).read_bytes() == damage(damage_kind, name, clean), "the damaged file must be kept"
    assert JobCache(folder.parent, _parts(folder)).load().hit, "the re-planned job must be cached again"


def _parts(folder: Path) -> JobFacts:
    return JobRecord.read(folder / "job.json").facts


def test_another_jobs_folder_is_moved_aside(fault_run: FaultRun) -> None:
    results = fault_run.job("foreign-folder")
    assert_healthy_end(results)
    assert results[0].phases == PLANNED_AFTER_PROFILING
    (message,) = lines_with(results[0], "failed verification")
    assert "belongs to another job" in message and FOREIGN_FINGERPRINT in message
    (aside,) = quarantines(job_folder(fault_run.root / "foreign-folder"))
    assert json.loads((aside / MANIFEST).read_text())["fingerprint"] == FOREIGN_FINGERPRINT


def test_a_resigned_plan_of_another_job_is_refused_by_every_rank_and_kept(fault_run: FaultRun) -> None:
    """The manifest verifies (it was rewritten), the plan's own fingerprint is another job's.

    Regression: every rank refused the plan and re-profiled, but the folder stayed in place and the new
    store overwrote the refused plan (gone, not kept for inspection).
    """
    results = fault_run.job("foreign-plan")
    assert_healthy_end(results)
    assert results[0].phases == PLANNED_AFTER_PROFILING
    for result in results:
        assert lines_with(result, "computed for another job"), result.lines
    folder = job_folder(fault_run.root / "foreign-plan")
    (aside,) = quarantines(folder)
    assert json.loads((aside / "plan.json").read_text())["fingerprint"].startswith(FOREIGN_FINGERPRINT[:8])


def test_a_resigned_baseline_that_is_not_one_is_refused_and_kept(fault_run: FaultRun) -> None:
    """Regression: the job re-profiled, and the new store overwrote the refused baseline."""
    results = fault_run.job("not-a-baseline")
    assert_healthy_end(results)
    assert results[0].phases == PLANNED_AFTER_PROFILING
    assert lines_with(results[0], "baseline is not a JSON object")
    (aside,) = quarantines(job_folder(fault_run.root / "not-a-baseline"))
    assert (aside / "baseline.json").read_bytes() == b"[1, 2, 3]\n"


def test_a_full_disk_on_rank0_leaves_the_plan_running_uncached(fault_run: FaultRun) -> None:
    results = fault_run.job("disk-full-rank0")
    assert_healthy_end(results)
    assert results[0].phases == PLANNED_AFTER_PROFILING
    (message,) = lines_with(results[0], "could not cache the plan")
    assert "No space left on device" in message and "running it uncached" in message


def test_the_next_job_moves_the_partial_store_aside(fault_run: FaultRun) -> None:
    results = fault_run.job("after-partial-store")
    assert_healthy_end(results)
    assert results[0].phases == PLANNED_AFTER_PROFILING
    (message,) = lines_with(results[0], "failed verification")
    assert "manifest.json is missing" in message
    (aside,) = quarantines(job_folder(fault_run.root / "disk-full-rank0"))
    assert [path.name for path in aside.iterdir()], "the partial store is kept"


def test_a_full_disk_on_rank1_stops_optimising_on_every_rank(fault_run: FaultRun) -> None:
    """Rank 1 cannot even open its (simulated) GPU; rank 0 must not wait for it in the cache broadcast.

    Regression: rank 0 waited in the broadcast until the collective timed out (30 s here, 10 min under
    NCCL), then the broken process group failed the next job's first collective.
    """
    results = fault_run.job("disk-full-rank1")
    assert_finished(results)
    assert_same_outcome(results)
    assert results[0].phases == ("no session",) * JOB_STEPS
    (own,) = lines_with(results[1], NOT_OPTIMISING)
    assert "No space left on device" in own
    (told,) = lines_with(results[0], NOT_OPTIMISING)
    assert "another rank could not start its energy session" in told
    assert_at_stock(results[:1])  # rank 1's state file could not be written at all


def test_a_gpu_held_by_another_job_on_rank1_gives_one_mode_on_every_rank(fault_run: FaultRun) -> None:
    """Rank 1 is monitor-only (its GPU's lease belongs to a live process), rank 0 could set clocks.

    Regression: rank 1 profiled the stock clock only and went to the planning gather while rank 0 was
    still sweeping its grid; the gather timed out and the error reached Megatron's step.
    """
    results = fault_run.job("gpu-held-rank1")
    assert_healthy_end(results)
    stock_only = STOCK_PROFILING_STEPS - 1
    assert results[0].phases == ("profiling",) * stock_only + ("planned",) * (JOB_STEPS - stock_only)
    assert lines_with(results[1], "held by another job")
    assert lines_with(results[0], "another rank cannot set its GPU clocks")
    for result in results:
        assert not lines_with(result, NOT_OPTIMISING)


def test_a_planner_that_raises_sends_every_rank_to_stock_clocks(fault_run: FaultRun) -> None:
    results = fault_run.job("planner-raises")
    assert_healthy_end(results)
    assert results[0].phases == FALLBACK_AFTER_PROFILING
    for result in results:
        (line,) = lines_with(result, NOT_OPTIMISING)
        assert "planning failed: RuntimeError: injected planner failure" in line


def test_a_plan_rank1_cannot_run_sends_every_rank_to_stock_clocks(fault_run: FaultRun) -> None:
    """Regression: rank 0 cached the plan before the ranks tried it, so the next run loaded it again."""
    results = fault_run.job("rank1-cannot-run-plan")
    assert_healthy_end(results)
    assert results[0].phases == FALLBACK_AFTER_PROFILING
    assert lines_with(results[1], "rank 1: cannot run the plan")
    for result in results:
        (line,) = lines_with(result, NOT_OPTIMISING)
        assert "a rank could not run the plan" in line
    cached = list((fault_run.root / "rank1-cannot-run-plan").glob("*/plan.json"))
    assert not cached, "a plan some rank cannot run must not be cached for the next run"


def test_a_full_disk_under_rank1s_trace_stops_the_trace_not_the_job(fault_run: FaultRun) -> None:
    """Every write of rank 1's ``--energy-trace`` file fails with ENOSPC (it is ``/dev/full``)."""
    results = fault_run.job("trace-disk-full-rank1")
    assert_healthy_end(results)
    assert results[0].phases == PLANNED_AFTER_PROFILING
    (stopped,) = lines_with(results[1], "stopped writing the trace")
    assert "No space left on device" in stopped and "training continues" in stopped
    assert not lines_with(results[0], "stopped writing the trace")
    events = read_trace(fault_run.root / "trace-disk-full-rank1" / "trace.jsonl.rank0")
    assert [e["step"] for e in events if e["event"] == "step_end"] == list(range(JOB_STEPS))


def test_two_jobs_at_once_on_one_energy_dir(fault_run: FaultRun) -> None:
    """Two jobs of the same shape start together on one ``--energy-dir``, twice.

    They share the cache folder, ``last_job.json`` and (simulated GPUs keep their state in the energy dir)
    the GPUs themselves, so which one profiles, which one hits the cache and which one finds the GPU held by
    the other depends on timing. Whatever the timing: each job takes one decision on both its ranks, no job
    ever sees a partial or failing cache, and once both are done the cache verifies and the GPUs are free.
    """
    for name in ("concurrent-first", "concurrent-again"):
        for world in ("main", "peer"):
            results = fault_run.job(name, world)
            assert_finished(results)
            assert_same_outcome(results)
            assert results[0].phases[-1] == "planned", results[0].lines
            assert not any(
                "failed verification" in line or "unusable" in line for r in results for line in r.lines
            )
    shared = fault_run.root / "shared"
    folders = [path.parent for path in shared.glob("*/job.json")]
    assert folders, "no job cached its plan"
    for folder in folders:  # two when one job found the GPUs held by the other (another fingerprint)
        assert JobCache(shared, _parts(folder)).load().hit
        assert not quarantines(folder)
    assert not list(shared.rglob(".*.tmp")), "no temporary file may be left behind"
    for rank in (0, 1):
        (gpu,) = json.loads((shared / "simulated" / f"rank{rank}.json").read_text())["gpus"]
        assert gpu["locked_sm_clock_mhz"] is None


LEASE_RELEASE_LIMIT_S = 10.0
"""How long a dead rank's watchdog may take to remove its lease on a loaded machine."""


def test_sigkill_of_the_parent_kills_the_ranks_and_the_next_start_reclaims_the_lock(
    fault_run: FaultRun, caplog: pytest.LogCaptureFixture
) -> None:
    assert fault_run.kill_targets, "the killed job never ran its cached plan on both ranks"
    for rank, seconds in fault_run.died_within_s.items():
        assert seconds is not None, f"rank {rank} still runs {DEATH_LIMIT_S} s after its parent was killed"
    zero, one = fault_run.kill_targets
    # rank 0 died with its parent (SIGINT from the kernel) and reset its own clock
    state0 = json.loads(Path(zero.state_path).read_text())["gpus"][0]
    assert state0["locked_sm_clock_mhz"] is None
    # its lease goes with it: the guard removes it, or its watchdog does on the guard's EOF (asynchronously)
    deadline = time.monotonic() + LEASE_RELEASE_LIMIT_S
    while Path(zero.lease_path).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(zero.lease_path).exists()
    # rank 1 and its watchdog were SIGKILLed: its clock stays locked, its lease names the dead owners
    state1 = json.loads(Path(one.state_path).read_text())["gpus"][0]
    assert state1["locked_sm_clock_mhz"] is not None
    assert Path(one.lease_path).exists()
    from megatron_energy.dvfs.backends import open_gpus

    handle = open_gpus("simulated", GPU_SPEC, False, local_index=0, state_path=one.state_path)
    assert handle.mode == "control"
    (message,) = [r.getMessage() for r in caplog.records if r.name == "megatron_energy.dvfs.backends"]
    assert "a job that died" in message and "reset it to the default" in message
    assert not Path(one.lease_path).exists()
    assert json.loads(Path(one.state_path).read_text())["gpus"][0]["locked_sm_clock_mhz"] is None
    # a rank SIGKILLed mid-write leaves its temporary; the reset's write removes it
    assert not list(Path(one.state_path).parent.glob(".*.tmp"))


def test_every_job_removed_its_lease_and_left_no_temporary_file(
    fault_run: FaultRun, private_lease_dir: Path
) -> None:
    """Only the leases this module left on purpose remain: the killed rank's and the other job's hold."""
    on_purpose = (fault_run.root / "killed", fault_run.root / "gpu-held-rank1")
    left = []
    for path in private_lease_dir.glob("gpu-*.json"):
        state_path = Path(json.loads(path.read_text())["gpu"]["state_path"])
        if not any(state_path.is_relative_to(folder.resolve()) for folder in on_purpose):
            left.append(path)
    assert not left, [path.read_text() for path in left]
    killed = (fault_run.root / "killed").resolve()
    left_temporaries = [
        path for path in fault_run.root.rglob(".*.tmp") if not path.resolve().is_relative_to(killed)
    ]
    assert not left_temporaries  # the killed job's are the reclaim test's to check: a SIGKILL may leave one
