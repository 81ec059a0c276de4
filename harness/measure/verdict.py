"""A probe's verdict with its uncertainty: the SLO attainment's interval against the target.

A probe of n counted requests of which k met every SLO limit estimates the attainment k/n.
Its Wilson score interval at the search's confidence says how sure the verdict is: `PASS`
when the whole interval is at or above `slo.attainment`, `FAIL` when it is below, `KNEE`
when it straddles the target (the rate is at the knee, within what n requests can tell).
Requests of one run are not independent (they share queues), so the interval is a lower
bound on the uncertainty, not an exact one; lengthening a knee probe narrows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from statistics import NormalDist


class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    KNEE = "knee"  # the interval straddles the target


@dataclass(frozen=True)
class Attainment:
    met: int  # requests that met every limit
    counted: int  # requests counted (warm-up and cool-down excluded; failed ones count)
    low: float
    high: float

    @property
    def share(self) -> float:
        return self.met / self.counted if self.counted else 0.0


def wilson(met: int, counted: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval of a share met/counted at `confidence` (two-sided)."""
    if counted == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    share = met / counted
    centre = (share + z * z / (2 * counted)) / (1 + z * z / counted)
    spread = z * math.sqrt(share * (1 - share) / counted + z * z / (4 * counted**2))
    spread /= 1 + z * z / counted
    return max(0.0, centre - spread), min(1.0, centre + spread)


def attainment(met: int, counted: int, confidence: float) -> Attainment:
    low, high = wilson(met, counted, confidence)
    return Attainment(met, counted, low, high)


def verdict(measured: Attainment, target: float) -> Verdict:
    if measured.counted == 0 or measured.high < target:
        return Verdict.FAIL
    if measured.low >= target:
        return Verdict.PASS
    return Verdict.KNEE
