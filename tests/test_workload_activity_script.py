"""lab/workload_activity.py on the two live H100 jobs' recorded profiles: the scale the spec carries."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_energy.dvfs.spec import load_gpu_spec

pytestmark = [pytest.mark.lab, pytest.mark.slow]  # runs the lab's script in a Python process
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results" / "data"
JOBS = {
    "h4096": ["--num-layers", "8", "--hidden-size", "4096", "--num-attention-heads", "32"],
    "h2048": ["--num-layers", "16", "--hidden-size", "2048", "--num-attention-heads", "16"],
}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_each_instruction_of_the_live_jobs_asks_for_the_scale_the_h100_spec_carries(job: str) -> None:
    argv = [sys.executable, str(ROOT / "lab" / "workload_activity.py")]
    argv += ["--profile", str(DATA / f"2026-12-06-live-check-h100-{job}-profile.csv"), *JOBS[job]]
    argv += ["--seq-length", "2048", "--micro-batch-size", "2"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    scales = [float(s) for s in re.findall(r"activity scale for the measured power ([\d.]+)", out)]
    assert len(scales) == 2  # forward and backward
    spec = load_gpu_spec("h100-sxm")
    low, high = spec.ranges["workload_activity_scale"]
    assert all(low <= scale <= high for scale in scales)
    assert all(abs(scale - spec.workload_activity_scale) < 0.03 for scale in scales)


def test_a_job_measured_at_its_power_limit_is_solved_by_the_clock_the_check_read() -> None:
    """The 12-layer GPT at hidden 3072 drew 715 W (at the limit): its power cannot say, its cap clock can."""
    argv = [sys.executable, str(ROOT / "lab" / "workload_activity.py")]
    argv += ["--profile", str(DATA / "2026-12-06-live-check-h100-h3072-profile.csv"), "--num-layers", "12"]
    argv += ["--hidden-size", "3072", "--num-attention-heads", "24", "--seq-length", "1024"]
    argv += ["--micro-batch-size", "4", "--cap-clock-mhz", "1867"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert re.findall(r"for the measured power (\S+) ", out) == ["nan", "nan"]
    by_clock = [float(s) for s in re.findall(r"for the cap clock 1867 MHz \(measured\) ([\d.]+)", out)]
    low, high = load_gpu_spec("h100-sxm").ranges["workload_activity_scale"]
    assert len(by_clock) == 2 and all(low <= scale <= high for scale in by_clock)
