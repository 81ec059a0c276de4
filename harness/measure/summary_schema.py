"""The one table of every metric `summary.json` carries: name, unit, label, kind, direction.

`summarize` (harness.measure.metrics) and the run fill these keys; the gate reads the kinds
(which metrics a claim may bound absolutely), the run report and the end-of-run table read
the labels and units, the sweep table its column labels. A new metric is one row here and
the code that computes it; a test checks that `summarize` emits exactly these keys.

Kinds: `schedule`, counts and shares the schedule decides, comparable across machines as
they are; `timing`, times and rates (and what is derived from them), which hold only on the
machine that measured them; `record`, totals and histograms kept for the reader.
Direction: which way is better (`higher`, `lower`), or None where neither is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["schedule", "timing", "record"]
Better = Literal["higher", "lower"] | None


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # "" for a count, "fraction" for a share in [0, 1]
    label: str
    kind: Kind
    better: Better


# Per-request distributions: each a dict of STAT_KEYS (mean, std, p50, p90, p95, p99) in s.
STAT_KEYS = ("mean", "std", "p50", "p90", "p95", "p99")
DISTRIBUTIONS = (
    Metric("ttft", "s", "time to first token", "timing", "lower"),
    Metric("tpot", "s", "time per output token after the first", "timing", "lower"),
    Metric("itl", "s", "inter-token latency", "timing", "lower"),
    Metric("e2e", "s", "end-to-end latency", "timing", "lower"),
    Metric("normalized_latency", "s/token", "latency per output token", "timing", "lower"),
    Metric("send_lag", "s", "client lateness (t_send - t_scheduled)", "timing", "lower"),
)
LATENCY_METRICS = tuple(m.name for m in DISTRIBUTIONS if m.name != "send_lag")

SCALARS = (
    Metric("completed", "", "completed requests", "schedule", "higher"),
    Metric("failed", "", "failed requests", "schedule", "lower"),
    Metric("rejected", "", "rejected requests", "schedule", "lower"),
    Metric("excluded", "", "excluded requests (warm-up, cool-down)", "record", None),
    Metric("duration_s", "s", "duration", "timing", None),
    Metric("request_throughput", "req/s", "request throughput", "timing", "higher"),
    Metric("output_throughput", "tokens/s", "output throughput", "timing", "higher"),
    Metric("total_throughput", "tokens/s", "total throughput", "timing", "higher"),
    Metric("goodput", "req/s", "goodput", "timing", "higher"),
    Metric(
        "slo_attainment",
        "fraction",
        "requests meeting the SLO (failed ones as misses)",
        "timing",
        "higher",
    ),
    Metric("sustained", "", "load sustained under the SLO", "record", None),
    Metric("input_tokens", "", "input tokens", "schedule", None),
    Metric("output_tokens", "", "output tokens", "schedule", None),
    Metric(
        "cached_prompt_share",
        "fraction",
        "prompt tokens served from a prefix cache",
        "schedule",
        None,
    ),
    Metric(
        "warm_cache_share",
        "fraction",
        "prompt tokens from a cache the run did not fill",
        "schedule",
        "lower",
    ),
    Metric("kv_waste_mean", "fraction", "KV waste (time mean)", "schedule", "lower"),
    Metric("peak_running", "", "peak running requests", "schedule", "higher"),
    Metric("preemptions", "", "preemptions", "schedule", "lower"),
    Metric("pad_tokens", "", "padding tokens computed", "schedule", "lower"),
    Metric("steps", "", "engine steps", "schedule", None),
    Metric("model_time_share", "fraction", "model time share of step time", "timing", "higher"),
    Metric("mfu_mean", "fraction", "MFU, mean", "timing", "higher"),
    Metric("mbu_mean", "fraction", "MBU, mean", "timing", "higher"),
)
SPECULATIVE = (  # present only for runs with speculative counters
    Metric("acceptance_rate", "fraction", "speculative acceptance rate", "schedule", "higher"),
    Metric(
        "mean_accepted_length", "tokens", "tokens emitted per target forward", "schedule", "higher"
    ),
    Metric("acceptance_histogram", "", "verifications by drafts accepted", "record", None),
    Metric("spec_proposed", "", "drafts proposed", "record", None),
    Metric("spec_accepted", "", "drafts accepted", "record", None),
    Metric("mean_gamma", "tokens", "drafts per verification", "schedule", None),
    Metric("draft_time_s", "s", "time drafting", "timing", None),
    Metric("target_time_s", "s", "target forward time in speculative steps", "timing", None),
    Metric("draft_cost_ratio", "fraction", "draft token cost / target step (c)", "timing", "lower"),
    Metric("predicted_speedup", "×", "speedup predicted from acceptance and c", "timing", "higher"),
)
ENERGY = (  # from telemetry, added by the run
    Metric("energy_j", "J", "energy", "timing", "lower"),
    Metric("j_per_token", "J/token", "energy per output token", "timing", "lower"),
)
METRICS = {m.name: m for m in (*DISTRIBUTIONS, *SCALARS, *SPECULATIVE, *ENERGY)}


def metric_names(kind: Kind) -> tuple[str, ...]:
    """Every claimable metric of a kind: scalars by name, distributions as NAME.STAT."""
    names = [m.name for m in (*SCALARS, *SPECULATIVE, *ENERGY) if m.kind == kind]
    names += [f"{m.name}.{stat}" for m in DISTRIBUTIONS if m.kind == kind for stat in STAT_KEYS]
    return tuple(names)


def label_of(name: str) -> str:
    """'label (unit)' for a report row or column."""
    metric = METRICS[name]
    return f"{metric.label} ({metric.unit})" if metric.unit else metric.label
