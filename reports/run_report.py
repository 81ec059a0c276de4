"""Build one run's `report.html`: its results first (headline figures, latency CDFs), then
every other figure the run has data for, then the configuration and machine it ran on.

Reads the run directory only (see `reports.load`). A run without `summary.json` (it
crashed) still gets a report: its summary is recomputed from the records with the harness's
own metric functions, and a warning at the top says so. Flags the summary raised, and any
step whose MFU or MBU exceeds 1 (a peak measured too low), are shown at the top.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import plotly.graph_objects as go

from servelab.harness.measure.rundir import RunRecords
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.measure.summary_schema import LATENCY_METRICS, METRICS, STAT_KEYS
from servelab.reports.colors import assign_colors
from servelab.reports.derive import (
    ThinnedSteps,
    request_metrics,
    slo_attainment,
    step_metrics,
    summary_from_records,
)
from servelab.reports.html import Cell, Page, table_html
from servelab.reports.load import RunData, as_dict, load_run
from servelab.reports.run_figures import (
    acceptance_figure,
    batch_figure,
    kv_figure,
    latency_cdfs,
    request_timeline,
    roofline_figure,
    telemetry_figure,
    tokens_figure,
    utilization_figure,
)

REPORT_NAME = "report.html"
STEP_POINTS = 4000  # per step figure: past this, steps are averaged in groups (ThinnedSteps)
META_ROWS = 40

THROUGHPUT_ROWS = tuple(  # (key, label, unit), from the summary schema
    (name, METRICS[name].label, METRICS[name].unit)
    for name in (
        "completed",
        "failed",
        "duration_s",
        "request_throughput",
        "output_throughput",
        "total_throughput",
        "goodput",
        "kv_waste_mean",
        "slo_attainment",
        "peak_running",
        "preemptions",
        "pad_tokens",
        "excluded",
        "steps",
        "model_time_share",
        "mfu_mean",
        "mbu_mean",
        "acceptance_rate",
        "mean_accepted_length",
        "draft_cost_ratio",
        "predicted_speedup",
        "energy_j",
        "j_per_token",
    )
)


Config = TypeVar("Config")


def write_run_report(run_dir: Path) -> None:
    """The report.html of a run whose summary is written, drawn for the command that asked
    for the run; one that cannot be drawn is a warning, never a failure (the run's
    measurements are on disk already)."""
    try:
        build_run_report(run_dir)
    except Exception as exc:  # noqa: BLE001
        logging.getLogger(__name__).warning("report.html not written: %s", exc)


def reported(run: Callable[[Config, Path], dict]) -> Callable[[Config, Path], dict]:
    """`run` (a configuration into a run directory, its summary back), then the run's report."""

    def run_and_report(cfg: Config, run_dir: Path) -> dict:
        summary = run(cfg, run_dir)
        write_run_report(run_dir)
        return summary

    return run_and_report


def build_run_report(
    run_dir: Path, out: Path | None = None, records: RunRecords | None = None
) -> Path:
    """Write the report of the run in `run_dir` (default `run_dir/report.html`); return its path.
    `records`: the run's records when they were read already."""
    run = load_run(run_dir, records)
    page = Page(f"Run report: {run.strategy_name} on {run.workload_name}")
    summary = _summary(run, page)
    metrics = request_metrics(run.request_records) if run.request_records else None
    _results_section(page, run, summary, metrics)
    _figures_section(page, run, metrics, summary)
    _configuration_section(page, run)
    return page.write(out or run_dir / REPORT_NAME)


def _summary(run: RunData, page: Page) -> dict[str, Any]:
    page.paragraph(f"Run directory: {run.path}", "note")
    for problem in run.problems:
        page.paragraph(problem, "warn")
    if run.summary is not None:
        if run.summary.get("error"):
            page.paragraph(f"The run failed: {run.summary['error']}", "warn")
        summary = run.summary
    elif not run.request_records:
        summary = {}
    else:
        page.paragraph(
            "Summary recomputed from the records (the run wrote no summary.json).", "warn"
        )
        summary = summary_from_records(
            run.request_records, run.step_records, SLO.of_record(run.slo) or SLO()
        )
    for flag in summary.get("flags") or []:
        page.paragraph(f"Flagged: {flag}", "warn")
    over = over_peak_steps(run)
    if over:
        page.paragraph(
            f"{over} step(s) exceed an MFU or MBU of 1: the calibrated peak in use was "
            "measured too low (run servelab calibrate --refresh on a quiet machine).",
            "warn",
        )
    return summary


def over_peak_steps(run: RunData) -> int:
    """Steps whose MFU or MBU exceeds 1."""
    return sum(
        1
        for step in run.step_records
        if max(step.counters.get("mfu", 0.0), step.counters.get("mbu", 0.0)) > 1
    )


def _results_section(
    page: Page, run: RunData, summary: dict[str, Any], metrics: pd.DataFrame | None
) -> None:
    page.heading("Results")
    tables = [
        table_html(["metric", "value", "unit"], _throughput_rows(summary), "Throughput"),
        table_html(["metric", *STAT_KEYS], _latency_rows(summary), "Latency (s), from arrival"),
    ]
    slo_rows = _slo_rows(run)
    if slo_rows:
        tables.append(table_html(["SLO", "value"], slo_rows, "Service-level objective"))
    generator = load_generator_rows(as_dict(summary.get("load_generator")))
    if generator:
        tables.append(table_html(["load generator", "value"], generator, "Load generator"))
    page.tables(tables)
    label = run.strategy_name
    if metrics is None:
        page.paragraph("No requests recorded.", "warn")
    else:
        page.figures(latency_cdfs(metrics, label, assign_colors([label])[label]))


def _configuration_section(page: Page, run: RunData) -> None:
    page.heading("Configuration and machine")
    tables = [table_html(["setting", "value"], _run_rows(run), "Run")]
    meta_rows = _meta_rows(run.meta)
    if meta_rows:
        tables.append(table_html(["field", "value"], meta_rows, "Machine and versions"))
    page.tables(tables)


def _run_rows(run: RunData) -> list[list[Cell]]:
    rows: list[list[Cell]] = [["status", run.status]]
    rows += [[f"strategy.{k}", _text(v)] for k, v in run.strategy.items()]
    rows += [[f"workload.{k}", _text(v)] for k, v in run.workload.items() if k != "arrival"]
    rows += [[f"workload.arrival.{k}", _text(v)] for k, v in run.arrival.items()]
    rows.append(["model", run.model_name])
    return rows


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return "–" if value is None else str(value)


def _throughput_rows(summary: dict[str, Any]) -> list[list[Cell]]:
    rows: list[list[Cell]] = []
    for key, label, unit in THROUGHPUT_ROWS:
        value = summary.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            rows.append([label, value, unit])
    correctness = summary.get("correctness")
    if isinstance(correctness, dict):
        rows.append(["correctness", correctness_text(correctness), ""])
    return rows + _weights_rows(as_dict(summary.get("weights")))


def _weights_rows(weights: dict[str, Any]) -> list[list[Cell]]:
    """The served weights: option, bytes read per step and their recorded quality."""
    if not weights:
        return []
    rows: list[list[Cell]] = [["weights", str(weights.get("option")), ""]]
    if isinstance(weights.get("weight_bytes"), int):
        rows.append(["weights read per step", weights["weight_bytes"] / 2**20, "MiB"])
    if isinstance(weights.get("perplexity_fp32"), int | float):
        rows.append(["perplexity on held-out text (fp32)", weights["perplexity_fp32"], ""])
    if isinstance(weights.get("greedy_agreement"), int | float):
        rows.append(["greedy outputs identical to dense", weights["greedy_agreement"], "share"])
    return rows


def correctness_text(correctness: dict[str, Any]) -> str:
    """One line for a correctness record: its check, the identical share, other scalar fields."""
    parts = [str(correctness.get("check", "check"))]
    share = correctness.get("identical_share")
    if isinstance(share, int | float):
        parts.append(f"{share:.1%} identical")
    for key, value in correctness.items():
        if key not in ("check", "identical_share") and isinstance(value, str | int | float | bool):
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def _latency_rows(summary: dict[str, Any]) -> list[list[Cell]]:
    rows: list[list[Cell]] = []
    for metric in LATENCY_METRICS:
        values = as_dict(summary.get(metric))
        if values:
            rows.append([metric, *[_float(values.get(k)) for k in STAT_KEYS]])
    return rows


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def load_generator_rows(section: dict[str, Any]) -> list[list[Cell]]:
    """Whether the client sent the configured arrivals (`harness.measure.load_generator`)."""
    if not section:
        return []
    late_ms = 1000 * float(section.get("late_s") or 0.0)
    rows: list[list[Cell]] = [
        ["arrivals", str(section.get("process"))],
        ["configured rate (req/s)", _float(section.get("configured_rate"))],
        ["achieved rate (req/s)", _float(section.get("achieved_rate"))],
        ["requests sent", _float(section.get("sent"))],
    ]
    for key, label in (("lag_p50_s", "p50"), ("lag_p99_s", "p99"), ("lag_max_s", "max")):
        value = _float(section.get(key))
        rows.append([f"send lag {label} (ms)", None if value is None else 1000 * value])
    rows.append([f"share sent over {late_ms:g} ms late", _float(section.get("late_share"))])
    rows.append([f"gaps over {late_ms:g} ms against the configured process: KS p-value",
                 _float(section.get("ks_p_value"))])  # fmt: skip
    return rows


def _slo_rows(run: RunData) -> list[list[Cell]]:
    slo = SLO.of_record(run.slo)
    if slo is None or not slo.configured:
        return []
    rows: list[list[Cell]] = [["rule", slo.describe()]]
    share = slo_attainment(run.request_records, slo)
    rows.append(["requests meeting the SLO", share])
    sustained = slo.sustains(share)
    rows.append(["sustains its load", "–" if sustained is None else ("yes" if sustained else "no")])
    return rows


def _meta_rows(meta: dict[str, Any]) -> list[list[Cell]]:
    rows: list[list[Cell]] = []
    for key, value in _flatten(meta):
        if isinstance(value, int | float) and not isinstance(value, bool):
            rows.append([key, value])
        elif isinstance(value, str | bool):
            rows.append([key, _text(value)])
    return rows[:META_ROWS]


def _flatten(value: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, inner in value.items():
        name = f"{prefix}{key}"
        if isinstance(inner, dict):
            items += _flatten(inner, f"{name}.")
        else:
            items.append((name, inner))
    return items


def _figures_section(
    page: Page, run: RunData, metrics: pd.DataFrame | None, summary: dict[str, Any]
) -> None:
    if metrics is not None:
        page.heading("Requests over time")
        page.figures([request_timeline(metrics, run.requests)], wide=True)
    steps = step_metrics(run.steps)
    page.heading("Engine steps")
    if steps.empty:
        page.paragraph("No steps recorded.", "warn")
    else:
        thinned = ThinnedSteps.of(steps, STEP_POINTS)
        if thinned.group > 1:
            page.paragraph(
                f"{len(steps):,} steps: the figures over time show the mean of each "
                f"{thinned.group:,} consecutive steps, the roofline one step in every "
                f"{thinned.group:,}; the summary counts every step.",
                "note",
            )
        over_time = thinned.over_time
        figures: list[go.Figure | None] = [
            batch_figure(over_time),
            tokens_figure(over_time),
            kv_figure(over_time),
            utilization_figure(over_time),
            roofline_figure(thinned.sampled, as_dict(run.meta.get("peaks"))),
            acceptance_figure(summary.get("acceptance_histogram") or []),
        ]
        page.figures([f for f in figures if f is not None])
    page.heading("Telemetry")
    telemetry = telemetry_figure(run.telemetry)
    if telemetry is None:
        page.paragraph(
            "No telemetry recorded (telemetry.csv missing, empty or without a time column).", "note"
        )
    else:
        page.figures([telemetry], wide=True)
    server = telemetry_figure(run.server_metrics, "The server's metrics over time")
    if server is not None:  # an endpoint run, against a server publishing them
        page.figures([server], wide=True)
