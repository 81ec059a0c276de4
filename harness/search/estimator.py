"""The knee from the latencies: each probed rate's quantile of its requests' SLO ratios,
fitted monotone against the rate; the knee is the rate where the fit crosses 1.

A request's SLO ratio is the largest of metric / limit over the SLO's limits (`SLO.ratio`):
at most 1, it met the SLO. A run attains `a` exactly when the a-quantile of its ratios is at
most 1, so the knee of "attainment >= a" is where that quantile, a continuous function of the
load, crosses 1, and every request's margin counts, not only whether it met. A request not
served to the end (stopped over saturation) has a ratio known only from below: it is censored
at that bound, and a quantile is known while the censored requests lie above it.

Per probe, the first `warmup_share` of the requests (in arrival order) are left out, and the
rest are tested for a trend: a probe over capacity has a queue growing through it, so its
ratios rise with arrival order whatever their quantile (the slope test GuideLLM uses for
over-saturation); such a probe counts as far above 1. Probes at one rate are one sample.
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
from functools import cache
from statistics import NormalDist

import numpy as np

from servelab.base.records import RequestRecord
from servelab.harness.measure.metrics import request_latency
from servelab.harness.measure.slo.limits import SLO, RequestLatency

FAR_ABOVE = 10.0  # the ratio a probe over capacity counts as (a bound, not a measurement)
# a jump of the fitted ratio by more than this between adjacent probes is a cliff even with no
# queue seen growing; a steep but smooth rise is not one (a ratio growing as the cube of the
# rate jumps 8x between probes a factor 2 apart, and interpolates well in log-log)
CLIFF = 30.0
TREND_CONFIDENCE = 0.99  # one-sided, of the rising trend that marks a probe over capacity
# one-sided, of the tests that take a probe's requests as fewer draws than their count (misses
# clustered in arrival order: `dependence`; miss shares scattered across rates more than a
# binomial's: `overdispersion`); below it, as many draws as requests
CLUSTERED_CONFIDENCE = 0.95


@dataclass(frozen=True)
class ProbeRatios:
    """One rate probe's requests: each one's SLO ratio in arrival order, and whether it is
    censored (known only to be at least that value)."""

    rate: float | None  # req/s; None for a probe that is no Poisson rate (floor, ceiling)
    ratios: tuple[float, ...]
    censored: tuple[bool, ...]

    def __post_init__(self) -> None:
        if len(self.ratios) != len(self.censored):
            raise ValueError("one censored flag per ratio")

    @property
    def met(self) -> int:
        """Requests that met the SLO (ratio at most 1, served to the end)."""
        return sum(v <= 1 and not c for v, c in zip(self.ratios, self.censored, strict=True))


@dataclass(frozen=True)
class ProbeQuantile:
    """What one probe says of the curve: its steady requests' ratio quantile (a lower bound
    where censored requests reach it), and whether it is over capacity."""

    rate: float | None
    quantile: float
    known: bool  # no censored request lies at or below the quantile
    over_capacity: bool  # its ratios rise through the probe
    requests: int  # steady requests (the warm-up share left out)
    low: float  # the quantile's distribution-free interval (`quantile_bounds`)
    high: float
    effective: float  # the independent draws its requests stand for (`dependence`)
    probes: int = 1  # the probes at its rate pooled into it

    @property
    def dependence(self) -> float:
        """Requests per independent draw (1 for a probe with none)."""
        return self.requests / self.effective if self.effective else 1.0

    @property
    def level(self) -> float:
        """The log ratio the fit takes from this probe."""
        if self.over_capacity:
            return math.log(FAR_ABOVE)
        return math.log(min(max(self.quantile, 1e-6), FAR_ABOVE))


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


def request_ratio(record: RequestRecord, slo: SLO) -> tuple[float, bool] | None:
    """A request's SLO ratio and whether it is censored: a request the run stopped before
    serving it to the end has only a lower bound, what it had waited by then against each
    limit; a failed or rejected one never meets the SLO (inf). None for one that had not
    arrived when the run stopped: it tells nothing of the load."""
    if record.succeeded:
        return slo.ratio(request_latency(record)), False
    if record.finish_reason != "stopped":
        return math.inf, False
    waited = record.delivered_at - record.t_scheduled
    if waited <= 0:
        return None
    times, planned = record.token_times, max(record.output_len, 1)
    first = times[0] - record.t_scheduled if times else waited
    pace = (record.delivered_at - times[0]) / (planned - 1) if times and planned > 1 else None
    so_far = RequestLatency(first, waited, pace, waited / planned, planned, record.prompt_len)
    return slo.ratio(so_far), True


def probe_ratios(rate: float | None, records: Sequence[RequestRecord], slo: SLO) -> ProbeRatios:
    """A rate probe's counted requests (warm-up and cool-down left out) in arrival order."""
    counted = sorted((r for r in records if not r.excluded), key=lambda r: r.t_scheduled)
    known = [ratio for ratio in (request_ratio(r, slo) for r in counted) if ratio is not None]
    return ProbeRatios(rate, tuple(v for v, _ in known), tuple(c for _, c in known))


def ratio_quantile(ratios: np.ndarray, censored: np.ndarray, share: float) -> tuple[float, bool]:
    """The `share`-quantile (numpy's linear interpolation) of the ratios, censored ones at
    their bound, and whether it is known: no censored ratio lies at or below it."""
    if ratios.size == 0:
        return math.inf, False
    value = float(np.quantile(np.minimum(ratios, 1e300), share, method="linear"))
    return value, not np.any(censored & (ratios <= value)).item()


def rising(ratios: np.ndarray, confidence: float = TREND_CONFIDENCE) -> bool:
    """Whether the log ratios rise with arrival order (least squares slope > 0 at
    `confidence`, one-sided) up to above 1 by the last arrival: a queue growing through it."""
    count = ratios.size
    if count < 8:
        return False
    y = np.log(np.clip(ratios, 1e-6, FAR_ABOVE))
    x = np.arange(count, dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    spread = math.sqrt(
        float(residual @ residual) / (count - 2) / float(((x - x.mean()) ** 2).sum())
    )
    z = NormalDist().inv_cdf(confidence)
    return bool(slope > z * spread and slope * (count - 1) + intercept > 0)


def probe_quantile(
    probe: ProbeRatios,
    share: float,
    confidence: float,
    warmup_share: float = 0.0,
    independent: bool = False,
) -> ProbeQuantile:
    """A probe's steady requests (the first `warmup_share` left out): their quantile, its
    `confidence` interval (from as many draws as they stand for, `dependence`; as many as
    they are where `independent`), their trend."""
    ratios, censored = _steady_arrays(probe, warmup_share)
    effective = float(ratios.size / (1.0 if independent else dependence(ratios, censored)))
    quantile, known = ratio_quantile(ratios, censored, share)
    low, high = quantile_bounds(ratios, censored, share, confidence, effective)
    size = int(ratios.size)
    return ProbeQuantile(probe.rate, quantile, known, rising(ratios), size, low, high, effective)


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


def binomial_cdf(n: int, p: float) -> np.ndarray:
    """P(X <= k) for k = 0..n, X ~ Binomial(n, p) (each term in logs: n reaches thousands)."""
    k = np.arange(n + 1)
    log_pmf = (
        np.array(
            [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(n + 1)]
        )
        + k * math.log(p)
        + (n - k) * math.log1p(-p)
    )
    return np.cumsum(np.exp(log_pmf))


@cache
def order_statistic_bounds(count: int, share: float, confidence: float) -> tuple[int, int]:
    """0-based ranks (l, u) of the sorted sample such that [x_l, x_u] holds the population's
    `share`-quantile with probability at least `confidence` (the distribution-free interval
    from the binomial count of requests below it); -1 or `count`: unbounded on that side."""
    tail = (1 - confidence) / 2
    cdf = binomial_cdf(count, share)
    low = int(np.count_nonzero(cdf[:count] <= tail)) - 1  # the cdf rises: a prefix passes
    high = count - int(np.count_nonzero(1 - cdf[:count][::-1] <= tail))
    return low, high


def fewest_requests(share: float, confidence: float) -> int:
    """The fewest requests whose `share`-quantile has an upper bound at `confidence` (below
    that, even the largest ratio may lie under it: a probe could not show a rate sustained)."""
    count = 1
    while order_statistic_bounds(count, share, confidence)[1] >= count:
        count += 1
    return count


def dependence(ratios: np.ndarray, censored: np.ndarray) -> float:
    """How many requests of one probe count as one independent draw: the integrated
    autocorrelation time, in arrival order, of "met the SLO" (ratio at most 1), fitted
    as a two-state Markov chain (from the mean lengths of its runs above and below: a chain
    that leaves a state after L steps on average has lag-one correlation 1 - 1/L_above -
    1/L_below, and its mean varies (1 + that) / (1 - that) times a binomial one's), at least 1.
    Requests served in one queue are not independent: a burst of arrivals makes several in a
    row miss, so the count of misses varies more than a binomial one, and an interval that
    takes them as independent is too narrow where queues last many requests (a fast machine's
    short probes). At the SLO's limit, not at the probe's own quantile: whether the quantile
    is at most 1 is a question of the misses, and the slowest tenth of a probe far below its
    knee comes in a burst too, without a miss among them. Run lengths, not summed sample
    autocorrelations, because a probe of 48 requests near its knee has about 5 misses: too
    few for lags beyond the first; and only where the runs are fewer than independent draws
    make at `CLUSTERED_CONFIDENCE` (the runs test), since an estimate from so few varies:
    independent requests would otherwise count as fewer draws about half the time."""
    if ratios.size < 2:
        return 1.0
    below = (ratios <= 1.0) & ~censored
    changes = np.flatnonzero(below[1:] != below[:-1])
    if changes.size == 0:
        return 1.0
    runs, count = changes.size + 1, below.size
    hits = int(np.count_nonzero(below))
    expected = 2 * hits * (count - hits) / count + 1  # the runs test (Wald and Wolfowitz)
    spread = math.sqrt((expected - 1) * (expected - 2) / (count - 1))
    if spread == 0 or (runs - expected) / spread > -NormalDist().inv_cdf(CLUSTERED_CONFIDENCE):
        return 1.0  # no fewer runs than independent draws would make, at that confidence
    lengths = np.diff(np.concatenate(([0], changes + 1, [count])))
    first_below = bool(below[0])
    runs_below = lengths[0 if first_below else 1 :: 2]
    runs_above = lengths[1 if first_below else 0 :: 2]
    correlation = 1.0 - 1.0 / runs_below.mean() - 1.0 / runs_above.mean()
    return max(float((1.0 + correlation) / (1.0 - correlation)), 1.0)


def quantile_bounds(
    ratios: np.ndarray,
    censored: np.ndarray,
    share: float,
    confidence: float,
    effective: float | None = None,
) -> tuple[float, float]:
    """The interval of the population's `share`-quantile of the ratios: order statistics, a
    censored ratio's bound standing for it below and infinity above. `effective` independent
    draws stand for the ratios (`dependence`; all of them where None): the binomial ranks of
    that many, scaled to the sample's."""
    count = ratios.size
    draws = count if effective is None else max(1, min(count, math.floor(effective)))
    low, high = order_statistic_bounds(draws, share, confidence)
    scale = count / draws
    low = math.floor((low + 1) * scale) - 1
    high = count if high >= draws else min(math.ceil((high + 1) * scale) - 1, count - 1)
    below = np.sort(ratios)
    above = np.sort(np.where(censored, math.inf, ratios))
    return (
        0.0 if low < 0 else float(below[low]),
        math.inf if high >= ratios.size else float(above[high]),
    )


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
        steady = [_steady_arrays(p, warmup_share) for p in group]
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


def _steady_arrays(probe: ProbeRatios, warmup_share: float) -> tuple[np.ndarray, np.ndarray]:
    """A probe's ratios and censored flags without its first `warmup_share` of requests."""
    ratios = np.asarray(probe.ratios, dtype=np.float64)
    censored = np.asarray(probe.censored, dtype=bool)
    skip = int(math.floor(warmup_share * ratios.size))
    return ratios[skip:], censored[skip:]


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
