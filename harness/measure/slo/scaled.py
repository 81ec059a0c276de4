"""The SLO a search scales from this machine (`search.slo_scale`): each limit a multiple of
what one request at a time takes here, so that the same comparison asks the same of a
laptop, this VM or a GPU; and whether the machine kept that speed while the search ran
(`SpeedDrift`).

The reference is one floor run of the first strategy (requests one at a time, nothing else
queued). TPOT, E2E and normalized latency are limited at their multiple of its median. TTFT
is limited at its multiple of what each request's own prompt takes alone: one request's TTFT
at zero load is its prefill, which grows with the prompt, so a limit scaled from the median
(a prompt of a few dozen tokens) lies below what a prompt several times longer takes with
nothing else running, and such a request misses it at every load. The floor's TTFTs are
fitted as a line in prompt length (least squares, neither part negative: `PromptLine`) and
the limit is that line times the multiple (the "slowdown" form of an SLO, relative to the
request served alone): `slo.ttft_s` its fixed part (unset where the line runs through the
origin), `slo.ttft_per_prompt_token_s` what it grows by per prompt token.

Scaled limits assume the machine keeps the speed it had when they were scaled; a shared VM
does not always, and a slower machine during the probes reads every knee low. So the
reference floor runs again after the last probe, and the search says how far its median TPOT
moved, flagged past `DRIFT_LIMIT`, and widens each knee's interval by the move
(`search.estimator.Knee.widened`). A search on the limits of an earlier one (`earlier_run`)
measures the same drift.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.base.errors import ConfigError
from servelab.base.records import RequestRecord
from servelab.harness.measure.drift import DRIFT_LIMIT, Drift
from servelab.harness.measure.metrics import request_latency
from servelab.harness.measure.slo.limits import PER_PROMPT_TOKEN


@dataclass(frozen=True)
class PromptLine:
    """TTFT one request at a time as a line in its prompt's length."""

    fixed_s: float
    per_token_s: float

    def at(self, prompt_tokens: int) -> float:
        return self.fixed_s + self.per_token_s * prompt_tokens


def prompt_line(points: Sequence[tuple[int, float]]) -> PromptLine:
    """The least-squares line through (prompt tokens, TTFT), neither part negative: with one
    prompt length, or TTFT not growing with it, the median TTFT and no slope; with a negative
    intercept, the line through the origin."""
    lengths = [float(tokens) for tokens, _ in points]
    seconds = [ttft for _, ttft in points]
    if len(set(lengths)) < 2:
        return PromptLine(statistics.median(seconds), 0.0)
    mean_x, mean_y = statistics.fmean(lengths), statistics.fmean(seconds)
    spread = sum((x - mean_x) ** 2 for x in lengths)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(lengths, seconds, strict=True)) / spread
    if slope <= 0:
        return PromptLine(statistics.median(seconds), 0.0)
    fixed = mean_y - slope * mean_x
    if fixed < 0:
        through_origin = sum(x * y for x, y in zip(lengths, seconds, strict=True))
        return PromptLine(0.0, through_origin / sum(x * x for x in lengths))
    return PromptLine(fixed, slope)


def scaled_limits(
    scale: dict[str, float], summary: dict, requests: Sequence[RequestRecord]
) -> dict[str, float]:
    """The `slo.*` values a scale asks for, from the reference floor run's summary (medians)
    and its requests (the TTFT line)."""
    limits: dict[str, float] = {}
    for key, multiple in scale.items():
        if key == "ttft_s":
            latencies = [request_latency(record) for record in requests]
            points = [(x.prompt_tokens, x.ttft) for x in latencies if x is not None]
            if not points:
                raise _unmeasured(key)
            line = prompt_line(points)
            if line.fixed_s > 0:  # a line through the origin limits TTFT per prompt token alone
                limits[key] = multiple * line.fixed_s
            if line.per_token_s > 0:
                limits[PER_PROMPT_TOKEN] = multiple * line.per_token_s
            continue
        median = (summary.get(key.removesuffix("_s")) or {}).get("p50")
        if not isinstance(median, int | float) or median <= 0:
            raise _unmeasured(key)
        limits[key] = multiple * median
    return limits


def scaled_keys(scale: dict[str, float]) -> set[str]:
    """The `slo.*` keys a scale sets (a given value of any of them is replaced): scaling TTFT
    sets its per-prompt-token part too, or leaves it unset."""
    return {*scale, *([PER_PROMPT_TOKEN] if "ttft_s" in scale else [])}


def _unmeasured(key: str) -> ConfigError:
    return ConfigError(
        f"search.slo_scale.{key}", "the reference floor run measured no such latency"
    )


def limits_line(strategy: str, scale: dict[str, float], limits: dict[str, float]) -> str:
    """What the scaled SLO is, and from what, in one line."""
    parts = []
    for key, multiple in scale.items():
        if key == "ttft_s" and PER_PROMPT_TOKEN in limits:
            fixed, grows = limits.get(key, 0.0), limits[PER_PROMPT_TOKEN]
            parts.append(
                f"ttft = {multiple:g} x ({fixed / multiple:.3g} s + {grows / multiple:.3g} s per "
                f"prompt token) = {fixed:.3g} s + {grows:.3g} s per prompt token"
            )
        else:
            parts.append(f"{key} = {multiple:g} x {limits[key] / multiple:.3g} = {limits[key]:.3g}")
    return (
        f"SLO scaled from {strategy}'s requests one at a time (TTFT: a line in prompt length; "
        f"the rest: medians): {'; '.join(parts)} (the same limits for every strategy)"
    )


class SpeedDrift(Drift):
    """The reference floor's median TPOT (one request at a time) before the first probe and
    after the last: how far this machine's speed moved while the search ran."""

    def line(self) -> str:
        said = (
            f"machine speed: one request at a time, median TPOT {self.before_s * 1e3:.3g} ms "
            f"before the first probe, {self.after_s * 1e3:.3g} ms after the last "
            f"({self.change:+.1%})"
        )
        said += f"; each fitted knee's interval widened x{self.factor:.3g} for it"
        if self.too_large:
            said += (
                f"; over {DRIFT_LIMIT:.0%}: the probes ran at other speeds of this machine than "
                "the reference floor measured, and the knees carry the difference; search again "
                "when it is quiet"
            )
        return said


def speed_drift(start: dict, end: dict) -> SpeedDrift | None:
    """From the two reference floor runs' summaries; None when either measured no TPOT."""
    before, after = ((s.get("tpot") or {}).get("p50") for s in (start, end))
    if not isinstance(before, int | float) or not isinstance(after, int | float) or before <= 0:
        return None
    return SpeedDrift(float(before), float(after))
