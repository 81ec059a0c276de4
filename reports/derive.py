"""Per-request and per-step tables for figures, from the typed records, with the harness's
own metric definitions.

Figures (CDFs, timelines, SLO attainment) need each request's latencies, and crashed runs
have no summary, so reports apply the very functions the summary uses
(`harness.measure.metrics`, `harness.measure.slo`) to the records a run directory holds:
every latency from the request's arrival, E2E to its delivery.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from servelab.base.records import RequestRecord, StepRecord
from servelab.harness.measure.metrics import distribution, request_latency, summarize
from servelab.harness.measure.slo.limits import SLO

REQUEST_COLUMNS = [
    "id",
    "t_scheduled",
    "t_send",
    "t_first",
    "t_last",
    "t_done",
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


def request_metrics(records: Sequence[RequestRecord]) -> pd.DataFrame:
    """One row per request with its timings; `ok` marks those that count in metrics."""
    rows = []
    for record in records:
        latency = request_latency(record)
        times = record.token_times
        rows.append(
            {
                "id": record.id,
                "t_scheduled": record.t_scheduled,
                "t_send": math.nan if record.t_send is None else record.t_send,
                "t_first": times[0] if times else math.nan,
                "t_last": times[-1] if times else math.nan,
                "t_done": math.nan if record.t_done is None else record.t_done,
                "prompt_len": record.prompt_len,
                "output_tokens": len(times),
                "ttft": latency.ttft if latency else math.nan,
                "tpot": latency.tpot if latency and latency.tpot is not None else math.nan,
                "e2e": latency.e2e if latency else math.nan,
                "normalized_latency": latency.normalized_latency if latency else math.nan,
                "preemptions": record.preemptions,
                "ok": latency is not None and not record.excluded,
                "excluded": record.excluded,
            }
        )
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def stats(values: np.ndarray | pd.Series) -> dict[str, float]:
    """Mean, std and percentiles (numpy linear interpolation), NaN when empty."""
    array = np.asarray(values, dtype=float)
    result = distribution(array[~np.isnan(array)].tolist())
    return {key: math.nan if value is None else value for key, value in result.items()}


def slo_attainment(records: Sequence[RequestRecord], slo: SLO) -> float | None:
    """Share of counted requests (failed ones included, as misses) that meet the SLO."""
    return slo.attained([request_latency(r) for r in records if not r.excluded])


def summary_from_records(
    requests: Sequence[RequestRecord], steps: Sequence[StepRecord], slo: SLO
) -> dict[str, Any]:
    """The summary's metrics recomputed from the records, for runs that wrote no summary."""
    return summarize(requests, steps, slo)


@dataclass(frozen=True)
class ThinnedSteps:
    """A long run's steps cut to what a page can draw: `over_time` holds the mean of each
    `group` consecutive steps (the first step's start time), `sampled` every `group`-th step
    as recorded (for scatter plots, where a mean would be a step that never ran)."""

    over_time: pd.DataFrame
    sampled: pd.DataFrame
    group: int  # 1: every step as recorded

    @classmethod
    def of(cls, steps: pd.DataFrame, limit: int) -> ThinnedSteps:
        group = max(math.ceil(len(steps) / limit), 1)
        if group == 1:
            return cls(steps, steps, 1)
        bucket = np.arange(len(steps)) // group
        numeric = steps.select_dtypes("number")
        over_time = numeric.groupby(bucket).mean()
        over_time["t_start"] = numeric["t_start"].groupby(bucket).first()
        return cls(over_time, steps.iloc[::group], group)


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
