"""Build a sweep's `report.html` and `summary.csv` from any run or sweep directories.

Per group of comparable runs (see `reports.grouping`): curves per strategy against load,
each strategy's knee under the SLO with its interval (`reports.sustain`, the search's
estimator), then one table of every run with its ratios against the baseline strategy and its
correctness record. `summary.csv` beside the page holds the same rows as raw numbers.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from servelab.base.errors import ConfigError
from servelab.harness.search.text import rate_text
from servelab.reports.colors import assign_colors
from servelab.reports.grouping import X_TITLES, Group, group_runs
from servelab.reports.html import Cell, Link, Page, Swatch, table_html
from servelab.reports.load import find_run_dirs, load_run
from servelab.reports.search_report import add_search_section, search_record, strategy_dirs
from servelab.reports.sustain import Sustained, group_slo, sustained_loads
from servelab.reports.sweep_figures import group_figures
from servelab.reports.sweep_table import (
    METRIC_COLUMNS,
    RATIO_COLUMNS,
    RunRow,
    choose_baseline,
    report_link,
    run_rows,
    write_csv,
)

CSV_NAME = "summary.csv"


def build_sweep_report(paths: list[Path], out: Path, baseline: str | None = None) -> Path:
    """Write the sweep report to `out` and `summary.csv` beside it; return the report's path.
    A knee search's directory (with its `search.json`) opens the page with its answer
    (`reports.search_report`) and gives its strategies' probes as the runs."""
    searches = [(path, record) for path in paths if (record := search_record(path))]
    searched = {path for path, _ in searches}
    paths = [
        *(d for path, record in searches for d in strategy_dirs(path, record)),
        *(path for path in paths if path not in searched),
    ]
    run_dirs = find_run_dirs(paths)
    if not run_dirs:
        shown = ", ".join(str(p) for p in paths)
        raise ConfigError(
            "paths", f"no run directories (with summary.json or requests.jsonl) under {shown}"
        )
    runs = [load_run(d) for d in run_dirs]
    groups = group_runs(runs)
    baseline_label = choose_baseline(groups, baseline)
    colors = assign_colors(r.label for g in groups for r in g.runs)
    rows = run_rows(groups, baseline_label)
    csv_path = write_csv(rows, out.parent / CSV_NAME)

    page = Page("Knee search report" if searches else "Sweep report")
    for path, record in searches:
        add_search_section(page, path, record)
    statuses = Counter(r.status for r in runs)
    counts = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    page.paragraph(
        f"{len(runs)} runs ({counts}) in "
        f"{len(groups)} group(s); baseline strategy: {baseline_label}. "
        f"Raw numbers: {csv_path.name}.",
        "note",
    )
    for group in groups:
        _group_section(page, group, colors)
    page.heading("All runs")
    page.paragraph(
        f"Ratios (×) divide each run's value by the {baseline_label} run in the same group at "
        "the same load; throughput and goodput above 1 and latency below 1 are better.",
        "note",
    )
    page.tables([_runs_table(rows, colors, out.parent)])
    return page.write(out)


def _group_section(page: Page, group: Group, colors: dict[str, str]) -> None:
    page.heading(group.title)
    incomplete = [r for r in group.runs if not r.run.complete]
    if incomplete:
        page.paragraph(
            f"{len(incomplete)} run(s) in this group failed or did not finish; the figures "
            "leave them out.",
            "warn",
        )
    for sweep_run in group.runs:
        summary = sweep_run.run.summary or {}
        for flag in summary.get("flags") or []:
            where = f"{sweep_run.label} ({sweep_run.run.path.name})"
            page.paragraph(f"Flagged: {where}: {flag}", "warn")
    slo = group_slo(group)
    if slo is None:
        page.paragraph("No SLO configured: no sustained load to report.", "note")
    elif group.x_kind == "none":
        page.paragraph("These runs have no rate or concurrency: no sustained load.", "note")
    else:
        page.paragraph(
            "Knee: the load at which the strategy's runs stop meeting the SLO, fitted on every "
            "complete run's requests as servelab search fits it (where the attainment-quantile "
            "of their SLO ratios crosses 1), with its 95% interval ('-': the runs do not bound "
            f"that side). {slo.describe()}",
            "note",
        )
        sustained = sustained_loads(group)
        unit = X_TITLES[group.x_kind]
        page.tables(
            [
                table_html(
                    ["strategy", f"knee, {unit}", "95% interval", "loads tested"],
                    [_sustained_row(s, colors) for s in sustained],
                    "Sustained load under the SLO",
                )
            ]
        )
    page.figures(group_figures(group, colors))


def _sustained_row(sustained: Sustained, colors: dict[str, str]) -> list[Cell]:
    knee = sustained.knee
    where = rate_text(knee.estimate)  # '-' where the fit does not cross 1 between two loads
    if knee.cliff:
        where = f"a cliff between {rate_text(knee.below)} and {rate_text(knee.above)}"
    interval = f"[{rate_text(knee.low)}, {rate_text(knee.high)}]"
    tested = ", ".join(f"{x:g}" for x in sustained.tested)
    return [Swatch(sustained.label, colors[sustained.label]), where, interval, tested]


def _runs_table(rows: list[RunRow], colors: dict[str, str], out_dir: Path) -> str:
    headers = [
        "run",
        "group",
        "strategy",
        "backend",
        "rate (req/s)",
        "concurrency",
        "status",
        "flags",
        *[title for _, title in METRIC_COLUMNS],
        *[title for _, title in RATIO_COLUMNS],
        "correctness",
    ]
    body: list[list[Cell]] = []
    for row in rows:
        values = row.values
        name = os.path.relpath(row.sweep_run.run.path, out_dir)
        link = report_link(row, out_dir)
        body.append(
            [
                Link(name, link) if link else name,
                values["group"],
                Swatch(values["strategy"], colors[values["strategy"]]),
                values["backend"],
                values["rate"],
                values["concurrency"],
                values["status"],
                values["flags"] or "–",
                *[values[key] for key, _ in METRIC_COLUMNS],
                *[values[f"{key}_vs_baseline"] for key, _ in RATIO_COLUMNS],
                values["correctness"],
            ]
        )
    return table_html(headers, body)
