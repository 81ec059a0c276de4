"""The knee fitted on every rate probe's requests: it finds a known curve's knee inside its
interval, narrows with more requests, widens when probes disagree, and refuses data that
does not pin a knee down; the search resolves by it where clear verdicts alone could not."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servelab.harness.search.attainment_curve import EvidenceArrays, RateEvidence, fit_knee
from servelab.harness.search.knee import KneeSettings, Outcome, find_knees
from tests.test_search import System


def _share(rate: float, knee: float, slope: float, target: float = 0.9) -> float:
    """A logistic attainment curve over ln rate that crosses `target` at `knee`."""
    logit = math.log(target / (1 - target)) - slope * (math.log(rate) - math.log(knee))
    return 1 / (1 + math.exp(-logit))


def _evidence(rates: list[float], requests: int, knee: float = 2.0) -> list[RateEvidence]:
    return [RateEvidence(r, round(requests * _share(r, knee, 4.0)), requests) for r in rates]


def test_the_fitted_knee_of_a_known_curve_lies_inside_its_interval() -> None:
    fit = fit_knee(_evidence([1.0, 1.5, 2.0, 2.5, 3.0], 400), 0.9, 0.95)
    assert fit is not None and fit.low is not None and fit.high is not None
    assert fit.low < 2.0 < fit.high
    assert fit.estimate == pytest.approx(2.0, rel=0.02)
    assert fit.slope == pytest.approx(4.0, rel=0.1)
    assert (fit.probes, fit.requests) == (5, 2000)


def test_more_requests_narrow_the_interval() -> None:
    rates = [1.0, 1.5, 2.0, 2.5, 3.0]
    few, many = (fit_knee(_evidence(rates, n), 0.9, 0.95) for n in (48, 768))
    assert few is not None and many is not None
    assert many.width < few.width


def test_probes_that_disagree_with_any_curve_widen_the_interval() -> None:
    steady = [RateEvidence(1.0, 47, 48), RateEvidence(2.0, 43, 48), RateEvidence(4.0, 30, 48)]
    jumpy = [*steady, RateEvidence(1.5, 30, 48), RateEvidence(3.0, 48, 48)]
    calm, noisy = fit_knee(steady, 0.9, 0.95), fit_knee(jumpy, 0.9, 0.95)
    assert calm is not None and noisy is not None
    assert calm.dispersion == 1.0 and noisy.dispersion > 2.0
    assert noisy.width > calm.width


def test_a_clean_step_puts_the_interval_between_the_last_pass_and_the_first_failure() -> None:
    steps = [RateEvidence(r, 48 if r <= 3.0 else 0, 48) for r in (2.5, 3.0, 3.5, 5.0)]
    fit = fit_knee(steps, 0.9, 0.95)
    assert fit is not None and fit.low is not None and fit.high is not None
    assert 3.0 <= fit.low < fit.estimate < fit.high <= 3.5


@pytest.mark.parametrize("met", [48, 30])
def test_probes_all_on_one_side_of_the_target_fit_no_knee(met: int) -> None:
    assert fit_knee([RateEvidence(1.0, met, 48), RateEvidence(2.0, met, 48)], 0.9, 0.95) is None


def test_one_side_unbounded_by_the_probes_is_left_open() -> None:
    fit = fit_knee([RateEvidence(1.0, 45, 48), RateEvidence(1.1, 42, 48)], 0.9, 0.95)
    assert fit is not None and fit.high is None and math.isinf(fit.width)


class SmoothSystem(System):
    """A strategy whose share of requests meeting the SLO falls smoothly with the rate (the
    expected count of a logistic curve): no single 48-request probe decides within 10%."""

    def at(self, rate: float, requests: int, repeat: int = 0) -> Outcome:
        self.calls.append(("rate", rate, requests))
        met = round(requests * _share(rate, self.knee, 6.0))
        return self._outcome(met, requests, requests / rate)


def test_the_fit_narrows_a_smooth_knee_that_clear_verdicts_leave_2x_wide() -> None:
    settings = KneeSettings(
        target=0.9, resolution=0.1, requests=48, max_requests=96, floor_requests=8,
        ceiling_requests=16, confidence=0.95,
    )  # fmt: skip
    system = SmoothSystem(knee=2.0, ceiling=10.0)
    knee = find_knees({"s": system}, settings, 1e6, clock=system.clock)[0]
    assert knee.fit is not None and knee.passed and knee.failed
    assert knee.fit.low is not None and knee.fit.high is not None
    assert knee.fit.low <= 2.0 <= knee.fit.high and knee.fit.width <= 1.15
    assert knee.passed <= 2.0 < knee.failed and knee.failed / knee.passed >= 2  # clear verdicts


def test_the_search_table_shows_each_fitted_knee_and_the_fitted_ratios() -> None:
    from servelab.harness.commands.search import fitted_text, needed_text, render_search
    from servelab.harness.search.attainment_curve import KneeFit
    from servelab.harness.search.knee import Knee, fitted_ratio

    fast = Knee("vllm", ceiling=4.0, passed=0.5, failed=2.0)
    fast.fit = KneeFit(1.0, 0.8, 1.2, 4.0, 1.0, 3, 192)
    slow = Knee("orca", ceiling=3.0, passed=0.4, failed=0.8)
    slow.fit = KneeFit(0.5, 0.4, 0.6, 4.0, 1.0, 4, 240)
    assert fitted_text(fast) == "1 [0.8, 1.2] (3 probes, 192 requests)"
    assert fitted_ratio(fast, slow) == pytest.approx((0.8 / 0.6, 1.2 / 0.4))
    unbounded = Knee("ft", fit=KneeFit(0.1, 0.05, None, 2.0, 1.0, 2, 96))
    assert fitted_text(unbounded) == "0.1 [0.05, ?] (2 probes, 96 requests)"
    assert fitted_ratio(fast, unbounded) == (None, pytest.approx(1.2 / 0.05))
    table = render_search([slow, fast], 0.1)
    assert "0.5 [0.4, 0.6] (4 probes, 240 requests)" in table
    assert "vllm / orca" in table and "1.33" in table and "3" in table
    # 10% of a 50% wide interval: (ln 1.5 / ln 1.1)^2 = 18.1 times the requests
    assert needed_text(slow.fit, 0.1) == (
        "fitted within 50%; 10% needs about 4104 more requests near 0.5 req/s (~8208 s)"
    )
    assert needed_text(unbounded.fit, 0.1) == ""


def test_a_fit_widened_for_the_speed_drift_moves_out_each_bounded_side() -> None:
    """A search whose machine slowed by 25% between its reference floors: each side of the
    fitted interval moves out by 1.25, an open side stays open, and the requests a narrower
    fit needs are those of the fit itself (more requests do not narrow the drift)."""
    from servelab.harness.commands.search import fitted_text, needed_text
    from servelab.harness.search.attainment_curve import KneeFit
    from servelab.harness.search.knee import Knee

    fit = KneeFit(1.0, 0.8, 1.2, 4.0, 1.0, 3, 192)
    wide = fit.widened(1.25)
    assert (wide.estimate, wide.low, wide.high) == (1.0, pytest.approx(0.64), pytest.approx(1.5))
    assert wide.widened_by == 1.25 and wide.width == pytest.approx(1.5 / 0.64)
    assert wide.requests_for(0.1) == fit.requests_for(0.1)
    assert fitted_text(Knee("vllm", fit=wide)) == (
        "1 [0.64, 1.5] (3 probes, 192 requests, widened x1.25 for the speed drift)"
    )
    assert needed_text(wide, 0.1) == needed_text(fit, 0.1).replace(
        "fitted within 50%", "fitted within 134% (50% before its widening for the speed drift)"
    )
    open_above = KneeFit(0.1, 0.05, None, 2.0, 1.0, 2, 96).widened(1.1)
    assert open_above.low == pytest.approx(0.05 / 1.1) and open_above.high is None


def test_a_probe_stopped_early_bounds_the_side_no_completed_probe_bounds() -> None:
    completed = [RateEvidence(1.0, 45, 48), RateEvidence(1.1, 42, 48)]
    stopped = RateEvidence(2.0, 10, 30, stopped=True)  # at most 10 of its first 30 could meet
    open_fit, bounded = fit_knee(completed, 0.9, 0.95), fit_knee([*completed, stopped], 0.9, 0.95)
    assert open_fit is not None and open_fit.high is None
    assert bounded is not None and bounded.high is not None
    assert 1.1 < bounded.high < 2.0
    assert (bounded.probes, bounded.requests) == (3, 126)


def test_a_stopped_probe_weighs_as_the_binomial_chance_of_at_most_its_bound() -> None:
    """Its log-likelihood term is log P(Binomial(n, p) <= met), p the curve's share there."""
    probes = EvidenceArrays([RateEvidence(2.0, 3, 7, stopped=True)])
    offset, slope, log_knee = math.log(9), 1.5, math.log(1.2)
    p = 1 / (1 + math.exp(-(offset - slope * (math.log(2.0) - log_knee))))
    expected = math.log(sum(math.comb(7, k) * p**k * (1 - p) ** (7 - k) for k in range(4)))
    got = probes.log_likelihood(np.array([log_knee]), np.array([slope]), offset)
    assert got[0] == pytest.approx(expected, rel=1e-12)
