"""The knee from every rate probe at once: an attainment curve fitted over the log of the rate,
and the interval of rates its likelihood cannot tell from the knee.

One probe says little on its own. At 48 requests a share of 0.9 has a 95% Wilson interval of
about +-0.09, so a probe is called a clear pass only near 0.97 and a clear failure only near
0.8; on the default comparison that band spans about 2x in rate, and a bracket of [highest
clear pass, lowest clear failure] cannot narrow below it however many probes run. Every
probe's requests are evidence about one curve, though:

    logit P(a request meets the SLO at rate r) = logit(target) - slope * (ln r - ln knee)

fitted by maximum likelihood on each rate probe's (met, counted), with the slope at least 0
(attainment does not rise with load). A probe stopped early over saturation
(`harness.runner.early_stop`) counts as censored evidence: at most `met` of its counted
requests could have met the SLO, so it adds the binomial probability of `met` or fewer;
without it, a knee whose only failures were stopped would have no upper bound. The knee's
interval holds every knee whose profile likelihood (the slope fitted again for that knee) is
within the chi-square bound of the best at the search's confidence. Requests of one run share
queues, so they vary more than independent draws would: the bound is scaled by the fit's
Pearson dispersion over the completed probes (at least 1, the quasi-likelihood rule), so
probes that disagree with the curve widen the interval. A fit that no probe below the target
and no probe at or above it pins down has no interval.

The likelihood counts the requests' noise, not the machine's: a shared VM's speed moved
12.5% within one search here, and two searches of one sitting fitted vllm's knee in
[1.361, 1.402] and [1.408, 1.516], intervals narrower than the run-to-run spread. A search
that measured its speed drift (the reference floor before the first probe and after the
last) therefore widens each fitted interval by it (`KneeFit.widened`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

MAX_SLOPE = 200.0  # steeper than any measured curve; bounds the fit of a clean step
GRID_POINTS = 801  # candidate knees, log-spaced over the probed rates widened by GRID_SPAN
GRID_SPAN = 4.0
GOLDEN_STEPS = 48  # narrows ln(1 + slope)'s range by 0.618 each: to about 1e-10 of it


@dataclass(frozen=True)
class RateEvidence:
    """One rate probe: its rate and how many of its counted requests met the SLO; for a probe
    stopped early, the most that could have (`met` is a bound, not a count)."""

    rate: float
    met: int
    counted: int
    stopped: bool = False


@dataclass(frozen=True)
class KneeFit:
    """The fitted knee and its interval (None on a side the probes do not bound)."""

    estimate: float
    low: float | None
    high: float | None
    slope: float  # attainment's logit lost per unit of ln rate, at the knee
    dispersion: float  # Pearson chi-square per degree of freedom, at least 1
    probes: int
    requests: int
    widened_by: float = 1.0  # each side moved out by this factor: the machine's speed drift

    @property
    def width(self) -> float:
        """high / low, inf where a side is unbounded."""
        if self.low is None or self.high is None:
            return math.inf
        return self.high / self.low

    def requests_for(self, resolution: float) -> int | None:
        """About how many requests in all the fit would need for an interval `resolution`
        wide (high / low = 1 + resolution): the interval's log width shrinks as one over the
        square root of the requests (the fit's own width, before any widening for drift).
        None where a side is unbounded."""
        fitted = self.width / self.widened_by**2  # more requests do not narrow the drift
        if math.isinf(fitted):
            return None
        shrink = math.log(fitted) / math.log(1 + resolution)
        return max(self.requests, math.ceil(self.requests * shrink**2))

    def widened(self, factor: float) -> KneeFit:
        """The interval moved out by `factor` on each side (low / factor, high x factor): a
        knee measured while the machine's speed moved by that factor could lie anywhere the
        fit allows at either speed, since a rate sustained scales with the speed."""
        return replace(
            self,
            low=None if self.low is None else self.low / factor,
            high=None if self.high is None else self.high * factor,
            widened_by=self.widened_by * factor,
        )


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


class EvidenceArrays:
    """The evidence as arrays: each completed probe's met of counted, and each stopped probe's
    bound (at most `met` of its `counted` met), with its binomial coefficients up to it."""

    def __init__(self, evidence: Sequence[RateEvidence]) -> None:
        exact = [e for e in evidence if not e.stopped]
        stopped = [e for e in evidence if e.stopped]
        self.x = np.log([e.rate for e in exact])
        self.met = np.array([e.met for e in exact], dtype=float)
        self.counted = np.array([e.counted for e in exact], dtype=float)
        self.stopped_x = np.log([e.rate for e in stopped])
        most = max((e.counted for e in stopped), default=0)
        self.k = np.arange(most + 1, dtype=float)
        self.stopped_n = np.array([e.counted for e in stopped], dtype=float).reshape(-1, 1)
        self.coefficients = np.full((len(stopped), most + 1), -np.inf)
        for row, e in enumerate(stopped):  # ln C(n, k) for each k up to the bound
            self.coefficients[row, : e.met + 1] = [
                math.lgamma(e.counted + 1) - math.lgamma(k + 1) - math.lgamma(e.counted - k + 1)
                for k in range(e.met + 1)
            ]

    def log_likelihood(self, log_knee: np.ndarray, slope: np.ndarray, offset: float) -> np.ndarray:
        """The log-likelihood of each (knee, slope) pair, up to a constant."""
        log_knee, slope = log_knee[:, None], slope[:, None]
        eta = offset - slope * (self.x[None, :] - log_knee)
        # log p = -log(1 + e^-eta), log(1 - p) = -log(1 + e^eta), both without overflow
        exact = -self.met * np.logaddexp(0, -eta) - (self.counted - self.met) * np.logaddexp(0, eta)
        total = exact.sum(axis=1)
        if len(self.stopped_x):
            eta = offset - slope * (self.stopped_x[None, :] - log_knee)
            log_p = -np.logaddexp(0, -eta)[..., None]
            log_q = -np.logaddexp(0, eta)[..., None]
            terms = self.coefficients + self.k * log_p + (self.stopped_n - self.k) * log_q
            total = total + np.logaddexp.reduce(terms, axis=2).sum(axis=1)
        return total

    def best_slopes(self, log_knees: np.ndarray, offset: float) -> tuple[np.ndarray, np.ndarray]:
        """For every knee at once, the slope in [0, MAX_SLOPE] maximising the likelihood (it
        is unimodal in the slope: golden-section search over ln(1 + slope)), and that
        likelihood."""
        low = np.zeros_like(log_knees)
        high = np.full_like(log_knees, math.log1p(MAX_SLOPE))
        ratio = (math.sqrt(5) - 1) / 2
        for _ in range(GOLDEN_STEPS):
            a = high - ratio * (high - low)
            b = low + ratio * (high - low)
            a_better = self.log_likelihood(log_knees, np.expm1(a), offset) >= self.log_likelihood(
                log_knees, np.expm1(b), offset
            )
            high = np.where(a_better, b, high)
            low = np.where(a_better, low, a)
        candidates = [np.expm1((low + high) / 2), np.zeros_like(log_knees)]
        likelihoods = [self.log_likelihood(log_knees, s, offset) for s in candidates]
        flat_better = likelihoods[1] > likelihoods[0]
        return (
            np.where(flat_better, candidates[1], candidates[0]),
            np.maximum(likelihoods[0], likelihoods[1]),
        )


def fit_knee(evidence: Sequence[RateEvidence], target: float, confidence: float) -> KneeFit | None:
    """The knee where the fitted attainment crosses `target`, with its interval at
    `confidence`; None unless some probe measured at least the target and some below it."""
    kept = [e for e in evidence if e.counted > 0 and e.rate > 0]
    shares = [e.met / e.counted for e in kept]
    if not kept or max(shares) < target or min(shares) >= target:
        return None
    probes = EvidenceArrays(kept)
    offset = _logit(target)
    rates = np.log([e.rate for e in kept])
    span = math.log(GRID_SPAN)
    knees = np.linspace(rates.min() - span, rates.max() + span, GRID_POINTS)
    slopes, profile = probes.best_slopes(knees, offset)
    best = int(np.argmax(profile))
    if slopes[best] == 0.0:
        return None  # a flat curve crosses the target nowhere
    dispersion = _dispersion(
        probes.x - knees[best], probes.met, probes.counted, offset, float(slopes[best])
    )
    chi2 = NormalDist().inv_cdf(0.5 + confidence / 2) ** 2  # chi-square, 1 degree of freedom
    inside = np.flatnonzero(2 * (profile[best] - profile) <= chi2 * dispersion)
    first, last = int(inside[0]), int(inside[-1])
    return KneeFit(
        estimate=float(math.exp(knees[best])),
        low=None if first == 0 else float(math.exp(knees[first])),
        high=None if last == GRID_POINTS - 1 else float(math.exp(knees[last])),
        slope=float(slopes[best]),
        dispersion=dispersion,
        probes=len(kept),
        requests=sum(e.counted for e in kept),
    )


def _dispersion(
    z: np.ndarray, met: np.ndarray, counted: np.ndarray, offset: float, slope: float
) -> float:
    """Pearson chi-square of the fit per degree of freedom (completed probes less the two
    parameters), at least 1; 1 when there are no degrees of freedom to estimate it from."""
    freedom = len(met) - 2
    if freedom <= 0:
        return 1.0
    p = 1 / (1 + np.exp(-(offset - slope * z)))
    variance = np.maximum(counted * p * (1 - p), 1e-9)
    pearson = float(np.sum((met - counted * p) ** 2 / variance))
    return max(1.0, pearson / freedom)
