"""Report on one cached job under ``--energy-dir``: its plan against stock clocks, frontier plot, timeline.

The job folder (``<energy dir>/<fingerprint>``) holds ``job.json`` (the job facts), ``profile.csv`` and
``plan.json``. The table and the plot show the plan file's figures (the plan that ran; nothing is solved
again); the plan's target point is simulated for the timeline. Every figure here is modelled from the
profile, whose own source (measured or modelled) is named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.errors import EnergyValueError
from megatron_energy.megatron.schedule import pipeline_orders
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan
from megatron_energy.report.frontier_plot import plot_frontier
from megatron_energy.report.tables import stock_vs_plan_table
from megatron_energy.sim.simulator import Simulator, StagePowers
from megatron_energy.sim.trace import write_trace


class ReportError(EnergyValueError):
    """The energy folder holds no usable job; the message says what is missing."""


@dataclass(frozen=True)
class JobReport:
    """What ``write_job_report`` produced."""

    table: Table
    """Stock clocks against the plan (modelled)."""

    frontier_png: Path
    """The frontier plot."""

    timeline_json: Path
    """The plan's simulated iteration as a Perfetto / Chrome trace."""


def latest_job_folder(energy_dir: Path) -> Path:
    """The folder of the most recent job under ``energy_dir`` (from ``last_job.json``).

    Raises:
        ReportError: No job was recorded there.
    """
    record = energy_dir / "last_job.json"
    try:
        fingerprint = json.loads(record.read_text(encoding="utf-8"))["fingerprint"]
    except (OSError, ValueError, KeyError):
        raise ReportError(
            f"no job recorded under {energy_dir} ({record} missing or unreadable); run a training job with "
            "--energy-optimise or `megatron-energy demo` first, or pass --energy-dir"
        ) from None
    return energy_dir / fingerprint


def write_job_report(folder: Path, out_dir: Path | None = None) -> JobReport:
    """Plot and simulate the plan that ran in one cached job.

    Nothing is solved again: the table and plot show the plan file's own figures, so they are the figures
    the job ran with; the timeline simulates the plan's target point with the GPU's switch latency.

    Args:
        folder: ``<energy dir>/<fingerprint>``.
        out_dir: Where the plot and timeline go (default: ``folder``).

    Returns:
        The summary table and the files written.

    Raises:
        ReportError: The folder misses the job facts, the profile or the plan, or the plan is another job's.
    """
    out_dir = out_dir or folder
    try:
        parts = json.loads((folder / "job.json").read_text(encoding="utf-8"))["parts"]
    except (OSError, ValueError, KeyError):
        raise ReportError(f"{folder} has no readable job.json; is it a megatron_energy job folder?") from None
    if not (folder / "profile.csv").exists() or not (folder / "plan.json").exists():
        raise ReportError(f"{folder} has no profile.csv/plan.json yet: the job has not finished profiling")
    spec = load_gpu_spec(parts["gpu"])
    plan = Plan.load(folder / "plan.json", expected_fingerprint=folder.name)
    profile = Profile.from_csv(folder / "profile.csv", gpu_name=spec.name, source=plan.provenance)
    orders = pipeline_orders(
        parts["pipeline_size"],
        parts["num_microbatches"],
        parts.get("num_chunks", 1),
        microbatch_group_size=parts.get("microbatch_group_size"),
    )
    frontier_png = plot_frontier(plan, out_dir / "frontier.png")
    clocks = {
        instruction: clock
        for stage in range(plan.num_stages)
        for instruction, clock in plan.target_point.clock_table(stage).items()
    }
    dag = PipelineDag.build(orders)
    result = Simulator(dag, profile, switch_latency_s=plan.switch_latency_s).run(clocks)
    powers = StagePowers(profile.blocked_power_w, profile.idle_power_w)
    timeline_json = write_trace(result, powers, out_dir / "timeline.json")
    return JobReport(plan_table(plan), frontier_png, timeline_json)


def plan_table(plan: Plan) -> Table:
    """Stock clocks against the plan: iteration time and energy per pipeline iteration (modelled)."""
    target = plan.target_point
    return stock_vs_plan_table(
        f"plan for {plan.target}: modelled from a {plan.provenance} profile ({plan.gpu_name})",
        (plan.baseline.iteration_time_s, target.iteration_time_s),
        (plan.baseline.energy_j, target.energy_j),
        "energy per pipeline iteration (modelled)",
    )
