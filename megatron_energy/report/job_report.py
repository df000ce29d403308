"""Report on one cached job under ``--energy-dir``: its plan against stock clocks, frontier plot, timeline.

The job folder (``<energy dir>/<fingerprint>``) holds ``job.json`` (the job facts), ``profile.csv`` and
``plan.json``. The frontier is solved again from the profile (fast), the plan is simulated for the timeline;
every figure here is modelled from the profile, whose own source (measured or modelled) is named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from megatron_energy.config import parse_target
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.megatron.schedule import pipeline_orders
from megatron_energy.perseus.planner import Planner
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan
from megatron_energy.report.frontier_plot import plot_frontier
from megatron_energy.report.tables import stock_vs_plan_table
from megatron_energy.sim.simulator import Simulator, StagePowers
from megatron_energy.sim.trace import write_trace


class ReportError(ValueError):
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
    """Solve, plot and simulate one cached job.

    Args:
        folder: ``<energy dir>/<fingerprint>``.
        out_dir: Where the plot and timeline go (default: ``folder``).

    Returns:
        The summary table and the files written.

    Raises:
        ReportError: The folder misses the job facts, the profile or the plan.
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
    num_chunks = parts.get("num_chunks", 1)
    orders = pipeline_orders(parts["pipeline_size"], parts["num_microbatches"], num_chunks)
    dag = PipelineDag.build(orders, num_chunks=num_chunks)
    planner = Planner(dag, profile, fingerprint=folder.name, switch_latency_s=spec.switch_latency_s)
    chosen = planner.point(parse_target(plan.target))
    frontier_png = plot_frontier(planner.frontier, chosen, profile, out_dir / "frontier.png")
    clocks = {
        (step.kind, stage, step.chunk, step.microbatch): step.clock_mhz
        for stage in range(plan.num_stages)
        for step in plan.rank_clocks(stage)
    }
    result = Simulator(dag, profile, switch_latency_s=spec.switch_latency_s).run(clocks)
    powers = StagePowers(profile.blocked_power_w, profile.idle_power_w)
    timeline_json = write_trace(result, powers, out_dir / "timeline.json")
    return JobReport(plan_table(plan, profile), frontier_png, timeline_json)


def plan_table(plan: Plan, profile: Profile) -> Table:
    """Stock clocks against the plan: iteration time and energy per pipeline iteration (modelled)."""
    prediction = plan.prediction
    return stock_vs_plan_table(
        f"plan for {plan.target}: modelled from a {profile.source} profile ({plan.gpu_name})",
        (prediction.baseline_time_s, prediction.iteration_time_s),
        (prediction.baseline_energy_j, prediction.energy_j),
        "energy per pipeline iteration (modelled)",
    )
