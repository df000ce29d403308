"""One run of ``megatron-energy demo`` for the whole session (``conftest.demo``): the tests read its output.

The demo goes the real launcher path (``torch.distributed.run`` starting one fresh interpreter per rank),
so each run costs every rank the import of torch and megatron-core: the demo tests and the tests of the
commands that read a demo's job folder share this one run (PP=2 of GPT-3 1.3B stage work on simulated
H100s, 4 microbatches, a 2-clock grid with two measured iterations per clock, 3 iterations with the plan), in
``--energy-mode all`` (Perseus, Kareus and phase clocks composed; the demo then prints its comparison of
Perseus only, Kareus only and both).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

from megatron_energy.cli import main
from megatron_energy.report.job_report import latest_job_folder

PIPELINE_SIZE = 2
NUM_MICROBATCHES = 4
RUN_ITERS = 3
GRID_MHZ = (
    1980,
    1230,
)  # one clock below the calibrated H100's cap (~1380 MHz for GEMMs): 1530 runs as 1980 there
PROFILE_ITERS = 2
MODE = "all"


@dataclass(frozen=True)
class DemoRun:
    """What the demo returned and printed, and where it wrote."""

    status: int
    out: str
    energy_dir: Path

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    @property
    def job(self) -> Path:
        return latest_job_folder(self.energy_dir)


def run_demo(energy_dir: Path) -> DemoRun:
    """Run the demo, its standard output captured (it is not a terminal, as when piped)."""
    argv = [
        "demo",
        "--pipeline-model-parallel-size", str(PIPELINE_SIZE),
        "--num-microbatches", str(NUM_MICROBATCHES),
        "--run-iters", str(RUN_ITERS),
        "--energy-freq-grid", ",".join(map(str, GRID_MHZ)),
        "--energy-profile-iters", str(PROFILE_ITERS),
        "--energy-dir", str(energy_dir),
        "--energy-mode", MODE,
    ]  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    return DemoRun(status, out.getvalue(), energy_dir)
