"""The knee from every rate probe at once: an attainment curve fitted over the log of the rate,
and the interval of rates its likelihood cannot tell from the knee.

One probe says little on its own. At 48 requests a share of 0.9 has a 95% Wilson interval of
about +-0.09, so a probe is called a clear pass only near 0.97 and a clear failure only near
0.8; on the default comparison that band spans about 2x in rate, and a bracket of [highest
clear pass, lowest clear failure] cannot narrow below it however many probes run. Every
probe's requests are evidence about one curve, though:

    logit P(a request meets the SLO at rate r) = logit(target) - slope * (ln r - ln knee)

fitted by maximum likelihood on each completed rate probe's (met, counted), with the slope
at least 0 (attainment does not rise with load). The knee's interval holds every knee whose
profile likelihood (the slope fitted again for that knee) is within the chi-square bound of
the best at the search's confidence. Requests of one run share queues, so they vary more than
independent draws would: the bound is scaled by the fit's Pearson dispersion (at least 1, the
quasi-likelihood rule), so probes that disagree with the curve widen the interval. A probe
stopped early is left out (its share is only a bound); so is a fit that no probe below the
target and no probe above it pins down: then there is no interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

MAX_SLOPE = 200.0  # steeper than any measured curve; bounds the fit of a clean step
GRID_POINTS = 801  # candidate knees, log-spaced over the probed rates widened by GRID_SPAN
GRID_SPAN = 4.0
NEWTON_STEPS = 50


@dataclass(frozen=True)
class RateEvidence:
    """One completed rate probe: its rate and how many of its counted requests met the SLO."""

    rate: float
    met: int
    counted: int


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

    @property
    def width(self) -> float:
        """high / low, inf where a side is unbounded."""
        if self.low is None or self.high is None:
            return math.inf
        return self.high / self.low


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _best_slope(z: np.ndarray, met: np.ndarray, counted: np.ndarray, offset: float) -> float:
    """The slope in [0, MAX_SLOPE] maximising the likelihood of logit p = offset - slope * z
    (the log-likelihood is concave in the slope: Newton's method, clamped to the range)."""
    slope = 1.0
    for _ in range(NEWTON_STEPS):
        p = 1 / (1 + np.exp(-(offset - slope * z)))
        gradient = float(np.sum(-z * (met - counted * p)))
        curvature = float(np.sum(counted * p * (1 - p) * z * z))
        if curvature <= 0:
            break
        step = gradient / curvature
        slope = min(max(slope + step, 0.0), MAX_SLOPE)
        if abs(step) < 1e-9 * max(1.0, slope):
            break
    return slope


def _log_likelihood(
    z: np.ndarray, met: np.ndarray, counted: np.ndarray, offset: float, slope: float
) -> float:
    eta = offset - slope * z
    # log p = -log(1 + e^-eta), log(1 - p) = -log(1 + e^eta), both computed without overflow
    return float(np.sum(-met * np.logaddexp(0, -eta) - (counted - met) * np.logaddexp(0, eta)))


def fit_knee(evidence: Sequence[RateEvidence], target: float, confidence: float) -> KneeFit | None:
    """The knee where the fitted attainment crosses `target`, with its interval at
    `confidence`; None unless some probe measured at least the target and some below it."""
    kept = [e for e in evidence if e.counted > 0 and e.rate > 0]
    shares = [e.met / e.counted for e in kept]
    if not kept or max(shares) < target or min(shares) >= target:
        return None
    x = np.log([e.rate for e in kept])
    met = np.array([e.met for e in kept], dtype=float)
    counted = np.array([e.counted for e in kept], dtype=float)
    offset = _logit(target)
    span = math.log(GRID_SPAN)
    knees = np.linspace(x.min() - span, x.max() + span, GRID_POINTS)
    profile = np.empty(GRID_POINTS)
    slopes = np.empty(GRID_POINTS)
    for i, log_knee in enumerate(knees):
        slopes[i] = _best_slope(x - log_knee, met, counted, offset)
        profile[i] = _log_likelihood(x - log_knee, met, counted, offset, slopes[i])
    best = int(np.argmax(profile))
    if slopes[best] == 0.0:
        return None  # a flat curve crosses the target nowhere
    dispersion = _dispersion(x - knees[best], met, counted, offset, float(slopes[best]))
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
        requests=int(counted.sum()),
    )


def _dispersion(
    z: np.ndarray, met: np.ndarray, counted: np.ndarray, offset: float, slope: float
) -> float:
    """Pearson chi-square of the fit per degree of freedom (probes less the two parameters),
    at least 1; 1 when there are no degrees of freedom to estimate it from."""
    freedom = len(met) - 2
    if freedom <= 0:
        return 1.0
    p = 1 / (1 + np.exp(-(offset - slope * z)))
    variance = np.maximum(counted * p * (1 - p), 1e-9)
    pearson = float(np.sum((met - counted * p) ** 2 / variance))
    return max(1.0, pearson / freedom)
