"""``megatron-energy report``: plan vs stock clocks, model vs measured, frontier plot, Perfetto timeline.

With ``--csv`` it exports the ``--log-file``'s records as CSV instead (``report.energy_csv``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from megatron_energy.commands.arguments import fail, output_folder
from megatron_energy.config import EnergyConfig
from megatron_energy.report.console import output_console
from megatron_energy.report.energy_csv import energy_tables, write_tables
from megatron_energy.report.job_report import ReportError, latest_job_folder, write_job_report
from megatron_energy.runtime.energy_log.energy_line import ForeignLogError

DEFAULT_ENERGY_DIR: Path = EnergyConfig.dir
"""Where the report looks without ``--energy-dir``: the training job's own default."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``report`` subcommand."""
    parser = subparsers.add_parser(
        "report",
        help="summarise a job's cached profile and plan: table, frontier plot, Perfetto timeline",
    )
    parser.add_argument(
        "--energy-dir",
        type=Path,
        default=None,
        help=f"the job's --energy-dir (default: {DEFAULT_ENERGY_DIR})",
    )
    parser.add_argument("--job", default=None, help="job fingerprint (folder name); default: the latest job")
    parser.add_argument(
        "--out", type=output_folder, default=None, help="where plot and timeline go (default: job folder)"
    )
    parser.add_argument(
        "--log-file",
        type=Path,
        default=None,
        help="the run's --energy-log-file: its savings against stock clocks (measured, or modelled on "
        "simulated GPUs) join the report",
    )
    parser.add_argument(
        "--csv",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        help="instead of the report, write the --log-file's iteration records as CSV to FILE, its run "
        "totals to FILE's stem + '-totals.csv' and its power records to FILE's stem + '-power.csv' (no FILE: "
        "all to standard output)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the report; exit status 2 with one line when the folder holds no usable job.

    A missing, truncated or corrupt file, or a GPU spec this installation does not know, is such a job.
    """
    if args.csv is not None:
        return export_csv(args.log_file, args.csv)
    console = output_console()
    try:
        energy_dir = args.energy_dir or DEFAULT_ENERGY_DIR
        given = args.energy_dir is not None
        folder = energy_dir / args.job if args.job else latest_job_folder(energy_dir, given)
        report = write_job_report(folder, args.out, args.log_file)
    except (ReportError, ForeignLogError) as problem:  # says what to do itself
        return fail("report", problem)
    except (ValueError, OSError) as problem:  # a truncated or corrupt file, an unknown GPU spec
        return fail(
            "report",
            f"cannot report on {folder}: {problem}; rerun the job (or `megatron-energy demo`) to rewrite it",
        )
    console.print(report.table)
    for line in report.model_vs_measured:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(report.frontier_line)
    console.print(f"Perfetto timeline (ui.perfetto.dev): {report.timeline_json}")
    return 0


def export_csv(log_file: Path | None, target: str) -> int:
    """Write the energy log's tables as CSV to ``target`` (``-``: standard output); one line on failure."""
    if log_file is None:
        return fail("report", "--csv exports an energy log's records: give the run's --log-file FILE too")
    try:
        tables = energy_tables(log_file)
        besides = {"totals": tables.totals, "power": tables.power}
        if target == "-":
            write_tables(tables.iterations, sys.stdout)
            for rows in besides.values():
                if rows:
                    sys.stdout.write("\n")
                    write_tables(rows, sys.stdout)
            return 0
        path = Path(target)
        with path.open("w", encoding="utf-8", newline="") as out:
            write_tables(tables.iterations, out)
        for name, rows in besides.items():
            if rows:
                with path.with_name(f"{path.stem}-{name}.csv").open("w", encoding="utf-8", newline="") as out:
                    write_tables(rows, out)
    except (ValueError, OSError) as problem:
        return fail("report", f"cannot export {log_file} as CSV: {problem}")
    return 0
