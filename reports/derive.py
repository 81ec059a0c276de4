"""Per-request and per-step figures derived from raw records, with DESIGN.md's definitions.

The summary holds the run's aggregate metrics; figures (CDFs, timelines, SLO attainment)
need them per request, and crashed runs have no summary at all, so the same definitions
are applied here to `requests.jsonl` and `steps.jsonl`:
TTFT = first token − t_send, E2E = last token − t_send, TPOT = (E2E − TTFT)/(n − 1) for
n > 1, normalized latency = E2E / n; only successful requests not marked `excluded` count.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from harness.measure.metrics import distribution

OK_FINISH = ("stop", "length")
STAT_KEYS = ("mean", "std", "p50", "p90", "p95", "p99")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e", "normalized_latency")
SLO_FIELDS = {"ttft_s": "ttft", "tpot_s": "tpot", "e2e_s": "e2e"}

REQUEST_COLUMNS = [
    "id",
    "t_scheduled",
    "t_send",
    "t_first",
    "t_last",
    "prompt_len",
    "output_tokens",
    "ttft",
    "tpot",
    "e2e",
    "normalized_latency",
    "preemptions",
    "ok",
    "excluded",
]


def request_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per request with its timings; `ok` marks those that count in metrics."""
    rows = [_request_row(record) for record in requests.to_dict("records")]
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def _request_row(record: dict[str, Any]) -> dict[str, Any]:
    times = record.get("token_times")
    times = [float(t) for t in times] if isinstance(times, list) else []
    t_send = _number(record.get("t_send"))
    t_scheduled = _number(record.get("t_scheduled"))
    excluded = record.get("excluded") is True or record.get("excluded") is np.True_
    ok = record.get("finish_reason") in OK_FINISH and bool(times) and not math.isnan(t_send)
    n = len(times)
    t_first = times[0] if times else math.nan
    t_last = times[-1] if times else math.nan
    ttft = t_first - t_send if ok else math.nan
    e2e = t_last - t_send if ok else math.nan
    return {
        "id": record.get("id"),
        "t_scheduled": t_scheduled if not math.isnan(t_scheduled) else t_send,
        "t_send": t_send,
        "t_first": t_first,
        "t_last": t_last,
        "prompt_len": _number(record.get("prompt_len")),
        "output_tokens": n,
        "ttft": ttft,
        "tpot": (e2e - ttft) / (n - 1) if ok and n > 1 else math.nan,
        "e2e": e2e,
        "normalized_latency": e2e / n if ok else math.nan,
        "preemptions": _count(record.get("preemptions")),
        "ok": ok and not excluded,
        "excluded": excluded,
    }


def _number(value: Any) -> float:
    """A float, or NaN for anything missing or not numeric."""
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _count(value: Any) -> int:
    """A non-negative count, 0 for anything missing or not numeric."""
    number = _number(value)
    return 0 if math.isnan(number) else max(int(number), 0)


def inter_token_latencies(requests: pd.DataFrame) -> np.ndarray:
    """Every gap between consecutive output tokens, pooled over counted requests."""
    metrics = request_metrics(requests)
    gaps: list[np.ndarray] = []
    for record, ok in zip(requests.to_dict("records"), metrics["ok"], strict=True):
        times = record.get("token_times")
        if ok and isinstance(times, list) and len(times) > 1:
            gaps.append(np.diff(np.asarray(times, dtype=float)))
    return np.concatenate(gaps) if gaps else np.array([])


def stats(values: np.ndarray | pd.Series) -> dict[str, float]:
    """Mean, std and percentiles (numpy linear interpolation), NaN when empty."""
    array = np.asarray(values, dtype=float)
    result = distribution(array[~np.isnan(array)].tolist())
    return {key: math.nan if value is None else value for key, value in result.items()}


def configured_slo(slo: dict[str, Any]) -> dict[str, float]:
    """The per-request SLO limits that are set (metric name -> limit in seconds)."""
    limits: dict[str, float] = {}
    for field, metric in SLO_FIELDS.items():
        limit = _number(slo.get(field))
        if not math.isnan(limit):
            limits[metric] = limit
    return limits


def meets_slo(metrics: pd.DataFrame, limits: dict[str, float]) -> pd.Series:
    """Per request: counted and within every limit (a one-token request has no TPOT to miss)."""
    met = metrics["ok"].astype(bool).copy()
    for metric, limit in limits.items():
        values = metrics[metric]
        within = values <= limit
        if metric == "tpot":
            within = within | values.isna()
        met &= within
    return met


def slo_attainment(metrics: pd.DataFrame, limits: dict[str, float]) -> float:
    """Share of non-excluded requests (failed ones included) that meet every limit."""
    counted = metrics[~metrics["excluded"].astype(bool)]
    if counted.empty:
        return math.nan
    return float(meets_slo(counted, limits).sum() / len(counted))


def summary_from_records(requests: pd.DataFrame, slo: dict[str, Any]) -> dict[str, Any]:
    """The summary's metrics recomputed from requests, for runs that wrote no summary."""
    metrics = request_metrics(requests)
    counted = metrics[~metrics["excluded"].astype(bool)]
    ok = counted[counted["ok"]]
    duration = float(ok["t_last"].max() - ok["t_send"].min()) if len(ok) else math.nan
    rate = 1 / duration if duration and duration > 0 else math.nan
    met = meets_slo(ok, configured_slo(slo)).sum() if len(ok) else 0
    summary: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(counted) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) * rate,
        "output_throughput": float(ok["output_tokens"].sum()) * rate,
        "total_throughput": float(ok["output_tokens"].sum() + ok["prompt_len"].sum()) * rate,
        "goodput": float(met) * rate,
        "itl": stats(inter_token_latencies(requests)),
    }
    for metric in ("ttft", "tpot", "e2e", "normalized_latency"):
        summary[metric] = stats(ok[metric])
    return summary


def step_metrics(steps: pd.DataFrame) -> pd.DataFrame:
    """Steps with `duration` (model time if recorded), `tokens` and `kv_waste` filled in."""
    frame = steps.copy()
    if frame.empty:
        return frame
    for column in ("t_start", "t_end", "num_seqs", "prefill_tokens", "decode_tokens"):
        if column not in frame:
            frame[column] = math.nan
    wall = frame["t_end"] - frame["t_start"]
    frame["duration"] = frame["model_s"].fillna(wall) if "model_s" in frame else wall
    frame["tokens"] = frame["prefill_tokens"].fillna(0) + frame["decode_tokens"].fillna(0)
    if "kv_waste" not in frame and {"kv_allocated_slots", "kv_live_slots"} <= set(frame):
        allocated = frame["kv_allocated_slots"].astype(float)
        live = frame["kv_live_slots"].astype(float)
        frame["kv_waste"] = ((allocated - live) / allocated).where(allocated > 0)
    return frame
