"""Turn a gate's measurements into one result per claim: estimate, interval, outcome.

- `metric` claims read the metric from every repetition's summary; the estimate is the ratio
  of the means (or the mean against a constant) with its paired bootstrap interval.
- `identical` claims compare each repetition's greedy outputs with the reference's first
  repetition, request by request (`requests.jsonl`); exactness is not statistical, so the
  worst repetition is the value, and any shortfall fails.
- `perplexity` claims divide two deterministic perplexities (or take one).

Every result lists the runs it read and their flags (a run slowed by the test-only knob says
so). An inconclusive outcome counts as the claim's policy says, and the result keeps both.
A claim that reads a run whose figures are doubtful (failed requests, a preemption storm,
telemetry dropouts, send lag, an incomplete run: `harness.measure.flags.REFUSED`) is
`refused`, which counts as a fail; its notes name the run and the flags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from servelab.base.records import RequestRecord
from servelab.harness.gate.collect import Measurements, RunMeasure
from servelab.harness.gate.plan import GatePlan
from servelab.harness.gate.spec import Claim, GateSpec, Side
from servelab.harness.measure.bootstrap import Interval, Outcome, bootstrap_interval, verdict
from servelab.harness.measure.flags import refusals
from servelab.harness.measure.rundir import read_requests


@dataclass
class ClaimResult:
    claim: Claim
    outcome: Outcome
    counted: Outcome  # pass or fail, after the inconclusive policy
    estimate: float | None
    low: float | None
    high: float | None
    samples: int
    values_of: Sequence[float | None]  # per repetition (one value for exact claims)
    values_over: Sequence[float | None]
    sources: list[str]  # run directories or perplexity files read
    notes: list[str] = field(default_factory=list)


def metric_value(summary: dict, metric: str) -> float | None:
    """A summary metric by name; `ttft.p99` reads a distribution's statistic."""
    value: Any = summary
    for part in metric.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return None if value is None or isinstance(value, bool) else float(value)


def identical_share(
    reference: list[RequestRecord], other: list[RequestRecord]
) -> tuple[float, list[str]]:
    """Share of the reference's requests served with exactly its output tokens by `other`
    (a request that failed on either side counts as different), and the ids that differ."""
    served = {r.id: r for r in other}
    differing = [
        r.id
        for r in reference
        if not (
            r.succeeded
            and r.id in served
            and served[r.id].succeeded
            and served[r.id].output_ids == r.output_ids
        )
    ]
    return (len(reference) - len(differing)) / max(len(reference), 1), differing


def _result(
    claim: Claim,
    interval: Interval | None,
    values: tuple[Sequence[float | None], Sequence[float | None]],
    sources: list[str],
    notes: list[str],
    refused: bool = False,
) -> ClaimResult:
    if interval is None:  # nothing to decide on: the claim fails, and its notes say why
        outcome = Outcome.REFUSED if refused else Outcome.FAIL
        estimate = low = high = None
        samples = 0
    else:
        outcome = verdict(interval.low, interval.high, claim.bound, claim.direction)
        estimate, low, high, samples = (
            interval.estimate,
            interval.low,
            interval.high,
            interval.samples,
        )
    counted = Outcome.FAIL if outcome is Outcome.REFUSED else outcome
    if outcome is Outcome.INCONCLUSIVE:
        counted = Outcome.PASS if claim.inconclusive == "pass" else Outcome.FAIL
    return ClaimResult(
        claim, outcome, counted, estimate, low, high, samples, values[0], values[1], sources, notes
    )


def _flags(summaries: list[dict]) -> list[str]:
    seen: list[str] = []
    for summary in summaries:
        seen += [flag for flag in summary.get("flags") or [] if flag not in seen]
    return seen


def _refusals(runs: list[RunMeasure]) -> list[str]:
    """One note per flagged run a claim reads: the gate will not decide on its figures."""
    notes = []
    for measured in runs:
        reasons = refusals(measured.summary)
        if reasons:
            notes.append(f"refused: {measured.slot.run_dir} is flagged: {'; '.join(reasons)}")
    return notes


def _runs(plan: GatePlan, data: Measurements, workload: str, side: Side | None) -> list[RunMeasure]:
    """The measured runs of one cell, in repetition order (none for a missing side)."""
    if side is None:
        return []
    return [data.run_at(slot.run_dir) for slot in plan.runs_of(workload, side)]


def evaluate_metric(
    claim: Claim, spec: GateSpec, plan: GatePlan, data: Measurements
) -> ClaimResult:
    workload, metric = str(claim.workload), str(claim.metric)
    of_runs = _runs(plan, data, workload, claim.of)
    over_runs = _runs(plan, data, workload, claim.over)
    a = [metric_value(m.summary, metric) for m in of_runs]
    b = [metric_value(m.summary, metric) for m in over_runs]
    sources = [str(m.slot.run_dir) for m in of_runs + over_runs]
    refused = _refusals(of_runs + over_runs)
    if refused:
        return _result(claim, None, (a, b), sources, refused, refused=True)
    notes = _flags([m.summary for m in of_runs + over_runs])
    interval = None
    if None in a or None in b:
        notes.append(f"{metric} is missing from a run (no completed request?)")
    elif claim.over is not None and min(b) <= 0:
        notes.append(f"{metric} of {claim.over.label} is 0 in a run: no ratio")
    else:
        interval = bootstrap_interval(
            a, b if claim.over is not None else None, spec.confidence, spec.resamples, spec.seed
        )
    return _result(claim, interval, (a, b), sources, notes)


def evaluate_identical(claim: Claim, plan: GatePlan, data: Measurements) -> ClaimResult:
    workload = str(claim.workload)
    reference_slot = plan.runs_of(workload, claim.over or claim.of)[0]
    slots = plan.runs_of(workload, claim.of)
    sources = [str(reference_slot.run_dir)] + [str(s.run_dir) for s in slots]
    refused = _refusals([data.run_at(s.run_dir) for s in [reference_slot, *slots]])
    if refused:
        return _result(claim, None, ([], []), sources, refused, refused=True)
    reference = read_requests(reference_slot.run_dir)
    shares: list[float] = []
    notes: list[str] = []
    for slot in slots:
        share, differing = identical_share(reference, read_requests(slot.run_dir))
        shares.append(share)
        if differing:
            shown = ", ".join(differing[:8]) + (" ..." if len(differing) > 8 else "")
            notes.append(f"rep {slot.repetition + 1}: requests {shown} differ")
    worst = min(shares)
    interval = Interval(worst, worst, worst, 1.0, len(shares))
    return _result(claim, interval, (shares, []), sources, notes)


def evaluate_perplexity(claim: Claim, plan: GatePlan, data: Measurements) -> ClaimResult:
    of = data.perplexity_at(plan.perplexity_of(claim.of, claim.windows).path)
    measured = [of]
    value = of.perplexity
    if claim.over is not None:
        over = data.perplexity_at(plan.perplexity_of(claim.over, claim.windows).path)
        measured.append(over)
        value = of.perplexity / over.perplexity
    interval = Interval(value, value, value, 1.0, 1)
    values = ([of.perplexity], [m.perplexity for m in measured[1:]])
    return _result(claim, interval, values, [str(m.slot.path) for m in measured], [])


def evaluate(spec: GateSpec, plan: GatePlan, data: Measurements) -> list[ClaimResult]:
    results = []
    for claim in spec.claims:
        if claim.kind == "metric":
            results.append(evaluate_metric(claim, spec, plan, data))
        elif claim.kind == "identical":
            results.append(evaluate_identical(claim, plan, data))
        else:
            results.append(evaluate_perplexity(claim, plan, data))
    return results
