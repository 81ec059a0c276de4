"""One probe's requests as SLO ratios, and their quantile: what the knee's estimator
(`estimator`) reads of each probe.

A request's SLO ratio is the largest of metric / limit over the SLO's limits (`SLO.ratio`): at
most 1, it met the SLO. A request not served to the end (stopped over saturation) has a ratio
known only from below: it is censored at that bound, and a quantile is known while the censored
requests lie above it. The first `warmup_share` of a probe's requests (in arrival order) are
left out, and the rest are tested for a trend: a probe over capacity has a queue growing
through it, so its ratios rise with arrival order whatever their quantile (the slope test
GuideLLM uses for over-saturation); such a probe counts as far above 1 (`FAR_ABOVE`). A
quantile's interval comes from order statistics (the binomial count of the requests below it,
as MLPerf LoadGen bounds a latency percentile), from as many draws as the requests stand for
(`dependence`: misses clustered in arrival order are fewer draws than requests).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from statistics import NormalDist

import numpy as np

from servelab.base.records import RequestRecord
from servelab.harness.measure.metrics import request_latency
from servelab.harness.measure.slo.limits import SLO, RequestLatency

FAR_ABOVE = 10.0  # the ratio a probe over capacity counts as (a bound, not a measurement)
# one-sided, of the tests that take a probe's requests as fewer draws than their count (misses
# clustered in arrival order: `dependence`; miss shares scattered across rates more than a
# binomial's: `overdispersion`); below it, as many draws as requests
CLUSTERED_CONFIDENCE = 0.95
TREND_CONFIDENCE = 0.99  # one-sided, of the rising trend that marks a probe over capacity


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
    ratios, censored = steady_arrays(probe, warmup_share)
    effective = float(ratios.size / (1.0 if independent else dependence(ratios, censored)))
    quantile, known = ratio_quantile(ratios, censored, share)
    low, high = quantile_bounds(ratios, censored, share, confidence, effective)
    size = int(ratios.size)
    return ProbeQuantile(probe.rate, quantile, known, rising(ratios), size, low, high, effective)


def steady_arrays(probe: ProbeRatios, warmup_share: float) -> tuple[np.ndarray, np.ndarray]:
    """A probe's ratios and censored flags without its first `warmup_share` of requests."""
    ratios = np.asarray(probe.ratios, dtype=np.float64)
    censored = np.asarray(probe.censored, dtype=bool)
    skip = int(math.floor(warmup_share * ratios.size))
    return ratios[skip:], censored[skip:]


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


def fewest_runs_chance(runs: int, ones: int, zeros: int) -> float:
    """The chance that `ones` and `zeros` in a random order make at most `runs` runs: the
    runs test (Wald and Wolfowitz), exact: a probe near its knee has a handful of misses, where
    the normal approximation is far out (two misses in a row among 48 requests: 1 in 14,000
    by it, 1 in 24 in fact)."""
    ways = 0
    for total in range(2, runs + 1):
        half, odd = divmod(total, 2)
        if odd:
            ways += math.comb(ones - 1, half - 1) * math.comb(zeros - 1, half)
            ways += math.comb(ones - 1, half) * math.comb(zeros - 1, half - 1)
        else:
            ways += 2 * math.comb(ones - 1, half - 1) * math.comb(zeros - 1, half - 1)
    return ways / math.comb(ones + zeros, ones)


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
    if fewest_runs_chance(runs, hits, count - hits) > 1.0 - CLUSTERED_CONFIDENCE:
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
