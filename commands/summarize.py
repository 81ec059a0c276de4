"""`servelab summarize DIR...`: rebuild summary.json and report.html from a run's records."""

from __future__ import annotations

from pathlib import Path

from servelab.base.errors import ConfigError

SUMMARY = "rebuild a run's summary and report from its records (a run killed mid-way)"
USAGE = """usage: servelab summarize DIR [DIR ...]

For each run directory: recompute summary.json from requests.jsonl, steps.jsonl and
telemetry.csv, and redraw report.html. A run that never wrote its own summary is marked
incomplete and flagged (gates refuse it; a restarted sweep redoes it)."""


def main(args: list[str]) -> None:
    from servelab.harness.run.summary import summarize_run
    from servelab.reports.run_report import write_run_report

    if not args:
        raise ConfigError("summarize", USAGE.splitlines()[0])
    for arg in args:
        run_dir = Path(arg)
        summary = summarize_run(run_dir)
        write_run_report(run_dir)
        flags = "; ".join(summary["flags"]) or "none"
        print(
            f"{run_dir}: {summary['status']}, {summary['completed']} completed, "
            f"{summary['failed']} failed; flags: {flags}"
        )
