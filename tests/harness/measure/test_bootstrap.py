"""Gate statistics: the paired bootstrap interval and the three-valued verdict, exactly."""

from __future__ import annotations

import pytest

from servelab.harness.measure.bootstrap import Outcome, bootstrap_interval, verdict


def test_pairs_are_resampled_together() -> None:
    # every repetition of A is exactly twice its B: any paired resample has ratio 2, whereas
    # resampling the sides independently would spread the ratio from 1/3 to 6
    interval = bootstrap_interval([2.0, 4.0, 12.0], [1.0, 2.0, 6.0], 0.95, 2000, seed=0)
    assert (interval.estimate, interval.low, interval.high) == (2.0, 2.0, 2.0)
    assert interval.samples == 3


def test_interval_is_the_percentiles_of_resampled_means_and_repeatable() -> None:
    first = bootstrap_interval([1.0, 2.0, 4.0], None, 0.9, 4000, seed=3)
    again = bootstrap_interval([1.0, 2.0, 4.0], None, 0.9, 4000, seed=3)
    assert first == again
    assert first.estimate == pytest.approx(7 / 3)
    # resample means lie between the smallest and the largest value
    assert 1.0 <= first.low < first.estimate < first.high <= 4.0


def test_one_value_is_a_point() -> None:
    interval = bootstrap_interval([0.25], [0.5], 0.95, 2000, seed=0)
    assert (interval.estimate, interval.low, interval.high, interval.samples) == (
        0.5,
        0.5,
        0.5,
        1,
    )


@pytest.mark.parametrize("b", [[1.0, 0.0], [1.0]])
def test_a_ratio_needs_one_positive_denominator_per_repetition(b: list[float]) -> None:
    with pytest.raises(ValueError, match="positive denominator"):
        bootstrap_interval([1.0, 2.0], b, 0.95, 100, seed=0)


@pytest.mark.parametrize(
    ("low", "high", "bound", "direction", "expected"),
    [
        (1.6, 1.8, 1.5, "at_least", Outcome.PASS),
        (1.5, 1.8, 1.5, "at_least", Outcome.PASS),
        (1.2, 1.4, 1.5, "at_least", Outcome.FAIL),
        (1.4, 1.6, 1.5, "at_least", Outcome.INCONCLUSIVE),
        (0.2, 0.4, 0.5, "at_most", Outcome.PASS),
        (0.2, 0.5, 0.5, "at_most", Outcome.PASS),
        (0.6, 0.9, 0.5, "at_most", Outcome.FAIL),
        (0.4, 0.6, 0.5, "at_most", Outcome.INCONCLUSIVE),
    ],
)
def test_verdict(low: float, high: float, bound: float, direction: str, expected: Outcome) -> None:
    assert verdict(low, high, bound, direction) is expected
