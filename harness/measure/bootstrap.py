"""Bootstrap confidence intervals for a claim measured over repeated runs, and its verdict.

A gate repeats every run it needs R times, the strategies interleaved, so repetition `i` of
strategy A and repetition `i` of strategy B ran next to each other, under the same load of
the machine at that moment. The interval keeps those pairs together: each bootstrap resample
draws R repetition indices with replacement and takes the same indices for both sides, then
computes the statistic (the ratio of A's mean to B's mean, or A's mean alone against a
constant). The percentile interval at the stated confidence is what the verdict reads.

The verdict is three-valued. A claim passes when its whole interval lies on the claimed side
of the bound, fails only when its whole interval lies on the wrong side, and is inconclusive
when the interval straddles the bound: the runs cannot tell, and the gate says so instead of
guessing. With few repetitions the percentile interval is no wider than the spread of the
repetitions themselves, so a gate should repeat at least 3 times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

DIRECTIONS = ("at_least", "at_most")


class Outcome(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    REFUSED = "refused"  # a run it reads is flagged (harness.measure.flags): counts as fail


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    confidence: float
    samples: int  # repetitions (pairs) it was computed from


def statistic(a: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """Mean of `a` over the last axis, divided by the mean of `b` when there is one."""
    top = a.mean(axis=-1)
    return top if b is None else top / b.mean(axis=-1)


def bootstrap_interval(
    a: Sequence[float],
    b: Sequence[float] | None,
    confidence: float,
    resamples: int,
    seed: int,
) -> Interval:
    """Percentile interval of mean(a) / mean(b) (or mean(a)), resampling paired repetitions.

    `a` and `b` hold one value per repetition, in repetition order; with `b`, every value of
    `b` must be positive (a ratio over zero says nothing)."""
    first = np.asarray(a, dtype=np.float64)
    second = None if b is None else np.asarray(b, dtype=np.float64)
    if first.size == 0:
        raise ValueError("no values to bootstrap")
    if second is not None and (second.shape != first.shape or (second <= 0).any()):
        raise ValueError("a ratio needs one positive denominator value per repetition")
    estimate = float(statistic(first, second))
    if first.size == 1:
        return Interval(estimate, estimate, estimate, confidence, 1)
    rng = np.random.default_rng(seed)
    index = rng.integers(0, first.size, size=(resamples, first.size))
    values = statistic(first[index], None if second is None else second[index])
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail], method="linear")
    return Interval(estimate, float(low), float(high), confidence, int(first.size))


def verdict(low: float, high: float, bound: float, direction: str) -> Outcome:
    """Pass when [low, high] lies wholly on the claimed side of `bound`, fail when wholly on
    the wrong side, inconclusive when it straddles the bound."""
    if direction == "at_least":
        if low >= bound:
            return Outcome.PASS
        return Outcome.FAIL if high < bound else Outcome.INCONCLUSIVE
    if direction == "at_most":
        if high <= bound:
            return Outcome.PASS
        return Outcome.FAIL if low > bound else Outcome.INCONCLUSIVE
    raise ValueError(f"direction {direction!r} is not one of {DIRECTIONS}")
