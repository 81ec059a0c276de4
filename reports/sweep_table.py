"""One row per run of a sweep: its metrics, its ratios against the baseline, and `summary.csv`.

The baseline is the strategy named by the user (a label or a strategy name), else the
`fastertransformer` preset when present, else the alphabetically first strategy; where the
candidates differ in weights, one serving `dense` weights first. A run's ratios divide its
value by the baseline run's value in the same group at the same load; they are empty where
the baseline has no such run. Quality columns come from the served weights' quality record
that the run copied into its summary (`weights`): perplexity on held-out text (float32) and
the share of greedy outputs identical to dense's, both measured by `servelab quantize`.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from servelab.base.errors import ConfigError
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.measure.summary_schema import label_of
from servelab.reports.derive import slo_attainment
from servelab.reports.grouping import Group, SweepRun
from servelab.reports.load import RunData, as_dict
from servelab.reports.run_report import REPORT_NAME, correctness_text

DEFAULT_BASELINE = "fastertransformer"

# (key, column title): a summary key's title is its label and unit in the summary schema;
# the others are derived here (per-stat latencies, weights, quality records)
METRIC_COLUMNS = (
    ("completed", label_of("completed")),
    ("failed", label_of("failed")),
    ("request_throughput", label_of("request_throughput")),
    ("output_throughput", label_of("output_throughput")),
    ("goodput", label_of("goodput")),
    ("slo_met_share", "SLO met (share of all requests)"),
    ("normalized_latency_mean", "norm. latency mean (s/token)"),
    ("normalized_latency_p99", "norm. latency p99 (s/token)"),
    ("ttft_p50", "TTFT p50 (s)"),
    ("ttft_p99", "TTFT p99 (s)"),
    ("tpot_p50", "TPOT p50 (s)"),
    ("tpot_p99", "TPOT p99 (s)"),
    ("e2e_p99", "E2E p99 (s)"),
    ("kv_waste_mean", label_of("kv_waste_mean")),
    ("mfu_mean", label_of("mfu_mean")),
    ("j_per_token", label_of("j_per_token")),
    ("weight_mib", "weights read per step (MiB)"),
    ("perplexity", "perplexity (held-out, fp32)"),
    ("greedy_agreement", "greedy = dense (share, quantize record)"),
    ("acceptance_rate", label_of("acceptance_rate")),
    ("mean_accepted_length", label_of("mean_accepted_length")),
    ("predicted_speedup", label_of("predicted_speedup")),
)
RATIO_COLUMNS = (
    ("output_throughput", "throughput ×"),
    ("goodput", "goodput ×"),
    ("normalized_latency_mean", "norm. latency ×"),
    ("ttft_p99", "TTFT p99 ×"),
)
CSV_COLUMNS = (
    "run_dir",
    "group",
    "strategy",
    "strategy_name",
    "backend",
    "rate",
    "concurrency",
    "status",
    "flags",
    *[key for key, _ in METRIC_COLUMNS],
    *[f"{key}_vs_baseline" for key, _ in RATIO_COLUMNS],
    "correctness",
    "identical_share",
)


@dataclass
class RunRow:
    """A run's values, ready for the HTML table and the CSV."""

    group: Group
    sweep_run: SweepRun
    values: dict[str, Any]


def choose_baseline(groups: list[Group], requested: str | None) -> str:
    """The baseline label: the requested label or strategy name, else the default rule."""
    runs = [r for g in groups for r in g.runs]
    labels = sorted({r.label for r in runs})
    if requested is not None:
        if requested in labels:
            return requested
        named = _dense_first([r for r in runs if r.run.strategy_name == requested])
        if named:
            return named[0]
        raise ConfigError("baseline", f"no run has strategy {requested!r}; use one of {labels}")
    if DEFAULT_BASELINE in labels:
        return DEFAULT_BASELINE
    named = _dense_first([r for r in runs if r.run.strategy_name == DEFAULT_BASELINE])
    return named[0] if named else _dense_first(runs)[0]


def _dense_first(runs: list[SweepRun]) -> list[str]:
    """The runs' labels, sorted, those serving dense weights (or not saying) first."""
    dense = {r.label for r in runs if r.run.strategy.get("weights", "dense") == "dense"}
    return sorted({r.label for r in runs}, key=lambda label: (label not in dense, label))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def run_values(group: Group, sweep_run: SweepRun) -> dict[str, Any]:
    """The metric values of one run (None where not recorded)."""
    run = sweep_run.run
    summary = run.summary or {}
    values: dict[str, Any] = {
        "run_dir": str(run.path),
        "group": group.title,
        "strategy": sweep_run.label,
        "strategy_name": run.strategy_name,
        "backend": str(run.config.get("backend") or "inprocess"),
        # an offline run's workload may still carry its preset's rate: not its load
        "rate": _number(run.arrival.get("rate")) if group.x_kind == "rate" else None,
        "concurrency": _number(run.arrival.get("concurrency")),
        "status": run.status,
        "flags": "; ".join(summary.get("flags") or []),
    }
    for key in ("completed", "failed"):
        count = _number(summary.get(key))
        values[key] = None if count is None else int(count)
    for key in ("request_throughput", "output_throughput", "goodput"):
        values[key] = _number(summary.get(key))
    for key in (
        "kv_waste_mean",
        "mfu_mean",
        "j_per_token",
        "acceptance_rate",
        "mean_accepted_length",
        "predicted_speedup",
    ):
        values[key] = _number(summary.get(key))
    values["normalized_latency_mean"] = _number(
        as_dict(summary.get("normalized_latency")).get("mean")
    )
    for metric in ("normalized_latency", "ttft", "tpot", "e2e"):
        values[f"{metric}_p99"] = _number(as_dict(summary.get(metric)).get("p99"))
    for metric in ("ttft", "tpot"):
        values[f"{metric}_p50"] = _number(as_dict(summary.get(metric)).get("p50"))
    slo = SLO.of_record(run.slo)
    share = run.summary.get("slo_attainment") if run.summary else None
    if share is None and slo is not None and slo.configured and run.request_records:
        share = slo_attainment(run.request_records, slo)
    values["slo_met_share"] = share if slo is not None and slo.configured else None
    weights = as_dict(summary.get("weights"))
    weight_bytes = _number(weights.get("weight_bytes"))
    values["weight_mib"] = None if weight_bytes is None else weight_bytes / 2**20
    values["perplexity"] = _number(weights.get("perplexity_fp32"))
    values["greedy_agreement"] = _number(weights.get("greedy_agreement"))
    correctness = summary.get("correctness")
    values["correctness"] = correctness_text(correctness) if isinstance(correctness, dict) else None
    share_identical = as_dict(correctness).get("identical_share")
    values["identical_share"] = _number(share_identical)
    return values


def run_rows(groups: list[Group], baseline: str) -> list[RunRow]:
    """Every run's row, ratios against the baseline's run in the same group at the same load."""
    rows: list[RunRow] = []
    for group in groups:
        values = {id(r): run_values(group, r) for r in group.runs}
        for sweep_run in sorted(group.runs, key=_strategy_then_load):
            row = values[id(sweep_run)]
            reference_run = next(
                (
                    r
                    for r in group.runs
                    if r.label == baseline and r.x == sweep_run.x and r.run.complete
                ),
                None,
            )
            reference = None if reference_run is None else values[id(reference_run)]
            if row["identical_share"] is None and reference_run is not None:
                share = identical_share(sweep_run.run, reference_run.run)
                if share is not None:
                    row["identical_share"] = share
                    row["correctness"] = f"greedy outputs vs {baseline}: {share:.1%} identical"
            for key, _ in RATIO_COLUMNS:
                row[f"{key}_vs_baseline"] = _ratio(row.get(key), reference, key)
            rows.append(RunRow(group, sweep_run, row))
    return rows


def _strategy_then_load(sweep_run: SweepRun) -> tuple[str, float, str]:
    """Rows by strategy, then by load as a number (not as text: 2 before 10)."""
    load = math.inf if sweep_run.x is None else sweep_run.x
    return sweep_run.label, load, str(sweep_run.run.path)


def identical_share(run: RunData, reference: RunData) -> float | None:
    """Share of requests whose output tokens equal the reference run's, when that comparison
    means something: both complete, the same requests (workload hash), greedy, same dtype."""
    if not (run.complete and reference.complete):
        return None
    config, reference_config = as_dict(run.config), as_dict(reference.config)
    same_load = as_dict(run.summary).get("workload_hash") == as_dict(reference.summary).get(
        "workload_hash"
    )
    sampling = as_dict(as_dict(config.get("workload")).get("sampling"))
    greedy = float(sampling.get("temperature") or 0.0) == 0.0
    dtype = as_dict(config.get("engine")).get("dtype")
    same_dtype = dtype == as_dict(reference_config.get("engine")).get("dtype")
    if not (same_load and greedy and same_dtype):
        return None
    if not run.request_records:
        return None
    expected = {r.id: r.output_ids for r in reference.request_records}
    matches = [expected.get(r.id) == r.output_ids for r in run.request_records]
    return sum(matches) / len(matches)


def _ratio(value: float | None, reference: dict[str, Any] | None, key: str) -> float | None:
    if value is None or reference is None:
        return None
    base = reference.get(key)
    return value / base if base else None


def write_csv(rows: list[RunRow], path: Path) -> Path:
    """Write `summary.csv`: one row per run, raw numbers, the columns in `CSV_COLUMNS`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: "" if row.values.get(k) is None else row.values[k] for k in CSV_COLUMNS}
            )
    return path


def report_link(row: RunRow, out_dir: Path) -> str | None:
    """The run's own report, relative to the sweep report, when it exists."""
    report = row.sweep_run.run.path / REPORT_NAME
    if not report.is_file():
        return None
    return quote(Path(os.path.relpath(report.resolve(), out_dir.resolve())).as_posix())
