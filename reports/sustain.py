"""The highest load each strategy sustains under the configured SLO, by a rule stated in the report.

Rule: when `slo.normalized_latency_s` is set, a run passes if its p50 normalized latency
is at most that limit. Otherwise a run passes if at least 90% of its requests (failed ones
count as missing) meet every configured per-request limit (`ttft_s`, `tpot_s`, `e2e_s`)
at once. A strategy sustains load x when its runs at x and at every lower tested load
pass; a pass above a failure does not count, so noise cannot overstate capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reports.derive import configured_slo, slo_attainment
from reports.grouping import Group, SweepRun
from reports.load import as_dict

REQUIRED_SHARE = 0.9


@dataclass(frozen=True)
class SloRule:
    """What a run must achieve to count as sustaining its load."""

    normalized_latency_s: float | None
    limits: dict[str, float]
    share: float = REQUIRED_SHARE

    def describe(self) -> str:
        """The rule in one sentence, for the report."""
        if self.normalized_latency_s is not None:
            return (
                f"A run passes when its p50 normalized latency is at most "
                f"{self.normalized_latency_s:g} s/token."
            )
        limits = ", ".join(f"{metric} ≤ {limit:g} s" for metric, limit in self.limits.items())
        return (
            f"A run passes when at least {self.share:.0%} of its requests (failed requests "
            f"count as missing) meet every limit at once: {limits}."
        )

    def passes(self, sweep_run: SweepRun) -> bool | None:
        """Whether the run passes; None when it lacks the data to judge."""
        summary = sweep_run.run.summary or {}
        if self.normalized_latency_s is not None:
            p50 = as_dict(summary.get("normalized_latency")).get("p50")
            if not isinstance(p50, int | float):
                return None
            return p50 <= self.normalized_latency_s
        return _share(sweep_run, self.limits) >= self.share


def _share(sweep_run: SweepRun, limits: dict[str, float]) -> float:
    if sweep_run.metrics is not None:
        share = slo_attainment(sweep_run.metrics, limits)
        if not math.isnan(share):
            return share
    summary = sweep_run.run.summary or {}
    goodput, duration = summary.get("goodput"), summary.get("duration_s")
    total = (summary.get("completed") or 0) + (summary.get("failed") or 0)
    if isinstance(goodput, int | float) and isinstance(duration, int | float) and total:
        return goodput * duration / total
    return math.nan


def slo_rule(slo: dict[str, object]) -> SloRule | None:
    """The rule for a group's SLO config, or None when no limit is configured."""
    normalized = slo.get("normalized_latency_s")
    if isinstance(normalized, int | float) and not isinstance(normalized, bool):
        return SloRule(float(normalized), {})
    limits = configured_slo(dict(slo))
    return SloRule(None, limits) if limits else None


@dataclass(frozen=True)
class Sustained:
    """The highest sustained load of one strategy in one group."""

    label: str
    load: float | None
    all_passed: bool
    tested: tuple[float, ...]


def highest_sustained(label: str, results: list[tuple[float, bool | None]]) -> Sustained:
    """Walk loads upwards; stop at the first load where any run fails or cannot be judged."""
    loads = sorted({x for x, _ in results})
    best: float | None = None
    for load in loads:
        verdicts = [passed for x, passed in results if x == load]
        if not all(v is True for v in verdicts):
            return Sustained(label, best, False, tuple(loads))
        best = load
    return Sustained(label, best, True, tuple(loads))


def sustained_loads(group: Group) -> list[Sustained]:
    """Per strategy in the group, its highest sustained load (empty without an SLO or x axis)."""
    rule = slo_rule(group.slo)
    if rule is None or group.x_kind == "none":
        return []
    found = []
    for label in group.labels:
        results = [
            (r.x, rule.passes(r))
            for r in group.runs
            if r.label == label and r.x is not None and r.run.complete
        ]
        if results:
            found.append(highest_sustained(label, results))
    return found
