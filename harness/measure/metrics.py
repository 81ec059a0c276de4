"""The metrics of DESIGN.md, computed from request and step records, one definition each.

Everything here is a pure function of the records a run writes, so a summary can always be
recomputed from `requests.jsonl` and `steps.jsonl` (a test does exactly that), and reports
use these same functions. Every latency starts at the request's arrival (`t_scheduled`):

- TTFT = first output token − arrival; E2E = delivery (`t_done`) − arrival;
- TPOT = (last token − first token) / (output tokens − 1), for more than one token;
- ITL = every gap between consecutive output tokens, pooled over requests;
- normalized latency = E2E / output tokens;
- duration = first arrival → last completion (`t_done`, whatever the outcome), over counted
  requests.

Step figures (KV waste, peak running, preemptions, MFU/MBU, speculative counts) use the
steps that started inside the measured window, from the first counted arrival to the last
counted delivery, so warm-up and cool-down are left out of them as they are of the request
metrics.

Speculative decoding (from the step counters the decoder writes):

- acceptance rate α = accepted drafts / drafts the target verified;
- mean accepted length = tokens emitted per target forward of a sequence past its first
  token (1 for plain decoding; a speculative forward emits its accepted drafts plus one);
- mean gamma = drafts per verification that had any; draft cost ratio c = draft time /
  (mean gamma × target time), the cost of one draft token as a share of a target step;
- predicted speedup = (1 − α^(γ+1)) / ((1 − α)(γc + 1)) at the mean gamma (Leviathan et
  al.: free verification assumed, so the measured speedup falls short by what verifying
  gamma more tokens costs the target).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servelab.base.records import RequestRecord, StepRecord
from servelab.harness.measure.prompt_cache import prompt_cache_summary
from servelab.harness.measure.roofline import run_utilisation
from servelab.harness.measure.slo.limits import SLO, RequestLatency
from servelab.harness.measure.summary_schema import LATENCY_METRICS, STAT_KEYS
from servelab.strategies.decoding.gamma import expected_speedup


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """mean, std, p50, p90, p95, p99 (numpy linear interpolation); None for no values."""
    if len(values) == 0:
        return dict.fromkeys(STAT_KEYS)
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


def request_latency(record: RequestRecord) -> RequestLatency | None:
    """A successful request's latencies from its arrival; None for a failed one."""
    if not record.succeeded:
        return None
    times = record.token_times
    count = len(times)
    e2e = record.delivered_at - record.t_scheduled
    return RequestLatency(
        ttft=times[0] - record.t_scheduled,
        e2e=e2e,
        tpot=(times[-1] - times[0]) / (count - 1) if count > 1 else None,
        normalized_latency=e2e / count,
        output_tokens=count,
        prompt_tokens=record.prompt_len,
    )


def inter_token_latencies(records: Sequence[RequestRecord]) -> list[float]:
    """Every gap between consecutive output tokens of successful requests, pooled."""
    return [float(gap) for r in records if r.succeeded for gap in np.diff(r.token_times)]


@dataclass(frozen=True)
class Window:
    """The measured part of a run: first counted arrival to last counted completion."""

    start: float
    end: float

    def holds(self, step: StepRecord) -> bool:
        return self.start <= step.t_start <= self.end


def measured_window(counted: Sequence[RequestRecord]) -> Window | None:
    done = [r.t_done if r.t_done is not None else r.delivered_at for r in counted if _ended(r)]
    if not done:
        return None
    return Window(min(r.t_scheduled for r in counted), max(done))


def _ended(record: RequestRecord) -> bool:
    return record.t_done is not None or bool(record.token_times)


def time_weighted_mean(steps: Sequence[StepRecord], key: str) -> float | None:
    total = weight_sum = 0.0
    for step in steps:
        weight = step.t_end - step.t_start
        total += getattr(step, key) * weight
        weight_sum += weight
    return total / weight_sum if weight_sum > 0 else None


def summarize(
    requests: Sequence[RequestRecord],
    steps: Sequence[StepRecord],
    slo: SLO,
    peaks: dict | None = None,
) -> dict:
    """The metric part of `summary.json` (schema fields are added by the run writer)."""
    counted = [r for r in requests if not r.excluded]
    latencies = [request_latency(r) for r in counted]
    ok = [lat for lat in latencies if lat is not None]
    window = measured_window(counted)
    duration = window.end - window.start if window else 0.0
    output_tokens = sum(lat.output_tokens for lat in ok)
    input_tokens = sum(r.prompt_len for r, lat in zip(counted, latencies, strict=True) if lat)
    attainment = slo.attained(latencies)
    good = sum(1 for lat in latencies if slo.meets(lat))

    def rate(count: float) -> float | None:
        return count / duration if duration > 0 else None

    summary: dict = {
        "completed": len(ok),
        "failed": len(counted) - len(ok),
        "rejected": sum(1 for r in counted if r.finish_reason == "rejected"),
        "excluded": len(requests) - len(counted),
        "duration_s": duration,
        "request_throughput": rate(len(ok)),
        "output_throughput": rate(output_tokens),
        "total_throughput": rate(output_tokens + input_tokens),
        "goodput": rate(good),
        "slo_attainment": attainment,
        "sustained": slo.sustains(attainment),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }
    for name in LATENCY_METRICS:
        if name == "itl":  # between tokens of a request, not one value per request
            continue
        values = [getattr(lat, name) for lat in ok if getattr(lat, name) is not None]
        summary[name] = distribution(values)
    summary["itl"] = distribution(inter_token_latencies(counted))
    summary["send_lag"] = distribution(
        [r.t_send - r.t_scheduled for r in counted if r.t_send is not None]
    )
    summary.update(prompt_cache_summary(counted))
    measured = [s for s in steps if window and window.holds(s)]
    summary.update(step_summary(measured))
    summary.update(speculative_summary(measured))
    summary["mfu_mean"], summary["mbu_mean"] = run_utilisation(measured, peaks)
    return summary


def step_summary(steps: Sequence[StepRecord]) -> dict:
    """KV, batch and time figures over the measured window's steps."""
    model_time = sum(s.model_s for s in steps)
    step_time = sum(s.t_end - s.t_start for s in steps)
    return {
        "kv_waste_mean": time_weighted_mean(steps, "kv_waste") if steps else None,
        "peak_running": max((s.running for s in steps), default=None),  # None: no steps seen
        "preemptions": sum(s.preempted for s in steps),
        "pad_tokens": sum(s.pad_tokens for s in steps),
        "steps": len(steps),
        "model_time_share": model_time / step_time if step_time > 0 else None,
    }


def speculative_summary(steps: Sequence[StepRecord]) -> dict:
    """Acceptance rate, tokens per target forward, the acceptance histogram (index k: how
    many verifications accepted k drafts), draft cost and the speedup they predict; empty for
    runs without speculative counters."""
    spec = [s.counters for s in steps if "spec_proposed" in s.counters]
    if not spec:
        return {}
    proposed = sum(c["spec_proposed"] for c in spec)
    accepted = sum(c["spec_accepted"] for c in spec)
    forwards = sum(c["spec_decode_seqs"] for c in spec)
    lists = [c.get("spec_accepted_counts", []) for c in spec]
    width = max(len(counts) for counts in lists)
    histogram = [sum(counts[k] for counts in lists if k < len(counts)) for k in range(width)]
    draft_s = sum(c.get("spec_draft_s", 0.0) for c in spec)
    target_s = sum(s.model_s for s in steps if "spec_proposed" in s.counters)
    alpha = accepted / proposed if proposed else None
    gamma = proposed / sum(histogram) if sum(histogram) else None
    cost = draft_s / (gamma * target_s) if gamma and target_s > 0 else None
    predicted = (
        expected_speedup(alpha, gamma, cost)
        if alpha is not None and gamma and cost is not None
        else None
    )
    return {
        "acceptance_rate": alpha,
        "mean_accepted_length": sum(c["spec_emitted"] for c in spec) / forwards
        if forwards
        else None,
        "acceptance_histogram": histogram,
        "spec_proposed": proposed,
        "spec_accepted": accepted,
        "mean_gamma": gamma,
        "draft_time_s": draft_s,
        "target_time_s": target_s,
        "draft_cost_ratio": cost,
        "predicted_speedup": predicted,
    }
