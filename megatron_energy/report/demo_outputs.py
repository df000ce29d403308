"""What ``megatron-energy demo`` shows and writes: the run's summary, the plan report, plot and timeline."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from megatron_energy.commands.demo_run import DemoSettings, DemoSummary
from megatron_energy.report.job_report import latest_job_folder, write_job_report
from megatron_energy.report.tables import stock_vs_plan_table


def demo_table(settings: DemoSettings, summary: DemoSummary) -> Table:
    """Stock clocks (profiling) against the plan (run phase), whole job, simulated GPUs: modelled."""
    return stock_vs_plan_table(
        f"demo: {settings.model} stage work on simulated {settings.gpu_spec}, PP={settings.pipeline_size}, "
        f"{settings.num_microbatches} microbatches, target {settings.target} (all figures modelled)",
        (summary.stock_iteration_s, summary.planned_iteration_s),
        (summary.stock_energy_j, summary.planned_energy_j),
        "energy per iteration, all GPUs (modelled)",
    )


def write_demo_outputs(settings: DemoSettings, summary: DemoSummary, console: Console | None = None) -> None:
    """Print the demo's summary and the plan report; write the frontier plot and the Perfetto timeline."""
    console = console or Console()
    console.print(demo_table(settings, summary))
    report = write_job_report(latest_job_folder(settings.energy_dir))
    console.print(report.table)
    console.print(f"frontier plot: {report.frontier_png}")
    console.print(f"Perfetto timeline of the plan (open in ui.perfetto.dev): {report.timeline_json}")
