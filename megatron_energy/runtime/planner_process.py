"""The planner in a process of its own, so planning never stalls training (``EnergySession._plan``).

Rank 0 starts a fresh interpreter, ``python -m megatron_energy.runtime.planner_process FOLDER`` (never a fork
of the training process, which holds a CUDA context and many threads), with the training process's
environment and its import path, so an optimiser a plugin declares as an entry point resolves there as it
did here. Its input is a pickle in a private temporary folder (:class:`PlannerInput`: the profile, the
``PlanningJob``, the stock baseline and what builds the optimiser: ``--energy-mode`` and this process's
registrations, resolved through ``megatron_energy.registry`` as ``runtime.assembly`` resolved the session's).
The child lowers its CPU priority (``os.nice``) before it imports any planner (numpy starts its threads at
import; they inherit the priority), plans (``planning.plan_on_root``) and writes its outcome, the
``PlanRelease`` or a ``Fallback`` saying why the optimiser failed, atomically (``atomic.write_atomically``)
into the same folder. :meth:`PlannerProcess.poll` never blocks; a child that ends without a readable outcome
(a non-zero status, a signal, no or a corrupt result file) is a ``Fallback`` too, with its last output line.
The child also ends when its parent does, and removes the folder: it reads its standard input, a pipe from
the parent, until the pipe closes.

Only the standard library and ``megatron_energy.atomic`` are imported at the top of this module: the child
runs them before it renices.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_energy.atomic import write_atomically

if TYPE_CHECKING:
    from megatron_energy.optimiser import PlanningJob
    from megatron_energy.pipeline.profile import Profile
    from megatron_energy.registry import Factory
    from megatron_energy.runtime.planning import Fallback, PlanRelease, StockBaseline

NICENESS = 10
"""How much lower the planner's CPU priority is than the training process's (``os.nice``)."""

INPUT_FILE = "input.pkl"
RESULT_FILE = "result.pkl"
OUTPUT_FILE = "output.log"
"""The child's standard output and error, in its folder; its last line goes into a failure's reason."""

TERMINATE_WAIT_S = 5.0
"""How long :meth:`PlannerProcess.terminate` waits after SIGTERM before it sends SIGKILL."""


@dataclass(frozen=True)
class PlannerInput:
    """What the planner process plans from (pickled into its folder)."""

    mode: str
    """``--energy-mode``, resolved in the child through ``megatron_energy.registry``."""

    registered: dict[str, Factory]
    """This process's registered optimisers (``registry.registered``), registered again in the child."""

    profile: Profile
    """The job's profile, merged over the ranks."""

    job: PlanningJob
    """The job as the optimiser sees it."""

    baseline: StockBaseline
    """The stock-clock baseline measured while profiling."""


class PlannerProcess:
    """One planning job in a child interpreter (see the module docstring); started on rank 0.

    Args:
        inputs: What to plan from.

    Raises:
        OSError: The folder, the input or the child could not be made (nothing is left behind).
        pickle.PicklingError: A registered factory cannot travel (neither an import path nor a module-level
            callable).
    """

    def __init__(self, inputs: PlannerInput) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="megatron_energy-planner-"))
        try:
            write_atomically(self.folder / INPUT_FILE, pickle.dumps(inputs), durable=False)
            with open(self.folder / OUTPUT_FILE, "wb") as output:
                self._child = subprocess.Popen(
                    [sys.executable, "-m", __name__, str(self.folder)],
                    stdin=subprocess.PIPE,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONPATH": os.pathsep.join(map(str, sys.path))},
                )
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self._outcome: PlanRelease | Fallback | None = None

    def poll(self) -> PlanRelease | Fallback | None:
        """The outcome once the child has ended; ``None`` at once while it runs."""
        if self._outcome is None:
            status = self._child.poll()
            if status is not None:
                self._outcome = self._ended(status)
        return self._outcome

    def wait(self) -> PlanRelease | Fallback:
        """The outcome, once the child has ended (waits for it)."""
        if self._outcome is None:
            self._outcome = self._ended(self._child.wait())
        return self._outcome

    def terminate(self) -> None:
        """Stop the child if it still runs (SIGTERM, then SIGKILL), and remove its folder."""
        if self._child.poll() is None:
            self._child.terminate()
            try:
                self._child.wait(TERMINATE_WAIT_S)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
        self._release()

    def _ended(self, status: int) -> PlanRelease | Fallback:
        """Read what the child left, then remove its folder."""
        try:
            return self._outcome_of(status)
        finally:
            self._release()

    def _outcome_of(self, status: int) -> PlanRelease | Fallback:
        """The outcome the child left, or the fallback that says why it left none."""
        from megatron_energy.runtime.planning import Fallback, PlanRelease  # here: see the docstring

        if status != 0:
            ended = f"was killed by {_signal_name(-status)}" if status < 0 else f"exited with status {status}"
            return Fallback(f"planning failed: the planner process {ended}{self._last_words()}")
        try:
            outcome = pickle.loads((self.folder / RESULT_FILE).read_bytes())
        except Exception as problem:  # missing, truncated, not a pickle of ours
            return Fallback(
                f"planning failed: the planner process left no readable result ({type(problem).__name__}: "
                f"{problem}){self._last_words()}"
            )
        if not isinstance(outcome, PlanRelease | Fallback):
            return Fallback(f"planning failed: the planner process left a {type(outcome).__name__}")
        return outcome

    def _last_words(self) -> str:
        """The child's last output line, as ``" (line)"``; empty when it printed nothing."""
        try:
            lines = (self.folder / OUTPUT_FILE).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        last = next((line.strip() for line in reversed(lines) if line.strip()), "")
        return f" ({last})" if last else ""

    def _release(self) -> None:
        """Close the child's input pipe and remove the folder."""
        if self._child.stdin is not None:
            self._child.stdin.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _signal_name(number: int) -> str:
    """``SIGKILL`` for 9, and so on."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def main(argv: list[str]) -> int:
    """The child: plan from the input in folder ``argv[0]`` and write the outcome there; the exit status.

    Whatever the optimiser (or building it) raises becomes a ``Fallback`` with the reason; the status is then
    still 0. The child removes the folder and ends at once when its standard input closes (the parent ended).
    """
    os.nice(NICENESS)  # first: the threads started from here on inherit it
    folder = Path(argv[0])
    threading.Thread(target=_end_with_parent, args=(folder,), name="parent-watch", daemon=True).start()
    from megatron_energy import registry
    from megatron_energy.perseus.power_budget import PowerBudgetError
    from megatron_energy.runtime.planning import Fallback, plan_on_root, profile_artefacts

    outcome: PlanRelease | Fallback
    try:
        inputs: PlannerInput = pickle.loads((folder / INPUT_FILE).read_bytes())
        for name, factory in inputs.registered.items():
            registry.register(name, factory)
        optimiser = registry.resolve(inputs.mode)
        try:
            outcome = plan_on_root(optimiser, inputs.profile, inputs.job, inputs.baseline)
        except PowerBudgetError as out_of_reach:  # the profile is good: kept for a retry
            artefacts = profile_artefacts(optimiser, inputs.profile, inputs.job, inputs.baseline)
            outcome = Fallback(str(out_of_reach), artefacts, once=True)
    except Exception as problem:  # the parent falls back with the reason, on every rank
        outcome = Fallback(f"planning failed: {type(problem).__name__}: {problem}")
    write_atomically(folder / RESULT_FILE, pickle.dumps(outcome), durable=False)
    return 0


def _end_with_parent(folder: Path) -> None:
    """Remove ``folder`` and exit once the child's standard input closes: the parent closed it, or ended.

    It reads file descriptor 0, not ``sys.stdin``: a daemon thread blocked in a buffered read would hold the
    buffer's lock while the interpreter shuts down, which aborts it.
    """
    while os.read(0, 4096):
        pass
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
