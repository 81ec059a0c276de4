"""The knee from the latencies: SLO ratios, their quantile with censoring, the trend test, the
monotone fit's crossing, cliffs, and an interval that covers a made-up system's true knee."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np
import pytest

from servelab.base.records import RequestRecord
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.search.estimator import (
    RateSample,
    crossing,
    fit_knee,
    isotonic,
    knee_ratio,
    overdispersion,
    pooled_bounds,
    rate_quantiles,
    rate_samples,
)
from servelab.harness.search.policy import next_rate
from servelab.harness.search.probe_ratios import (
    FAR_ABOVE,
    ProbeRatios,
    binomial_cdf,
    dependence,
    fewest_runs_chance,
    order_statistic_bounds,
    probe_quantile,
    probe_ratios,
    quantile_bounds,
    ratio_quantile,
    request_ratio,
    rising,
)

SLO_LIMITS = SLO(ttft_s=0.5, tpot_s=0.1, normalized_latency_s=0.2)
Z90 = NormalDist().inv_cdf(0.9)


def record(**fields: object) -> RequestRecord:
    base: dict = {
        "id": "r",
        "prompt_len": 16,
        "output_len": 10,
        "t_scheduled": 1.0,
        "token_times": [],
        "output_ids": [],
        "finish_reason": "length",
    }
    return RequestRecord(**{**base, **fields})


def test_a_request_the_run_stopped_is_censored_at_what_it_had_waited() -> None:
    served = record(token_times=[1.25, *np.linspace(1.3, 1.7, 9).tolist()], t_done=1.7)
    assert request_ratio(served, SLO_LIMITS) == (pytest.approx(0.5), False)
    waiting = record(finish_reason="stopped", t_done=2.0)  # no token after 1 s: ttft >= 1 s
    assert request_ratio(waiting, SLO_LIMITS) == (pytest.approx(2.0), True)
    decoding = record(finish_reason="stopped", token_times=[1.1, 1.2], t_done=2.0)
    value, censored = request_ratio(decoding, SLO_LIMITS)  # tpot >= 0.9 s / 9 at the least
    assert (value, censored) == (pytest.approx(1.0), True)
    unsent = record(finish_reason="stopped", t_scheduled=3.0, t_done=2.0)
    assert request_ratio(unsent, SLO_LIMITS) is None
    assert request_ratio(record(finish_reason="rejected", t_done=1.0), SLO_LIMITS) == (
        math.inf,
        False,
    )


def test_a_probe_counts_its_arrived_requests_in_arrival_order() -> None:
    late = record(t_scheduled=1.5, token_times=[1.75, 1.8], t_done=1.8, output_len=2)
    early = record(t_scheduled=1.0, token_times=[1.1, 1.2], t_done=1.2, output_len=2)
    warmup = record(t_scheduled=0.5, token_times=[0.6, 0.7], t_done=0.7, excluded=True)
    unsent = record(finish_reason="stopped", t_scheduled=9.0, t_done=2.0)
    probe = probe_ratios(3.0, [late, unsent, warmup, early], SLO_LIMITS)
    assert probe.rate == 3.0
    assert probe.ratios == pytest.approx((1.0, 0.75))  # early: tpot 0.1 / 0.1; late: normalized
    assert probe.censored == (False, False)


def test_order_statistic_bounds_hold_the_quantile_at_their_confidence() -> None:
    assert order_statistic_bounds(48, 0.9, 0.95) == (38, 47)
    for count in (20, 48, 96, 200, 5000):  # thousands: a rate probed several times
        low, high = order_statistic_bounds(count, 0.9, 0.95)
        cdf = binomial_cdf(count, 0.9)
        below = cdf[low] if low >= 0 else 0.0
        above = 1 - cdf[high] if high < count else 0.0
        assert below <= 0.025 and above <= 0.025
        assert low + 1 >= count or cdf[low + 1] > 0.025  # the tightest on each side
        assert high - 1 < 0 or 1 - cdf[high - 1] > 0.025
    assert binomial_cdf(3, 0.5).tolist() == pytest.approx([0.125, 0.5, 0.875, 1.0])


def test_a_censored_ratio_bounds_the_quantile_from_below_only() -> None:
    ratios = np.array([0.1 * i for i in range(1, 11)])
    censored = np.zeros(10, dtype=bool)
    assert ratio_quantile(ratios, censored, 0.5) == (pytest.approx(0.55), True)
    censored[2] = True  # 0.3 or more: it could lie above the median
    assert ratio_quantile(ratios, censored, 0.5) == (pytest.approx(0.55), False)
    censored[2], censored[9] = False, True  # the largest: the median is known
    assert ratio_quantile(ratios, censored, 0.5) == (pytest.approx(0.55), True)
    many = np.linspace(0.5, 1.5, 48)
    high_censored = many > 1.2
    low, high = quantile_bounds(many, high_censored, 0.9, 0.95)
    assert low == pytest.approx(many[38]) and high == math.inf


def test_a_rising_probe_is_over_capacity_and_a_steady_one_is_not() -> None:
    rng = np.random.default_rng(1)
    steady = np.exp(rng.normal(-0.5, 0.3, 96))
    queueing = np.exp(np.linspace(-1.0, 1.5, 96) + rng.normal(0, 0.3, 96))
    assert not rising(steady)
    assert rising(queueing)
    below_one = np.exp(np.linspace(-3.0, -1.0, 96))  # rises, but never misses: not over it
    assert not rising(below_one)
    over = probe_quantile(ProbeRatios(2.0, tuple(queueing), (False,) * 96), 0.9, 0.95, 0.25)
    assert over.over_capacity and over.requests == 72 and over.level == math.log(FAR_ABOVE)


def test_isotonic_pools_adjacent_violators() -> None:
    fitted = isotonic(np.array([1.0, 3.0, 2.0, 4.0]), np.array([1.0, 1.0, 1.0, 1.0]))
    assert fitted.tolist() == [1.0, 2.5, 2.5, 4.0]
    weighted = isotonic(np.array([2.0, 0.0]), np.array([1.0, 3.0]))
    assert weighted.tolist() == [0.5, 0.5]


def test_the_crossing_interpolates_in_log_rate_and_says_a_cliff() -> None:
    rates = np.array([1.0, 2.0, 4.0])
    found = crossing(rates, np.array([-1.0, -0.2, 0.2]), np.ones(3))
    assert found.rate == pytest.approx(2.0 * math.sqrt(2.0))
    assert (found.below, found.above, found.cliff) == (2.0, 4.0, False)
    cliff = crossing(rates, np.array([-1.0, -0.5, math.log(40.0)]), np.ones(3))
    assert cliff.cliff and (cliff.below, cliff.above) == (2.0, 4.0)
    steep = crossing(rates, np.array([-1.0, -0.5, math.log(5.0)]), np.ones(3))
    assert not steep.cliff and steep.rate is not None
    queueing = crossing(rates, np.array([-1.0, -0.5, 0.5]), np.ones(3), np.array([0, 0, 1]))
    assert queueing.cliff and queueing.above == 4.0
    everywhere_below = crossing(rates, np.array([-3.0, -2.0, -1.0]), np.ones(3))
    assert (everywhere_below.rate, everywhere_below.below) == (None, 4.0)
    everywhere_above = crossing(rates, np.array([1.0, 2.0, 3.0]), np.ones(3))
    assert (everywhere_above.rate, everywhere_above.above) == (None, 1.0)


def made_up(rate: float, requests: int, rng: np.random.Generator, knee: float = 2.0) -> ProbeRatios:
    """A system whose 0.9-quantile of ratios is (rate / knee)^3: its knee is `knee` req/s."""
    logs = 3 * math.log(rate / knee) + 0.4 * (rng.standard_normal(requests) - Z90)
    return ProbeRatios(rate, tuple(np.exp(logs)), (False,) * requests)


def searched(knee: float, rng: np.random.Generator, requests: int = 48) -> tuple:
    """Probes at 0.7x, 1x and 1.3x of a guess off by up to ~2x, then where `next_rate` says
    until the fit crosses; the knee and the probes it took."""
    guess = knee * math.exp(rng.normal(0.0, 0.3))
    probes = [made_up(share * guess, requests, rng, knee) for share in (0.7, 1.0, 1.3)]
    fitted = fit_knee(probes, 0.9, 0.95)
    while (fitted.estimate is None and not fitted.cliff or fitted.width == math.inf) and len(
        probes
    ) < 8:
        probes.append(made_up(next_rate(fitted), requests, rng, knee))
        fitted = fit_knee(probes, 0.9, 0.95)
    return fitted, len(probes)


def test_the_interval_covers_a_made_up_knee_in_90_of_100_seeded_trials() -> None:
    """Probes of 48 requests placed as a search places them (`searched`): the 95% interval
    holds the true knee in at least 90 trials of 100, bounded on both sides."""
    covered = bounded = 0
    for seed in range(100):
        knee, _ = searched(2.0, np.random.default_rng(seed))
        covered += (knee.low is None or knee.low <= 2.0) and (knee.high is None or knee.high >= 2.0)
        bounded += knee.width < math.inf
    assert covered >= 90 and bounded >= 90


def test_a_strategy_slowed_by_k_has_its_knee_moved_down_by_about_k() -> None:
    """The same made-up system, and one 1.5x slower (every latency 1.5x at the same load: its
    knee at 2 / 1.5): the ratio of the two knees holds 1.5 in at least 90 trials of 100, and
    its estimate is within 10% of it in at least 90."""
    covered = close = 0
    for seed in range(100):
        rng = np.random.default_rng(1000 + seed)
        fast, _ = searched(2.0, rng)
        slow, _ = searched(2.0 / 1.5, rng)
        ratio = knee_ratio(fast, slow)
        covered += (ratio.low or 0.0) <= 1.5 <= (ratio.high or math.inf)
        close += ratio.estimate is not None and abs(ratio.estimate / 1.5 - 1) < 0.1
    assert covered >= 90 and close >= 90


def test_the_next_probe_goes_where_the_fit_lacks_a_side_else_to_its_wider_side() -> None:
    rng = np.random.default_rng(5)
    below_all = fit_knee([made_up(r, 48, rng) for r in (0.5, 0.7)], 0.9, 0.95)
    assert next_rate(below_all) == pytest.approx(1.4)  # no rate above the knee yet: higher
    above_all = fit_knee([made_up(r, 48, rng) for r in (4.0, 6.0)], 0.9, 0.95)
    assert next_rate(above_all) == pytest.approx(2.0)  # none below it: lower
    crossed = fit_knee([made_up(r, 96, rng) for r in (1.4, 2.0, 2.6)], 0.9, 0.95)
    estimate, low, high = crossed.estimate, crossed.low, crossed.high
    assert estimate is not None and low is not None and high is not None
    far = low if estimate / low >= high / estimate else high  # the interval's wider side
    assert next_rate(crossed) == pytest.approx(math.sqrt(estimate * far))
    assert min(estimate, far) < next_rate(crossed) < max(estimate, far)
    # at 1 req/s the 0.9-quantile is 0.5 but 3 of 48 requests at 3x their limit put its upper
    # bound above 1: no low end, so that rate again (new requests pooled with these can bound
    # it; one lower would bound a lower end)
    apart = ((0.5,) * 15 + (3.0,)) * 3  # far apart: independent draws
    tail = ProbeRatios(1.0, apart, (False,) * 48)
    over = ProbeRatios(2.0, (5.0,) * 48, (False,) * 48)
    straddled = fit_knee([tail, over], 0.9, 0.95)
    assert straddled.below == 1.0 and straddled.low is None
    assert next_rate(straddled) == 1.0
    again = ProbeRatios(1.0, (0.5,) * 96, (False,) * 96)
    bounded = fit_knee([tail, over, again], 0.9, 0.95).low
    assert bounded is not None and bounded >= 1.0


def test_a_knee_above_every_probe_is_bounded_by_the_ceiling() -> None:
    rng = np.random.default_rng(3)
    probes = [made_up(rate, 48, rng) for rate in (0.5, 0.7, 0.9)]  # all well below the knee
    knee = fit_knee(probes, 0.9, 0.95, ceiling=3.5)
    assert (knee.estimate, knee.low, knee.high, knee.cliff) == (None, 0.9, 3.5, False)
    assert fit_knee(probes, 0.9, 0.95).high is None


def test_speed_drift_widens_both_ends() -> None:
    rng = np.random.default_rng(7)
    probes = [made_up(rate, 96, rng) for rate in (1.4, 2.0, 2.6)]
    plain = fit_knee(probes, 0.9, 0.95)
    widened = plain.widened(1.1)
    assert widened.estimate == plain.estimate
    assert widened.low == pytest.approx(plain.low / 1.1)
    assert widened.high == pytest.approx(plain.high * 1.1)
    assert widened.widened_by == 1.1


def test_a_ratio_of_two_knees_widened_for_one_drift_is_widened_by_it_once() -> None:
    """Both knees of a search widened x1.2 for its drift: their ratio's interval is the one
    of the knees as fitted, widened x1.2 on each side (their probes ran within one band of
    speeds), not x1.44; one knee unwidened (no rate fitted) leaves the ratio widened once."""
    rng = np.random.default_rng(7)
    fast = fit_knee([made_up(rate, 96, rng) for rate in (1.4, 2.0, 2.6)], 0.9, 0.95)
    slow = fit_knee([made_up(r / 2, 96, rng, 1.0) for r in (1.4, 2.0, 2.6)], 0.9, 0.95)
    assert None not in (fast.low, fast.high, slow.low, slow.high)
    plain = knee_ratio(fast, slow)
    drifted = knee_ratio(fast.widened(1.2), slow.widened(1.2))
    assert drifted.estimate == plain.estimate
    assert drifted.low == pytest.approx(plain.low / 1.2)
    assert drifted.high == pytest.approx(plain.high * 1.2)
    one = knee_ratio(fast.widened(1.2), slow)
    assert (one.low, one.high) == (pytest.approx(plain.low / 1.2), pytest.approx(plain.high * 1.2))


def test_an_outlier_s_bound_at_one_rate_does_not_hide_a_clear_rate_above_it() -> None:
    """Two of 48 requests at 0.7 req/s missed, far apart (its quantile's upper bound 1.45),
    every one at 1 req/s met with room (upper bound 0.6), 1.4 req/s is over capacity: the
    quantile at 0.7 is at most the one at 1, so the interval's low end is 1 req/s, not
    unbounded (a fit through the upper bounds pooled 1.45 with 0.6 into one level above 1)."""
    apart = (0.5,) * 15 + (1.45,) + (0.5,) * 16 + (1.45,) + (0.5,) * 15
    outliers = ProbeRatios(0.7, apart, (False,) * 48)
    clear = ProbeRatios(1.0, (0.6,) * 48, (False,) * 48)
    over = ProbeRatios(1.4, tuple(np.linspace(1.5, 40.0, 48)), (False,) * 48)
    points = rate_quantiles([outliers, clear, over], 0.9, 0.95)
    assert [q.high for q in points[:2]] == [1.45, 0.6] and points[2].over_capacity
    knee = fit_knee([outliers, clear, over], 0.9, 0.95)
    assert knee.cliff and (knee.below, knee.above) == (1.0, 1.4)
    assert knee.low == 1.0 and knee.high == 1.4


def test_the_high_end_is_the_first_rate_seen_above_one_not_an_interpolation() -> None:
    """Flat far below 1 at 0.5 req/s, every ratio 1.9 at 1 req/s (no queue seen growing, no
    cliff): a straight line in log-log crosses 1 near 0.72 req/s, but a curve that stays flat
    and then rises steeply (a queue forming) crosses anywhere up to 1 req/s, so the interval
    reaches 1 req/s; the estimate stays the interpolation."""
    flat = ProbeRatios(0.5, (0.5,) * 48, (False,) * 48)
    steep = ProbeRatios(1.0, (1.9,) * 48, (False,) * 48)
    knee = fit_knee([flat, steep], 0.9, 0.95)
    assert not knee.cliff and knee.estimate == pytest.approx(0.72, abs=0.01)
    assert knee.high == 1.0 and knee.low == pytest.approx(knee.estimate)


def test_requests_at_a_higher_rate_help_bound_a_lower_one() -> None:
    """One request of 48 missed at 0.8 req/s and one at 1 req/s: alone, each probe's upper
    bound is its largest ratio (2), so neither shows its rate sustained; the requests at 1
    req/s are no smaller than at 0.8, so the 96 together bound 0.8's quantile below 1 and
    the interval gains a low end between them."""
    missed = (0.5,) * 47 + (2.0,)
    low_rate, high_rate = (
        ProbeRatios(0.8, missed, (False,) * 48),
        ProbeRatios(1.0, missed, (False,) * 48),
    )
    over = ProbeRatios(2.0, tuple(np.linspace(1.5, 40.0, 48)), (False,) * 48)
    assert [q.high for q in rate_quantiles([low_rate, high_rate], 0.9, 0.95)] == [2.0, 2.0]
    lower, upper = pooled_bounds(rate_samples([low_rate, high_rate], 0.9, 0.95), 0.9, 0.95)
    assert upper.tolist() == [0.5, 2.0] and lower.tolist() == [0.5, 0.5]
    knee = fit_knee([low_rate, high_rate, over], 0.9, 0.95)
    assert knee.low is not None and 0.8 <= knee.low < 1.0 and knee.high == 2.0


def test_requests_waiting_in_one_queue_count_as_fewer_draws() -> None:
    """Misses that come in runs (a burst of arrivals makes several requests in a row wait) vary
    more than independent ones: the same ratios in runs of 6 count as fewer draws than spread
    apart; independent draws count as themselves."""
    rng = np.random.default_rng(0)
    spread = np.where(np.arange(240) % 10 == 9, 1.5, 0.5)  # every tenth missed
    runs = np.where(np.arange(240) % 60 >= 54, 1.5, 0.5)  # the same share, six in a row
    none = np.zeros(240, dtype=bool)
    assert dependence(spread, none) == 1.0 and dependence(runs, none) > 4
    assert dependence(rng.lognormal(size=240), none) < 1.5


def test_the_runs_test_is_exact() -> None:
    """The chance of at most so many runs, against every order of a few hits and misses
    counted; two misses in a row among 48 requests: 48 of the 1,128 orders."""
    for ones, zeros in ((3, 4), (5, 2), (4, 4), (6, 1)):
        orders = list(itertools.combinations(range(ones + zeros), ones))
        for runs in range(2, ones + zeros + 1):
            counted = 0
            for places in orders:
                marks = [index in places for index in range(ones + zeros)]
                counted += 1 + sum(a != b for a, b in itertools.pairwise(marks)) <= runs
            assert fewest_runs_chance(runs, ones, zeros) == pytest.approx(counted / len(orders))
    assert fewest_runs_chance(3, 46, 2) == pytest.approx(48 / 1128)


def test_fewer_draws_widen_the_quantile_s_interval() -> None:
    """As many draws as requests: the plain order-statistic interval; fewer: ranks of that many
    scaled to the sample, wider on both sides, and unbounded above once too few are left."""
    ratios = np.random.default_rng(1).lognormal(size=480)
    none = np.zeros(480, dtype=bool)
    plain = quantile_bounds(ratios, none, 0.9, 0.95)
    assert quantile_bounds(ratios, none, 0.9, 0.95, 480.0) == plain
    fewer = quantile_bounds(ratios, none, 0.9, 0.95, 120.0)
    assert fewer[0] < plain[0] and fewer[1] > plain[1]
    assert quantile_bounds(ratios, none, 0.9, 0.95, 20.0)[1] == math.inf
    runs = np.where(np.arange(240) % 120 >= 108, 1.5, 0.5)  # two runs of 12 misses
    queued = probe_quantile(ProbeRatios(1.0, tuple(runs), (False,) * 240), 0.9, 0.95)
    assert queued.high == math.inf  # 240 requests, about 21 draws: the largest may be below


def test_miss_shares_scattered_across_rates_count_as_fewer_draws() -> None:
    """A lower miss share at a higher rate is a draw's luck: 6 of 48 missed at 3.9 req/s but 3
    of 182 at 4.2 (a knee at an H100's speed, its misses in bursts) scatter more than
    binomial draws do, so each request counts as less than a draw and the interval widens;
    shares that rise with the rate, or scatter no more than a binomial's, leave it alone."""

    def sample(rate: float, count: int, missed: int) -> RateSample:
        ratios = np.where(np.arange(count) % (count // missed) == 0, 9.0, 0.5)[:count]
        ratios[missed * (count // missed) :] = 0.5
        return RateSample(rate, ratios, np.zeros(count, dtype=bool), False, float(count))

    lucky = [sample(1.95, 91, 1), sample(3.9, 48, 6), sample(4.2, 182, 3)]
    assert overdispersion(lucky) > 5
    rising_ = [sample(1.95, 91, 1), sample(3.9, 48, 3), sample(4.2, 182, 20)]
    assert overdispersion(rising_) == 1.0
    assert overdispersion([sample(0.7, 48, 2), sample(1.0, 48, 1)]) == 1.0
    probes = [ProbeRatios(s.rate, tuple(s.ratios), tuple(s.censored)) for s in lucky]
    narrow = fit_knee(probes[2:], 0.9, 0.95)
    wide = fit_knee(probes, 0.9, 0.95)
    assert narrow.low == 4.2 and (wide.low is None or wide.low < 4.2)


def test_a_rate_is_over_capacity_where_most_of_its_probes_are() -> None:
    """Near the knee one probe's burst can make its ratios rise: one rising probe of three at a
    rate does not make the rate over capacity; two of three do."""
    rising_ = ProbeRatios(2.0, tuple(np.linspace(0.5, 4.0, 48)), (False,) * 48)
    flat = ProbeRatios(2.0, (0.6,) * 48, (False,) * 48)
    assert [s.over_capacity for s in rate_samples([rising_, flat, flat], 0.9, 0.95)] == [False]
    assert [s.over_capacity for s in rate_samples([rising_, rising_, flat], 0.9, 0.95)] == [True]
    assert rate_samples([rising_, flat, flat], 0.9, 0.95)[0].probes == 3
