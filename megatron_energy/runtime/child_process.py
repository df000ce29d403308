"""Work that must not stall training, in a process of its own: the planner, the kernel-timeline reader.

A :class:`ChildProcess` starts a fresh interpreter, ``python -m megatron_energy.runtime.child_process
FOLDER`` (never a fork of the training process, which holds a CUDA context and many threads), with the
training process's environment and its import path, so whatever the task imports (an optimiser a plugin
declares as an entry point) resolves there as it did here. Its input is a pickled :class:`ChildTask` in a
private temporary folder. The child lowers its CPU priority (``os.nice``) before it unpickles the task
(whose module imports numpy, which starts its threads at import; they inherit the priority), runs it and
writes its outcome atomically (``atomic.write_atomically``) into the same folder; whatever the task raises
becomes the task's own failure outcome (:meth:`ChildTask.failed`), with the reason. :meth:`ChildProcess.poll`
never blocks; a child that ends without a readable outcome (a non-zero status, a signal, no or a corrupt
result file) is a failure outcome too, with its last output line. The child also ends when its parent does,
and removes the folder: it reads its standard input, a pipe from the parent, until the pipe closes.

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
from pathlib import Path
from typing import Protocol

from megatron_energy.atomic import write_atomically

NICENESS = 10
"""How much lower the child's CPU priority is than the training process's (``os.nice``)."""

INPUT_FILE = "input.pkl"
RESULT_FILE = "result.pkl"
OUTPUT_FILE = "output.log"
"""The child's standard output and error, in its folder; its last line goes into a failure's reason."""

TERMINATE_WAIT_S = 5.0
"""How long :meth:`ChildProcess.terminate` waits after SIGTERM before it sends SIGKILL."""


class ChildTask[R](Protocol):
    """What a child process runs: picklable, its module importable in a fresh interpreter."""

    @property
    def process_name(self) -> str:
        """What the process is called in a failure's reason, e.g. ``planner``."""
        ...

    def run(self) -> R:
        """Do the work (in the child); the outcome."""
        ...

    def failed(self, reason: str) -> R:
        """The outcome that stands for a failure, and says ``reason``."""
        ...

    def accepts(self, outcome: object) -> bool:
        """Whether ``outcome`` (unpickled from the result file) is one of this task's outcomes."""
        ...


class ChildProcess[R]:
    """One task in a child interpreter (see the module docstring).

    Args:
        task: What to run.

    Raises:
        OSError: The folder, the input or the child could not be made (nothing is left behind).
        pickle.PicklingError: The task cannot travel.
    """

    def __init__(self, task: ChildTask[R]) -> None:
        self.task = task
        self.folder = Path(tempfile.mkdtemp(prefix=f"megatron_energy-{task.process_name}-"))
        try:
            write_atomically(self.folder / INPUT_FILE, pickle.dumps(task), durable=False)
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
        self._outcome: R | None = None
        self._ended_yet = False

    def poll(self) -> R | None:
        """The outcome once the child has ended; ``None`` at once while it runs."""
        if not self._ended_yet:
            status = self._child.poll()
            if status is not None:
                self._ended(status)
        return self._outcome

    def wait(self) -> R:
        """The outcome, once the child has ended (waits for it)."""
        if not self._ended_yet:
            self._ended(self._child.wait())
        return self._outcome  # type: ignore[return-value]  # set by _ended

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

    def _ended(self, status: int) -> None:
        """Read what the child left, then remove its folder."""
        try:
            self._outcome = self._outcome_of(status)
        finally:
            self._ended_yet = True
            self._release()

    def _outcome_of(self, status: int) -> R:
        """The outcome the child left, or the failure that says why it left none."""
        name = self.task.process_name
        if status != 0:
            ended = f"was killed by {_signal_name(-status)}" if status < 0 else f"exited with status {status}"
            return self.task.failed(f"the {name} process {ended}{self._last_words()}")
        try:
            outcome = pickle.loads((self.folder / RESULT_FILE).read_bytes())
        except Exception as problem:  # missing, truncated, not a pickle of ours
            return self.task.failed(
                f"the {name} process left no readable result ({type(problem).__name__}: {problem})"
                f"{self._last_words()}"
            )
        if not self.task.accepts(outcome):
            return self.task.failed(f"the {name} process left a {type(outcome).__name__}")
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
    """The child: run the task in folder ``argv[0]`` and write its outcome there; the exit status.

    Whatever the task raises becomes its failure outcome with the reason; the status is then still 0. The
    child removes the folder and ends at once when its standard input closes (the parent ended).
    """
    os.nice(NICENESS)  # first: the threads started from here on inherit it
    folder = Path(argv[0])
    threading.Thread(target=_end_with_parent, args=(folder,), name="parent-watch", daemon=True).start()
    task = pickle.loads((folder / INPUT_FILE).read_bytes())
    try:
        outcome = task.run()
    except Exception as problem:  # the parent reads the reason from the outcome
        outcome = task.failed(f"{type(problem).__name__}: {problem}")
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
