"""Report on one cached job under ``--energy-dir``: its plan against stock clocks, frontier plot, timeline.

The job folder (``<energy dir>/<fingerprint>``) holds ``job.json`` (the job facts), ``profile.csv``,
``plan.json`` and ``baseline.json``. The table and the plot show the plan file's figures (the plan that ran;
nothing is solved again); the plan's target point is simulated for the timeline. Those figures are modelled
from the profile, whose own source (measured, modelled or simulated) is named. The "model vs measured at
stock clocks" section (``report.model_vs_measured``) sets the stock plan's prediction against the measured
stock steps, and states the run's savings (measured, or modelled on simulated GPUs) with their intervals
when the energy log is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from megatron_energy.energy_dir import LAST_JOB, JobFiles, latest_fingerprint
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.plan import Plan
from megatron_energy.plan_outcome import saving_text, why_nothing_found
from megatron_energy.report.frontier_plot import plot_frontier
from megatron_energy.report.job_folder import ReportError, read_job_folder
from megatron_energy.report.model_vs_measured import model_vs_measured_lines
from megatron_energy.report.tables import ComparisonRow, comparison_table
from megatron_energy.sim.simulator import Simulator, StagePowers
from megatron_energy.sim.trace import write_trace


@dataclass(frozen=True)
class JobReport:
    """What ``write_job_report`` produced."""

    table: Table
    """Stock clocks against the plan (modelled)."""

    frontier_png: Path | None
    """The frontier plot; ``None`` when the plan swept no frontier (nothing to draw)."""

    timeline_json: Path
    """The plan's simulated iteration as a Perfetto / Chrome trace."""

    model_vs_measured: tuple[str, ...] = ()
    """The "model vs measured at stock clocks" section, line by line."""

    nothing_found: str | None = None
    """Why the plan saves nothing (``plan_outcome.why_nothing_found``); ``None`` when it saves."""

    @property
    def frontier_line(self) -> str:
        """The line that names the frontier plot, or says why none was drawn."""
        if self.frontier_png is not None:
            return f"frontier plot (modelled): {self.frontier_png}"
        why = "" if self.nothing_found is None else f"; {self.nothing_found}"
        return (
            f"frontier plot: none drawn (the plan swept no frontier: its instruction clocks are stock{why})"
        )


def latest_job_folder(energy_dir: Path, dir_was_given: bool = True) -> Path:
    """The folder of the most recent job under ``energy_dir`` (from ``last_job.json``).

    Args:
        energy_dir: The energy directory.
        dir_was_given: Whether the user named ``energy_dir`` (``--energy-dir``); only when they did not does
            the error suggest passing it.

    Raises:
        ReportError: No job was recorded there.
    """
    record = energy_dir / LAST_JOB
    try:
        fingerprint = latest_fingerprint(energy_dir)
    except (OSError, ValueError):
        other_dir = "" if dir_was_given else ", or pass the job's --energy-dir"
        raise ReportError(
            f"no job recorded under {energy_dir} ({record} missing or unreadable); run a training job with "
            f"--energy-optimise or `megatron-energy demo` first{other_dir}"
        ) from None
    return energy_dir / fingerprint


def write_job_report(folder: Path, out_dir: Path | None = None, log_file: Path | None = None) -> JobReport:
    """Plot and simulate the plan that ran in one cached job.

    Nothing is solved again: the table and plot show the plan file's own figures, so they are the figures
    the job ran with; the timeline simulates the plan's target point with the GPU's switch latency.

    Args:
        folder: ``<energy dir>/<fingerprint>``.
        out_dir: Where the plot and timeline go (default: ``folder``).
        log_file: The run's ``--energy-log-file`` (for its savings against stock clocks), or None.

    Returns:
        The summary table and the files written.

    Raises:
        ReportError: The folder misses the job facts, the profile or the plan, or the plan is another job's.
    """
    out = JobFiles(out_dir or folder)
    job = read_job_folder(folder)
    plan, profile = job.plan, job.profile
    frontier_png = plot_frontier(plan, out.frontier_plot) if plan.frontier else None
    clocks = {
        instruction: clock
        for stage in range(plan.num_stages)
        for instruction, clock in plan.target_point.step_clocks(stage).items()
    }
    dag = PipelineDag.build(job.orders)
    result = Simulator(dag, profile, switch_latency_s=plan.switch_latency_s).run(clocks)
    powers = StagePowers(profile.blocked_power_w, profile.idle_power_w)
    timeline_json = write_trace(result, powers, out.timeline)
    section = tuple(model_vs_measured_lines(folder, plan, log_file))
    return JobReport(plan_table(plan), frontier_png, timeline_json, section, why_nothing_found(plan))


def plan_table(plan: Plan) -> Table:
    """Stock clocks against the plan: iteration time and energy per pipeline iteration (modelled).

    The energy's change is the plan's saving with its band (``plan_outcome.saving_text``).
    """
    target, baseline = plan.target_point, plan.baseline
    return comparison_table(
        f"plan for {plan.target}: modelled from a {plan.provenance} profile ({plan.gpu_name})",
        [
            ComparisonRow(
                "iteration time (modelled)", baseline.iteration_time_s, target.iteration_time_s, "ms"
            ),
            ComparisonRow(
                "energy per pipeline iteration (modelled)",
                baseline.energy_j,
                target.energy_j,
                "J",
                saving_text(plan),
            ),
        ],
    )
