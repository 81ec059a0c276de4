"""Where a strategy's next probe goes and how long it is: every rule that places or sizes a
probe, in one policy (`ProbePolicy.next_probe`), with its constants named beside it. The
estimator (`estimator.fit_knee`) says what the probes so far show; this says what to run next.

A strategy's probes, in the order the policy asks for them:

1. The floor probe serves requests one at a time: if even then the ratio quantile is
   certainly above 1, no rate is sustained.
2. The ceiling probe sends `ceiling_requests` at once: its throughput is the most the strategy
   serves, so it bounds every knee from above.
3. Rate probes start where a prediction says they decide (`Prediction`, the simulator's, made
   once the anchors have run): the highest rate its probes sustain at the search's
   confidence and the lowest they miss at it (`decisive_rate`), so the first two bound the
   knee if the simulation is right; else at half the ceiling. A first probe certainly over
   the knee drops the higher ones.
   Every rate probe lasts long enough in arrival time for a queue to show at its rate: its
   arrivals span at least `span` times one request served alone (the floor probe's time a
   request), and the arrivals of its first `warmup` such times are a warm-up, served but left
   out of its quantile (as AIPerf's and LoadGen's warm-ups are): a probe from an empty server
   looks better than the steady state it stands for. Both are in units of the machine's own
   service time, so one setting means the same on a 2-core CPU and on a GPU.
4. Then the knee is fitted on every rate probe and the next one goes where one more probe
   narrows the interval most (`next_rate`, kept below the ceiling). Once probes bracket the
   crossing, a probe is as long as the interval needs: a quantile's interval narrows as the
   square root of its requests, so a probe near an earlier one is longer by (the interval's
   log width over the resolution's) squared, at most `LONGER_AT_MOST` times, up to
   `max_requests`. Every rate probe draws its own requests (the workload's seed moved by the
   rate probes before it): probes on one draw would share its long prompts, and the estimator
   takes each probe as draws of its own.
   The search ends when the interval's high / low is within `1 + resolution`, or once its
   high end lies below every other strategy's low end (`SearchState.others_low`): every
   ratio over it is then one-sided ("orca sustains at least 5x fastertransformer's") and
   needs only that end, and the budget goes to the pairs still close.

The strategies share one budget (`pick`): a knee with no lower end is probed before any other
(a ratio over it is unbounded), among equals the strategy that has spent least on rate
probes, and none past an equal share of the rate probes' time while another's probe fits in
its own. The share binds a knee with no lower end too: a strategy whose quantile stays
uncertain at every rate it can afford (static batching's rare long waits) would otherwise
spend the whole budget on minutes-long probes at its low rates and leave every other knee one
probe wide. A probe that does not fit what is left is not run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servelab.harness.search.estimator import Knee
from servelab.harness.search.probe_ratios import ProbeQuantile
from servelab.harness.search.probes import Probe, ProbeSpec
from servelab.harness.search.result import StrategyResult

LOWEST_SHARE = 1 / 64  # the lowest rate probed, as a share of the ceiling
MOST_RATE_PROBES = 12  # a search not within the resolution by then ends unresolved
NEXT_STEP = 2.0  # beyond every probe, the next one this factor out (its square root inside)
LONGER_AT_MOST = 2.0  # a probe near an earlier one is at most this many times as long
STEP_OUT = 1.25  # from a predicted knee out to a rate whose probe decides, a step at a time
STEPS_OUT = 4  # at most, each way


@dataclass(frozen=True)
class Prediction:
    """A strategy's knee as predicted, and the rates the first probes go to."""

    knee: float  # where the predicted ratio quantile crosses 1
    below: float  # a rate predicted sustained at the search's confidence (or the nearest tried)
    above: float  # a rate predicted missed at it (or the nearest tried)


@dataclass(frozen=True)
class Done:
    """The strategy's search ends, and why ("" where its interval is within the resolution)."""

    note: str


@dataclass(frozen=True)
class SearchState:
    """What the policy decides from: a strategy's result so far (its probes, anchors included,
    in order, and the knee fitted on its rate probes) and its prediction."""

    result: StrategyResult
    prediction: Prediction | None = None
    others_low: float | None = None  # the lowest low end of the other strategies' knees

    @property
    def probes(self) -> list[Probe]:
        return self.result.probes

    @property
    def fit(self) -> Knee | None:
        return self.result.fit

    @property
    def rate_probes(self) -> list[Probe]:
        return self.result.rate_probes

    @property
    def knee(self) -> Knee:
        return self.result.knee

    def anchor(self, kind: str) -> Probe | None:
        return next((p for p in self.probes if p.spec.kind == kind), None)

    @property
    def ceiling(self) -> float | None:
        """Request throughput with every request at once: the most the strategy serves."""
        top = self.anchor("ceiling")
        return None if top is None else top.outcome.request_throughput

    @property
    def spent_s(self) -> float:
        """This strategy's rate probes so far, on the search's clock."""
        return sum(p.outcome.seconds for p in self.rate_probes)


@dataclass(frozen=True)
class ProbePolicy:
    """The search's settings of what to probe and for how long, and the rules that use them."""

    target: float  # slo.attainment: the quantile of the ratios that must be at most 1
    resolution: float  # done when the interval's high / low <= 1 + resolution
    requests: int  # a rate probe's first length
    max_requests: int  # a probe near an earlier one is lengthened up to this
    floor_requests: int
    ceiling_requests: int
    confidence: float  # of each probe's quantile interval and of the knee's
    skip_idle: bool = False  # probes skip their idle spans (`replay.skip_idle`): see `cost`
    span: float = 0.0  # a rate probe's arrivals span at least this many requests served alone
    warmup: float = 0.0  # its arrivals in the first this many requests alone: a warm-up

    def next_probe(self, state: SearchState) -> ProbeSpec | Done:
        """The strategy's next probe: the anchors, then the first rates, then where the fit
        says one more probe narrows the interval most; or the end of its search."""
        floor, top = state.anchor("floor"), state.anchor("ceiling")
        if floor is None:
            return ProbeSpec("floor", self.floor_requests)
        if floor.quantile.low > 1:
            return Done("one request at a time already misses the SLO: no rate is sustained")
        if top is None:
            return ProbeSpec("ceiling", self.ceiling_requests)
        ceiling = state.ceiling
        if not ceiling:
            return Done("the ceiling probe served nothing")
        pending = self._first_rates_left(state, ceiling)
        if pending:
            return self._spec(state, pending[0], lambda rate: self.requests)
        return self._steer(state, ceiling)

    def _first_rates_left(self, state: SearchState, ceiling: float) -> list[float]:
        """The first rates (the prediction's, below the ceiling; else half the ceiling) not yet
        run: each rate probe took the next while any was left, and one certainly over the knee
        dropped those above it."""
        start = [] if state.prediction is None else [state.prediction.below, state.prediction.above]
        pending = [rate for rate in start if rate < ceiling] or [ceiling / 2]
        for probe in state.rate_probes:
            if pending:
                pending.pop(0)
            if probe.quantile.low > 1 or probe.quantile.over_capacity:  # no need to go higher
                pending = [rate for rate in pending if rate < (probe.spec.rate or 0.0)]
        return pending

    def _steer(self, state: SearchState, ceiling: float) -> ProbeSpec | Done:
        """The next rate from the fit (`next_rate`), or the end of the search."""
        fit = state.fit
        assert fit is not None  # a rate probe ran
        rates = [p.spec.rate for p in state.rate_probes if p.spec.rate is not None]
        rate = next_rate(fit)
        assert rate is not None
        if fit.width <= 1 + self.resolution:
            return Done("a cliff: the ratio jumps between adjacent probes" if fit.cliff else "")
        if fit.high is not None and state.others_low is not None and fit.high <= state.others_low:
            return Done("below every other knee: a ratio over it needs only its high end")
        if len(rates) >= MOST_RATE_PROBES:
            return Done(f"not within {self.resolution:.0%} after {len(rates)} probes")
        if rate < min(rates) and min(rates) <= ceiling * LOWEST_SHARE:
            return Done(f"no rate down to {min(rates):.3g} req/s is sustained")
        if rate > max(rates) and max(rates) * (1 + self.resolution) >= ceiling:
            if fit.low is not None or fit.below is None:
                return Done(f"sustained up to {max(rates):.3g} req/s, near the ceiling")
            rate = again_then_out(fit, fit.below, 1 / math.sqrt(NEXT_STEP))  # a low end first
        bracketed = fit.below is not None and fit.above is not None
        length = (lambda r: self._length_near(state, r)) if bracketed else (lambda r: self.requests)
        return self._spec(state, min(rate, math.sqrt(max(rates) * ceiling)), length)

    def _length_near(self, state: SearchState, rate: float) -> int:
        """The requests a probe at `rate` needs: the nearest probe's (in log rate) times (the
        knee's log width over the resolution's) squared, at most `LONGER_AT_MOST` times it,
        within [requests, max_requests]."""
        nearest = self._nearest(state.rate_probes, rate)
        needed = (math.log(state.knee.width) / math.log(1 + self.resolution)) ** 2
        counted = nearest.spec.requests - nearest.spec.warmup
        count = round(counted * min(needed, LONGER_AT_MOST))
        return min(max(count, self.requests), self.max_requests)

    @staticmethod
    def _nearest(probes: list[Probe], rate: float) -> Probe:
        """The probe nearest `rate` in log rate."""
        return min(probes, key=lambda p: abs(math.log((p.spec.rate or 1.0) / rate)))

    def _spec(self, state: SearchState, rate: float, length: Callable[[float], int]) -> ProbeSpec:
        """A rate probe at `rate` (to 4 digits, as the run is named): as many counted requests
        as the precision asks (`length`), or as arrive within `span` requests served alone
        where that is more; a warm-up of those arriving within `warmup` of them before; on
        requests of its own (`ProbeSpec.draw`)."""
        rate = float(f"{rate:.4g}")
        alone_s = self.alone_s(state)
        precise, spanned = length(rate), math.ceil(rate * self.span * alone_s)
        steady = [p for p in state.rate_probes if not p.quantile.over_capacity]
        if steady:  # as many draws as asked: requests in one queue count as fewer
            dependence = self._nearest(steady, rate).quantile.dependence
            precise = min(math.ceil(precise * dependence), self.max_requests)
        counted = max(precise, spanned)
        warmup = math.ceil(rate * self.warmup * alone_s)
        count = counted + warmup
        sized_by = "span" if spanned > precise else "precision"
        return ProbeSpec("rate", count, rate, len(state.rate_probes), warmup, sized_by)

    @staticmethod
    def alone_s(state: SearchState) -> float:
        """One request served alone: the floor probe's time a request."""
        floor = state.anchor("floor")
        assert floor is not None
        return floor.outcome.served_s / floor.spec.requests

    def cost(self, state: SearchState, spec: ProbeSpec) -> float:
        """A rate probe's time: its requests' span at its rate, plus loading and drain (the
        ceiling probe's time beyond its serving, and one request alone). A probe that skips
        its idle spans takes about its busy time instead: each request alone where they
        rarely overlap, the span where they do."""
        top = state.anchor("ceiling")
        assert top is not None and spec.rate
        alone_s = self.alone_s(state)
        overhead_s = max(top.outcome.seconds - top.outcome.served_s, 0.0) + alone_s
        each_s = 1 / spec.rate
        if self.skip_idle:
            each_s = min(each_s, alone_s)
        return spec.requests * each_s + overhead_s

    def pick(self, waiting: Sequence[tuple[SearchState, float]], left_s: float) -> int | None:
        """Which strategy probes next, of those `waiting` (each its state and its next probe's
        cost): the first in turn whose probe fits what is left and stays within an equal share
        of the rate probes' time, else the first whose probe fits; None where none fits."""
        order = sorted(range(len(waiting)), key=lambda i: self._turn(waiting[i][0]))
        fitting = [i for i in order if waiting[i][1] <= left_s]
        if not fitting:
            return None
        share_s = (left_s + sum(state.spent_s for state, _ in waiting)) / len(waiting)
        within = [i for i in fitting if waiting[i][0].spent_s + waiting[i][1] <= share_s]
        return (within or fitting)[0]

    @staticmethod
    def _turn(state: SearchState) -> tuple[bool, float, float]:
        """Lowest first: a knee with no lower end before any other, then the strategy that has
        spent least on rate probes, then the widest interval."""
        knee = state.knee
        return (knee.low is not None, state.spent_s, -knee.width)

    def decisive_rate(
        self,
        probe: Callable[[float], ProbeQuantile],
        knee: float,
        above: bool,
        tried: dict[float, ProbeQuantile],
    ) -> float:
        """Where a first real probe decides, from a predicted `knee` and its simulated probes
        (`probe`, those `tried`): the nearest rate below it (or `above`) whose simulated probe
        sustains its load at the search's confidence (misses it), one tried already or one
        stepped to by `STEP_OUT`, else the farthest stepped to. A probe at the knee itself,
        where an accurate prediction puts it, rarely decides either way and bounds nothing."""
        step = STEP_OUT if above else 1 / STEP_OUT

        def decides(q: ProbeQuantile) -> bool:
            return q.low > 1 if above else q.high <= 1

        side = [r for r, q in tried.items() if (r - knee) * (step - 1) > 0 and decides(q)]
        if side:
            return min(side, key=lambda r: abs(math.log(r / knee)))
        rate = knee
        for _ in range(STEPS_OUT):
            rate *= step
            if decides(probe(rate)):
                break
        return float(f"{rate:.4g}")


def next_rate(knee: Knee, step: float = NEXT_STEP) -> float | None:
    """Where one more probe narrows the knee's interval most: below every probe (by `step`)
    while every rate's fitted ratio is above 1, above every probe while none is; where the
    interval has no low end though a rate's ratio is at most 1 (its bounds straddle 1: the
    few largest ratios of a short probe place its upper bound), that rate again, on new
    requests that pool with its first (one a step below would bound a lower end), and a
    little below it (by the square root of `step`) once two probes there have not; likewise
    the lowest rate above 1 where it has no high end; in a cliff's bracket, its middle (in log
    rate); else the middle (in log rate) of the interval's wider side of the estimate: a
    probe there, with its quantile's bounds on that side of 1, moves that end towards the
    estimate (one at the estimate tightens the bounds beside it, but an end is placed by the
    bound that crosses 1 between two probes). None with no probe."""
    rates = [q.rate for q in knee.probes if q.rate is not None]
    if not rates:
        return None
    if knee.below is None:
        return min(rates) / step
    if knee.above is None:
        return max(rates) * step
    if knee.low is None:
        return again_then_out(knee, knee.below, 1 / math.sqrt(step))
    if knee.high is None:
        return again_then_out(knee, knee.above, math.sqrt(step))
    if knee.estimate is None:
        return math.sqrt(knee.below * knee.above)
    far = knee.low if knee.estimate / knee.low >= knee.high / knee.estimate else knee.high
    return math.sqrt(knee.estimate * far)


def again_then_out(knee: Knee, rate: float, out: float) -> float:
    """Where a probe can bound a knee's missing end from `rate`, the probed rate nearest it
    whose bounds straddle 1: that rate again (new requests pooled with its first), then
    `out` times it once two probes there have not."""
    return rate if sum(q.probes for q in knee.probes if q.rate == rate) < 2 else rate * out
