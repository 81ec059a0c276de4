"""The knee from the latencies: each probed rate's quantile of its requests' SLO ratios,
fitted monotone against the rate; the knee is the rate where the fit crosses 1.

A run attains `a` exactly when the a-quantile of its requests' SLO ratios is at most 1, so the
knee of "attainment >= a" is where that quantile, a continuous function of the load, crosses
1, and every request's margin counts, not only whether it met. Each probe's ratios, whether it
ran over capacity, its quantile and that quantile's distribution-free interval are
`probe_ratios`'s; here the probes are joined across rates. Probes at one rate are one sample.
Across rates, the log quantile is fitted non-decreasing in log rate (isotonic regression,
weighted by requests) and the crossing interpolated between the two rates around it; where
the rate above it is over capacity, or the fit jumps by more than `CLIFF` between them, the
curve has a cliff there: no interpolation is trusted, the knee lies in that bracket, and the
fit says so.

The interval: each rate's quantile has a distribution-free interval from order statistics
(the binomial count of its requests below the quantile, as MLPerf LoadGen bounds a latency
percentile). A request's ratio grows with the load, so the requests of every rate from r up
to a higher one are draws no smaller than r's: pooled, they bound r's quantile from above
(the tightest such pool counts), and the pooled requests from a lower rate up to r bound it
from below (`pooled_bounds`); a short probe's few largest ratios no longer decide alone. The
quantile rises with the load, so at a rate it is at most the least upper bound at any rate
above and at least the largest lower bound at any rate below: the first envelope crosses 1
at the interval's low end (interpolated: a curve that rises faster than a straight line in
log-log crosses later, which only moves the end inwards), the second first exceeds 1 at its
high end, at a probed rate: between two probes the curve may rise as steeply as it likes (a
queue forming), so no interpolation bounds it from above (`scripts.search_study` found
an interpolated high end inside the true knee). The caller widens it
by the machine's measured speed drift. A percentile bootstrap over requests under-covers
here: a resampled 0.9-quantile of 48 requests varies less than the quantile does, since the
resamples of the top order statistics repeat the few largest ratios.

Two knees give a ratio (`knee_ratio`) whose interval joins their intervals' ends, widened by
the drift once. Where the next probe goes, and how long it is, is the policy's
(`policy.ProbePolicy`), not the estimator's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from servelab.harness.search.probe_ratios import (
    CLUSTERED_CONFIDENCE,
    ProbeQuantile,
    ProbeRatios,
    dependence,
    quantile_bounds,
    ratio_quantile,
    rising,
    steady_arrays,
)

# a jump of the fitted ratio by more than this between adjacent probes is a cliff even with no
# queue seen growing; a steep but smooth rise is not one (a ratio growing as the cube of the
# rate jumps 8x between probes a factor 2 apart, and interpolates well in log-log)
CLIFF = 30.0


@dataclass(frozen=True)
class Knee:
    """The fitted knee (req/s) and its interval; None on a side nothing bounds. The one type of
    a knee: fitted on a strategy's rate probes (`fit_knee`), bounded by its ceiling alone
    before any (`Knee.unprobed`), or read back from `search.json`."""

    estimate: float | None  # None where the fit does not cross 1 smoothly (or at all)
    low: float | None
    high: float | None
    cliff: bool  # the fit jumps across the crossing: the knee is the bracket of two probes
    probes: tuple[ProbeQuantile, ...]  # one per probed rate (`rate_quantiles`)
    widened_by: float = 1.0  # the speed drift's factor its interval was widened by
    below: float | None = None  # the highest probed rate whose fitted ratio is at most 1
    above: float | None = None  # the lowest probed rate whose fitted ratio is above 1

    @classmethod
    def unprobed(cls, ceiling: float | None) -> Knee:
        """No rate probed: bounded above by the ceiling (the most served at once), if any."""
        return cls(None, None, ceiling, False, ())

    @property
    def width(self) -> float:
        """The interval as high / low; inf where a side is unbounded."""
        if self.low is None or self.high is None:
            return math.inf
        return self.high / self.low

    @property
    def centre(self) -> float | None:
        """The estimate, else the middle (in log rate) of the interval's bounded ends."""
        if self.estimate is not None:
            return self.estimate
        ends = [end for end in (self.low, self.high) if end]
        return math.prod(ends) ** (1 / len(ends)) if ends else None

    def widened(self, factor: float) -> Knee:
        """The interval moved out by `factor` on each bounded side (the speed drift)."""
        return replace(
            self,
            low=None if self.low is None else self.low / factor,
            high=None if self.high is None else self.high * factor,
            widened_by=self.widened_by * factor,
        )


def isotonic(levels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for level, weight in zip(levels, weights, strict=True):
        blocks.append([float(level), float(weight), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, weight_, count = blocks.pop()
            previous = blocks[-1]
            total = previous[1] + weight_
            previous[0] = (previous[0] * previous[1] + mean * weight_) / total
            previous[1], previous[2] = total, previous[2] + count
    return np.concatenate([np.full(int(count), mean) for mean, _, count in blocks])


@dataclass(frozen=True)
class Crossing:
    rate: float | None  # None: the fit does not cross 1 within the probed rates
    below: float | None  # the highest probed rate whose fitted ratio is at most 1
    above: float | None  # the lowest whose fitted ratio is above 1
    cliff: bool


def crossing(
    rates: np.ndarray, levels: np.ndarray, weights: np.ndarray, over: np.ndarray | None = None
) -> Crossing:
    """Where the non-decreasing fit of log ratio against log rate crosses 0 (ratio 1); a cliff
    where the rate above the crossing is over capacity (`over`) or the fit jumps by more than
    `CLIFF` to it."""
    order = np.argsort(rates, kind="stable")
    x, fitted = np.log(rates[order]), isotonic(levels[order], weights[order])
    at_or_below = np.flatnonzero(fitted <= 0.0)
    if at_or_below.size == 0:
        return Crossing(None, None, float(rates[order][0]), False)
    last = int(at_or_below[-1])
    if last == x.size - 1:
        return Crossing(None, float(rates[order][-1]), None, False)
    x0, x1, y0, y1 = x[last], x[last + 1], fitted[last], fitted[last + 1]
    below, above = float(rates[order][last]), float(rates[order][last + 1])  # exactly as probed
    saturated = over is not None and bool(over[order][last + 1])
    cliff = saturated or bool(y1 - y0 > math.log(CLIFF))
    if x1 == x0:
        return Crossing(below, below, above, cliff)
    return Crossing(float(math.exp(x0 + (x1 - x0) * (0 - y0) / (y1 - y0))), below, above, cliff)


@dataclass(frozen=True)
class RateSample:
    """Every steady request probed at one rate: draws of one load."""

    rate: float
    ratios: np.ndarray
    censored: np.ndarray
    over_capacity: bool  # most probes at this rate were
    effective: float  # independent draws they stand for: each probe's count over its `dependence`
    probes: int = 1

    def quantile(self, share: float, confidence: float) -> ProbeQuantile:
        """Their quantile and its interval, from the draws they stand for."""
        quantile, known = ratio_quantile(self.ratios, self.censored, share)
        bounds = quantile_bounds(self.ratios, self.censored, share, confidence, self.effective)
        return ProbeQuantile(
            self.rate, quantile, known, self.over_capacity, int(self.ratios.size), *bounds,
            self.effective, self.probes,
        )  # fmt: skip


def rate_samples(
    probes: Sequence[ProbeRatios], share: float, confidence: float, warmup_share: float = 0.0
) -> list[RateSample]:
    """One sample per probed rate, in rate order: the steady requests of every probe at that
    rate, over capacity where most of those probes were (near the knee a burst of misses can
    make one probe's ratios rise; past capacity every probe's do)."""
    by_rate: dict[float, list[ProbeRatios]] = {}
    for probe in probes:
        if probe.rate is not None:
            by_rate.setdefault(probe.rate, []).append(probe)
    samples = []
    for rate, group in sorted(by_rate.items()):
        steady = [steady_arrays(p, warmup_share) for p in group]
        ratios = np.concatenate([r for r, _ in steady])
        if ratios.size:
            over = 2 * sum(rising(r) for r, _ in steady) > len(steady)
            censored = np.concatenate([c for _, c in steady])
            effective = float(sum(r.size / dependence(r, c) for r, c in steady))
            samples.append(RateSample(rate, ratios, censored, over, effective, len(steady)))
    return samples


def rate_quantiles(
    probes: Sequence[ProbeRatios], share: float, confidence: float, warmup_share: float = 0.0
) -> list[ProbeQuantile]:
    """One quantile per probed rate, in rate order (`rate_samples`)."""
    samples = rate_samples(probes, share, confidence, warmup_share)
    return [sample.quantile(share, confidence) for sample in samples]


def overdispersion(samples: Sequence[RateSample]) -> float:
    """How much more the share of requests missing the SLO varies from rate to rate than
    independent draws allow (Pearson's statistic over its degrees of freedom, as a
    quasi-binomial dose-response fit estimates it), at least 1; 1 with no degree of freedom
    left. The miss share is fitted non-decreasing in rate (`isotonic`), so a lower share at a
    higher rate is a draw's luck: a probe's misses come in clusters (a burst of long prompts
    fills the KV and several requests wait behind it), so one probe's requests are fewer
    independent draws than its count, by more than their order in one probe shows
    (`dependence`). Only where the statistic exceeds the chi-square's `CLUSTERED_CONFIDENCE`
    quantile: with a degree of freedom or two it varies as much as the spread it measures.
    Rates over capacity are left out: their misses are a trend, not a draw."""
    steady = [s for s in samples if not s.over_capacity]
    counts = np.array([s.ratios.size for s in steady], dtype=np.float64)
    misses = np.array([np.count_nonzero((s.ratios > 1) | s.censored) for s in steady])
    if counts.size < 2:
        return 1.0
    fitted = isotonic(misses / counts, counts)
    dof = counts.size - np.unique(fitted).size
    if dof < 1:
        return 1.0
    share = np.clip(fitted, 0.5 / counts, 1 - 0.5 / counts)
    pearson = float((((misses - counts * share) ** 2) / (counts * share * (1 - share))).sum())
    z = NormalDist().inv_cdf(CLUSTERED_CONFIDENCE)  # chi-square's quantile (Wilson, Hilferty)
    critical = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    return max(pearson / dof, 1.0) if pearson > critical else 1.0


def pooled_bounds(
    samples: Sequence[RateSample], share: float, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each rate's quantile bounds from the requests of its neighbours too: a request's ratio
    grows with the load, so the requests at every rate from r up to a higher one are draws
    no smaller than r's, and their pooled upper bound bounds r's quantile from above (the
    tightest such pool counts); likewise the pooled requests of every rate from a lower one
    up to r bound it from below. Longer samples, narrower bounds: a probe that alone cannot
    show a rate sustained (its few largest ratios place its upper bound) can with the ones
    above it."""
    count = len(samples)
    upper, lower = np.full(count, math.inf), np.zeros(count)
    for i in range(count):
        for j in range(i, count):
            pool = samples[i : j + 1]
            ratios = np.concatenate([sample.ratios for sample in pool])
            censored = np.concatenate([sample.censored for sample in pool])
            effective = sum(sample.effective for sample in pool)
            low, high = quantile_bounds(ratios, censored, share, confidence, effective)
            upper[i] = min(upper[i], high)
            lower[j] = max(lower[j], low)
    return lower, upper


def fit_knee(
    probes: Sequence[ProbeRatios],
    share: float,
    confidence: float,
    warmup_share: float = 0.0,
    ceiling: float | None = None,
) -> Knee:
    """The knee where the `share`-quantile of the SLO ratios crosses 1, from every rate probe,
    with its `confidence` interval: its low end where the envelope of each rate's upper
    quantile bound (`pooled_bounds`) crosses 1, its high end at the lowest rate whose lower
    bound is above 1 (the curve may rise as steeply as it likes between two probes, so no
    interpolation bounds it there). `ceiling` (the most the system serves, every request at
    once) bounds it from above where no probe does."""
    samples = rate_samples(probes, share, confidence, warmup_share)
    spread = overdispersion(samples)
    samples = [replace(s, effective=min(s.effective, s.ratios.size / spread)) for s in samples]
    points = tuple(sample.quantile(share, confidence) for sample in samples)
    if not points:
        return Knee(None, None, None, False, points)
    rates = np.array([q.rate for q in points])
    weights = np.array([q.requests for q in points], dtype=np.float64)
    lower, upper = pooled_bounds(samples, share, confidence)

    def fitted(side: str | None) -> Crossing:
        bound = {"high": upper, "low": lower}.get(side or "")
        sided = points if bound is None else [
            replace(q, quantile=float(b)) for q, b in zip(points, bound, strict=True)
        ]  # fmt: skip
        over = np.array([q.over_capacity for q in sided])
        levels = np.array([q.level for q in sided])  # in rate order
        if side == "high":  # the quantile at r is at most any upper bound at a rate above r
            levels = np.minimum.accumulate(levels[::-1])[::-1]
        elif side == "low":  # ... and at least any lower bound at a rate below r
            levels = np.maximum.accumulate(levels)
        return crossing(rates, levels, weights, over)

    found, earliest, latest = fitted(None), fitted("high"), fitted("low")
    smooth = found.rate is not None and not found.cliff
    low = earliest.rate if earliest.rate is not None and not earliest.cliff else earliest.below
    return Knee(
        found.rate if smooth else None,
        low,
        latest.above or ceiling,
        found.cliff,
        points,
        below=found.below,
        above=found.above,
    )


@dataclass(frozen=True)
class Ratio:
    """One knee over another: the estimate and the interval (None on an unbounded side)."""

    estimate: float | None
    low: float | None
    high: float | None


def knee_ratio(top: Knee, bottom: Knee) -> Ratio:
    """`top`'s knee over `bottom`'s; its interval from the two intervals' far ends, so it
    holds whenever both hold (two 95% intervals: at least 90%).

    A speed drift moves both knees of one search the same way: each knee's interval is
    widened by the drift's factor F on each side (`Knee.widened`: its probes ran at
    speeds within F of the reference's), but the two knees' probes ran within one band of
    speeds F wide, so their ratio is off by at most F either way, not F squared. The ratio
    joins the far ends of the intervals as measured and is widened by F once."""
    estimate = (
        top.estimate / bottom.estimate
        if top.estimate is not None and bottom.estimate is not None
        else None
    )
    drift = max(top.widened_by, bottom.widened_by)
    undone = top.widened_by * bottom.widened_by / drift  # each end's widening off, F once on
    low = (
        top.low / bottom.high * undone if top.low is not None and bottom.high is not None else None
    )
    high = top.high / bottom.low / undone if top.high is not None and bottom.low else None
    return Ratio(estimate, low, high)
