"""What ``megatron-energy demo`` shows and writes: the run's summary, the plan report, plot and timeline."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from megatron_energy.demo import DemoSettings, DemoSummary
from megatron_energy.report.job_report import latest_job_folder, write_job_report


def demo_table(settings: DemoSettings, summary: DemoSummary) -> Table:
    """Stock clocks (profiling) against the plan (run phase), whole job, simulated GPUs: modelled."""
    table = Table(
        title=(
            f"demo: {settings.model} stage work on simulated {settings.gpu_spec}, "
            f"PP={settings.pipeline_size}, {settings.num_microbatches} microbatches, target {settings.target} (all figures modelled)"
        )
    )
    for column in ("", "stock clocks", "plan", "change"):
        table.add_column(column, justify="right")
    table.add_row(
        "iteration time (modelled)",
        f"{1e3 * summary.stock_iteration_s:.1f} ms",
        f"{1e3 * summary.planned_iteration_s:.1f} ms",
        f"{100 * summary.slowdown:+.2f}%",
    )
    table.add_row(
        "energy per iteration, all GPUs (modelled)",
        f"{summary.stock_energy_j:.1f} J",
        f"{summary.planned_energy_j:.1f} J",
        f"{-100 * summary.saving:+.2f}%",
    )
    return table


def write_demo_outputs(settings: DemoSettings, summary: DemoSummary, console: Console | None = None) -> None:
    """Print the demo's summary and the plan report; write the frontier plot and the Perfetto timeline."""
    console = console or Console()
    console.print(demo_table(settings, summary))
    report = write_job_report(latest_job_folder(settings.energy_dir))
    console.print(report.table)
    console.print(f"frontier plot: {report.frontier_png}")
    console.print(f"Perfetto timeline of the plan (open in ui.perfetto.dev): {report.timeline_json}")
