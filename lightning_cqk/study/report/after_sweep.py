"""What the `sweep` command does once its runs are done (cli/main.py calls it with the runner's SweepOutcome): after
a dry run's estimate, the claims' power plan; after the runs, the report; then the exit status (the failed runs
named, or 1 when the report could not be written)."""

from __future__ import annotations

import sys

from lightning_cqk.study.judge.power_plan import power_lines
from lightning_cqk.study.run.runner import SweepOutcome


def after_sweep(outcome: SweepOutcome) -> None:
    """Print the power plan or write the report the outcome asks for, then exit as the sweep should."""
    if outcome.power_plan and outcome.sweep is not None:
        lines = power_lines(outcome.sweep)
        if lines:
            print("\n".join(lines))
    report_failed = False
    if outcome.report and outcome.sweep is not None:
        from lightning_cqk.study.report.report_command import ReportError, write_report

        try:
            write_report(outcome.sweep.sweep_dir)
        except ReportError as err:  # e.g. a full disk: the runs are kept, the report is not half written
            print(f"lightning_cqk sweep: no report: {err}", file=sys.stderr, flush=True)
            report_failed = True
    if outcome.failed:
        sys.exit(f"lightning_cqk sweep: {len(outcome.failed)} run(s) failed: {', '.join(outcome.failed)}")
    if report_failed:
        sys.exit(1)
