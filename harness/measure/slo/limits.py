"""The one SLO rule: when a request meets its service-level objective, and when a run sustains
its load. The summary, `servelab search`, the sweep report and the gates all use this.

A request meets the SLO when it succeeded and every configured limit holds: TTFT, TPOT (a
one-token response has no TPOT to miss), E2E and normalized latency, each measured from the
request's arrival; that is, when its SLO ratio, the largest of metric / limit, is at most 1
(`SLO.ratio`, which the knee estimator reads with every request's margin). The TTFT limit
may grow with the prompt (`ttft_per_prompt_token_s`: the limit is `ttft_s` plus that much
per prompt token), since a prompt's prefill alone grows with it: a fixed limit set for short
prompts is one a long prompt misses at any load. SLO attainment is the share of counted
requests (warm-up and cool-down left out) that meet it; failed and rejected requests count,
as misses. Goodput is the number that meet it per second of the run. A run sustains its load
when its attainment is at least `slo.attainment` (0.9 by default); with no limit configured
there is nothing to sustain, and the answer is None. With `slo.stop_early` set (a
confidence), an in-process run ends once its verdict can only be a failure at that
confidence (`harness.measure.slo.early_stop`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servelab.base.errors import ConfigError

LIMITS = ("ttft_s", "tpot_s", "e2e_s", "normalized_latency_s")  # a limit on each latency
PER_PROMPT_TOKEN = "ttft_per_prompt_token_s"  # what the TTFT limit grows by per prompt token
DEFAULT_ATTAINMENT = 0.9


@dataclass(frozen=True)
class RequestLatency:
    """One successful request's latencies (seconds), each from its arrival."""

    ttft: float
    e2e: float
    tpot: float | None  # None for a single output token
    normalized_latency: float
    output_tokens: int
    prompt_tokens: int


@dataclass(frozen=True)
class SLO:
    """Per-request limits in seconds (None: no limit) and the share a run must meet."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    normalized_latency_s: float | None = None
    ttft_per_prompt_token_s: float | None = None
    attainment: float = DEFAULT_ATTAINMENT
    stop_early: float | None = None  # a confidence: end a run once it can only fail at it

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> SLO:
        node = node or {}
        values: dict[str, float | None] = {}
        for key in (*LIMITS, PER_PROMPT_TOKEN):
            value = node.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise ConfigError(f"slo.{key}", f"{value!r} must be a positive number of seconds")
            values[key] = None if value is None else float(value)
        share = node.get("attainment", DEFAULT_ATTAINMENT)
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise ConfigError("slo.attainment", f"{share!r} must be a share in (0, 1]")
        stop = node.get("stop_early")
        if stop is not None and (
            isinstance(stop, bool) or not isinstance(stop, int | float) or not 0 < stop < 1
        ):
            raise ConfigError(
                "slo.stop_early", f"{stop!r} must be a confidence in (0, 1), or null (never)"
            )
        return cls(**values, attainment=float(share), stop_early=None if stop is None else stop)

    @classmethod
    def of_config(cls, cfg: Mapping[str, Any]) -> SLO:
        """The `slo` node of a run's whole config, checked (a bad value is a ConfigError)."""
        return cls.from_config(cfg.get("slo"))

    @classmethod
    def of_record(cls, node: Mapping[str, Any] | None) -> SLO | None:
        """The SLO a finished run recorded; None when the record holds values the rule cannot
        read (a report then draws everything else)."""
        try:
            return cls.from_config(node)
        except ValueError:
            return None

    @property
    def configured(self) -> bool:
        return any(getattr(self, key) is not None for key in (*LIMITS, PER_PROMPT_TOKEN))

    def ttft_limit(self, prompt_tokens: int) -> float | None:
        """The TTFT limit of a request with this prompt (None: no TTFT limit)."""
        if self.ttft_per_prompt_token_s is None:
            return self.ttft_s
        return (self.ttft_s or 0.0) + self.ttft_per_prompt_token_s * prompt_tokens

    def ratio(self, latency: RequestLatency | None) -> float:
        """The request's SLO ratio: the largest of metric / limit over the limits that apply
        (TPOT none for one token); at most 1 exactly when it meets the SLO (`meets`), so the
        summary's attainment and a knee read off the ratios never disagree. inf for a failed
        request; 0 with no limit that applies."""
        if latency is None:
            return math.inf
        checks = (
            (self.ttft_limit(latency.prompt_tokens), latency.ttft),
            (self.tpot_s, latency.tpot),
            (self.e2e_s, latency.e2e),
            (self.normalized_latency_s, latency.normalized_latency),
        )
        return max((value / limit for limit, value in checks if limit and value is not None),
                   default=0.0)  # fmt: skip

    def meets(self, latency: RequestLatency | None) -> bool:
        """Does a request meet every limit? None (a failed request) never does."""
        return self.ratio(latency) <= 1

    def attained(self, latencies: Sequence[RequestLatency | None]) -> float | None:
        """Share of counted requests (None = failed) that meet the SLO; None for none."""
        if not latencies:
            return None
        return sum(1 for latency in latencies if self.meets(latency)) / len(latencies)

    def sustains(self, attainment: float | None) -> bool | None:
        """Does a run with this attainment sustain its load? None without any limit."""
        if not self.configured:
            return None
        return attainment is not None and attainment >= self.attainment

    def describe(self) -> str:
        """The rule in one sentence, for reports and tables."""
        names = {
            "ttft_s": "TTFT",
            "tpot_s": "TPOT",
            "e2e_s": "E2E",
            "normalized_latency_s": "normalized latency",
        }
        limits = [
            f"{names[key]} ≤ {getattr(self, key):g} s" for key in LIMITS if getattr(self, key)
        ]
        if self.ttft_per_prompt_token_s is not None:
            fixed = [f"{self.ttft_s:g} s"] if self.ttft_s is not None else []
            grows = f"{self.ttft_per_prompt_token_s:g} s per prompt token"
            limits = [f"TTFT ≤ {' + '.join([*fixed, grows])}", *limits[len(fixed) :]]
        if not limits:
            return "No SLO is configured."
        return (
            f"A request meets the SLO when {', '.join(limits)} (latencies from arrival); a run "
            f"sustains its load when at least {self.attainment:.0%} of its requests do (failed "
            "and rejected requests count as misses)."
        )
