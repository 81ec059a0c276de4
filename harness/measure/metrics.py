"""The metrics of DESIGN.md, computed from request and step records, one definition each.

Everything here is a pure function of the records a run writes, so a summary can always
be recomputed from `requests.jsonl` and `steps.jsonl` (a test does exactly that).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

SUCCESS = ("stop", "length")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e", "normalized_latency")


@dataclass(frozen=True)
class SLO:
    """Per-request limits in seconds; None means no limit on that metric."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """mean, std, p50, p90, p95, p99 (numpy linear interpolation); None for no values."""
    keys = ("mean", "std", "p50", "p90", "p95", "p99")
    if len(values) == 0:
        return dict.fromkeys(keys)
    array = np.asarray(values, dtype=np.float64)
    p50, p90, p95, p99 = np.percentile(array, [50, 90, 95, 99], method="linear")
    return {
        "mean": float(array.mean()),
        "std": float(array.std()),
        "p50": float(p50),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
    }


def request_latencies(record: dict) -> dict[str, float | None]:
    """TTFT, E2E, TPOT (None for a single token) and normalized latency of one request."""
    times, sent = record["token_times"], record["t_send"]
    ttft, e2e = times[0] - sent, times[-1] - sent
    count = len(times)
    return {
        "ttft": ttft,
        "e2e": e2e,
        "tpot": (e2e - ttft) / (count - 1) if count > 1 else None,
        "normalized_latency": e2e / count,
    }


def meets_slo(latencies: dict[str, float | None], slo: SLO) -> bool:
    checks = ((slo.ttft_s, "ttft"), (slo.tpot_s, "tpot"), (slo.e2e_s, "e2e"))
    for limit, name in checks:
        value = latencies[name]
        if limit is not None and value is not None and value > limit:
            return False
    return True


def time_weighted_mean(steps: Iterable[dict], key: str) -> float | None:
    total = weight_sum = 0.0
    for step in steps:
        weight = step["t_end"] - step["t_start"]
        total += step[key] * weight
        weight_sum += weight
    return total / weight_sum if weight_sum > 0 else None


def summarize(requests: Sequence[dict], steps: Sequence[dict], slo: SLO) -> dict:
    """The metric part of `summary.json` (schema fields are added by the run writer)."""
    counted = [r for r in requests if not r["excluded"]]
    ok = [r for r in counted if r["finish_reason"] in SUCCESS and r["token_times"]]
    per_request = [request_latencies(r) for r in ok]
    itl = [float(gap) for r in ok for gap in np.diff(r["token_times"])]
    duration = max(r["token_times"][-1] for r in ok) - min(r["t_send"] for r in ok) if ok else 0.0
    output_tokens = sum(len(r["token_times"]) for r in ok)
    input_tokens = sum(r["prompt_len"] for r in ok)
    good = sum(1 for lat in per_request if meets_slo(lat, slo))

    def rate(count: float) -> float | None:
        return count / duration if duration > 0 else None

    summary: dict = {
        "completed": len(ok),
        "failed": len(counted) - len(ok),
        "excluded": len(requests) - len(counted),
        "duration_s": duration,
        "request_throughput": rate(len(ok)),
        "output_throughput": rate(output_tokens),
        "total_throughput": rate(output_tokens + input_tokens),
        "goodput": rate(good),
        "slo_attainment": good / len(ok) if ok else None,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }
    for name in ("ttft", "tpot", "e2e", "normalized_latency"):
        values = [lat[name] for lat in per_request if lat[name] is not None]
        summary[name] = distribution(values)
    summary["itl"] = distribution(itl)
    summary["send_lag"] = distribution([r["t_send"] - r["t_scheduled"] for r in counted])
    summary["kv_waste_mean"] = time_weighted_mean(steps, "kv_waste") if steps else None
    summary["peak_running"] = max((s["running"] for s in steps), default=0)
    summary["preemptions"] = sum(s["preempted"] for s in steps)
    summary["steps"] = len(steps)
    model_time = sum(s["model_s"] for s in steps)
    step_time = sum(s["t_end"] - s["t_start"] for s in steps)
    summary["model_time_share"] = model_time / step_time if step_time > 0 else None
    return summary
