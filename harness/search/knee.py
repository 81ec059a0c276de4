"""Every strategy's knee: anchored on two probes of this machine, refined by bisection, the
time budget going where the knee is least known.

1. The floor probe serves requests one at a time (a closed loop of one user): if even then
   the SLO is clearly missed, no rate is sustained and the search says so.
2. The ceiling probe sends `ceiling_requests` at once: the strategy's request throughput
   there is the most it can serve, so no rate above it is sustained; it bounds the search.
3. Rate probes (Poisson arrivals) start at half the ceiling and halve until one clearly
   passes (down to `LOWEST_SHARE` of the ceiling): one that only likely passes steers, but
   the reported bracket's lower end must be a clear pass, and where the attainment curve is
   shallow that lies well below the first likely one. Then they bisect (geometrically)
   between the highest rate that passed (or likely passed) and the lowest that failed (or
   the ceiling) until the two are within `resolution` of each other,
   or until the knee fitted on every rate probe's requests (`attainment_curve`) is known
   within `resolution`. Once there is such a fit, the next rate is its knee, kept inside the
   middle half of the bracket (in log rate) so the bracket still narrows by a quarter or more.
   Where the steering bounds meet but neither the clear verdicts nor the fit are within
   `resolution` (probes at the knee straddle the target: no single one decides), the search
   goes on at the fitted knee on new requests: each further probe draws the workload with
   the next seed (the same rate, requests and seed would be the same run, which a rerun
   reuses), `max_requests` of them, until the fit is within `resolution` or the budget ends.
   Without a bounded fit it ends unresolved and says what it knows.

A probe whose attainment interval straddles the target (`Verdict.KNEE`) is run again with
twice the requests, up to `max_requests`; if it still straddles, it is evidence of where the
knee lies and steers the bisection by its point estimate, but the reported bracket stays
[highest rate that clearly passed, lowest that clearly failed]. A rate probe over saturation
ends as soon as its verdict can only be a failure (`slo.stop_early`, `harness.runner.early_stop`):
its attainment is then the best case still possible, and it fails.

The strategies share one budget (`find_knees`): every strategy's anchors run first, then
each rate probe goes to a strategy with no rate clearly passed yet before any other, and
among equals to the one that has spent least on rate probes (then the widest bracket). So a
budget that runs out leaves every knee as narrow as it allowed, rather than one resolved and
the last unprobed. Every rate probe is costed before it runs (its requests over its rate,
plus the loading and drain the anchor probes took; where probes skip their idle spans, each
request at most what it takes alone). One that would take its strategy's rate probes past an
equal share (what is left and what the strategies still searching have spent, over their
number) waits while another strategy has a probe within its share, so a strategy whose knee
lies far below its ceiling (each halving costs twice the last) cannot starve the rest of
their first pass. Once every other strategy has a rate clearly passed, the one without
(still halving for one) goes first whatever its share: a knee with no lower end (a ratio
with no bound on one side) is less known than any bracketed one, and refining those waits.
One that would not fit the remaining budget is not run, and the result says which knees are
unresolved.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from servelab.harness.measure.verdict import Attainment, Verdict, verdict
from servelab.harness.search.attainment_curve import KneeFit, RateEvidence, fit_knee

LOWEST_SHARE = 1 / 64  # the lowest rate probed, as a share of the ceiling


@dataclass(frozen=True)
class Outcome:
    """What one probe's run measured."""

    run_dir: str
    attainment: Attainment
    request_throughput: float | None
    seconds: float  # wall time of the probe, model load included
    served_s: float  # the run's own duration (first arrival to last response)
    stopped: bool = False  # ended early, over saturation: `attainment` is its best case
    idle_skipped_s: float = 0.0  # of the run's clock, skipped with nothing in flight


@dataclass(frozen=True)
class Probe:
    kind: str  # floor | ceiling | rate
    rate: float | None  # req/s (rate probes)
    requests: int
    verdict: Verdict
    outcome: Outcome


@dataclass
class Knee:
    """One strategy's sustained rate: the knee lies in [passed, failed]."""

    strategy: str
    ceiling: float | None = None  # request throughput with every request at once
    passed: float | None = None  # highest rate whose attainment clearly met the target
    failed: float | None = None  # lowest rate that clearly missed it (None: none did)
    resolved: bool = False  # the steering bounds, or the fitted knee, came within the resolution
    note: str = ""
    fit: KneeFit | None = None  # the knee fitted on every rate probe
    probes: list[Probe] = field(default_factory=list)

    @property
    def upper(self) -> float | None:
        """The bracket's upper end: the lowest clear failure, else the ceiling (no rate above
        the most it serves with every request at once is sustained)."""
        return self.failed if self.failed is not None else self.ceiling

    @property
    def estimate(self) -> float | None:
        """The knee's point estimate: the geometric middle of [passed, upper]."""
        if self.passed is None or self.upper is None:
            return self.passed
        return (self.passed * self.upper) ** 0.5


def ratio_interval(a: Knee, b: Knee) -> tuple[float | None, float | None]:
    """a's sustained rate over b's: (lowest, highest) consistent with both brackets."""
    low = a.passed / b.upper if a.passed and b.upper else None
    high = a.upper / b.passed if a.upper and b.passed else None
    return low, high


def fitted_ratio(a: Knee, b: Knee) -> tuple[float | None, float | None]:
    """a's fitted knee over b's: (lowest, highest) consistent with both fitted intervals."""
    if a.fit is None or b.fit is None:
        return None, None
    low = a.fit.low / b.fit.high if a.fit.low and b.fit.high else None
    high = a.fit.high / b.fit.low if a.fit.high and b.fit.low else None
    return low, high


def knee_of_record(record: dict) -> Knee:
    """A knee as `search.json` records it, without its probes: to read a search again."""
    fit = record.get("fit")
    return Knee(
        strategy=record["strategy"],
        ceiling=record.get("ceiling"),
        passed=record.get("passed"),
        failed=record.get("failed"),
        resolved=bool(record.get("resolved")),
        note=record.get("note", ""),
        fit=None if fit is None else KneeFit(**fit),
    )


@dataclass(frozen=True)
class KneeSettings:
    target: float  # slo.attainment
    resolution: float  # stop when failed / passed <= 1 + resolution
    requests: int  # per rate probe
    max_requests: int  # a knee probe is lengthened up to this
    floor_requests: int
    ceiling_requests: int
    confidence: float  # of each probe's attainment interval and of the fitted knee's
    skip_idle: bool = False  # probes skip their idle spans (`replay.skip_idle`): see `_cost`


class Prober(Protocol):
    """Runs the probes of one strategy (a run each; `harness.commands.search` supplies it)."""

    def floor(self, requests: int) -> Outcome:
        """`requests` served one at a time (a closed loop of one user)."""

    def ceiling(self, requests: int) -> Outcome:
        """`requests` sent all at once."""

    def at(self, rate: float, requests: int, repeat: int = 0) -> Outcome:
        """`requests` arriving as a Poisson process of `rate` req/s; `repeat` > 0: the
        workload drawn again with another seed (new requests, not a rerun)."""


ProbeSeen = Callable[[str, Probe], None]  # (strategy, probe) as each probe ends


@dataclass(frozen=True)
class RateProbe:
    """The rate probe a search wants next, and what it is expected to cost."""

    rate: float
    requests: int
    cost_s: float
    repeat: int = 0  # > 0: a probe at the knee on new requests (another workload seed)


class KneeSearch:
    """One strategy's search, a probe at a time: the anchors, then the rate probes it wants
    (`wanted`), each run by `probe_rate` when the shared budget gives it its turn."""

    def __init__(self, strategy: str, prober: Prober, settings: KneeSettings, seen: ProbeSeen):
        self.knee = Knee(strategy)
        self.prober, self.settings, self.seen = prober, settings, seen
        self.done = False
        self.overhead_s = 0.0  # beyond a probe's requests over its rate: loading, drain
        self.alone_s = 0.0  # one request served alone (the floor probe's duration per request)
        self.low: float | None = None  # steering bounds: likely passed ...
        self.high = 0.0  # ... and likely failed (or the ceiling)
        self.rate = 0.0  # the next rate to probe
        self.requests = settings.requests  # ... with this many requests
        self.likely = False  # the last probe's point estimate met the target
        self.spent_s = 0.0  # wall time of this strategy's rate probes so far
        self.repeats = 0  # probes at the fitted knee on new requests, once the bounds met

    def anchor(self) -> None:
        """The floor and ceiling probes: whether any rate is sustained, and the range."""
        settings, knee = self.settings, self.knee
        floor = self.prober.floor(settings.floor_requests)
        if self._add("floor", None, settings.floor_requests, floor) is Verdict.FAIL:
            self._finish("one request at a time already misses the SLO: no rate is sustained")
            return
        top = self.prober.ceiling(settings.ceiling_requests)
        self._add("ceiling", None, settings.ceiling_requests, top)
        if not top.request_throughput:
            self.done = True
            knee.note = "the ceiling probe served nothing"
            return
        knee.ceiling = self.high = top.request_throughput
        self.rate = knee.ceiling / 2
        self.alone_s = floor.served_s / settings.floor_requests
        self.overhead_s = max(top.seconds - top.served_s, 0.0) + self.alone_s

    @property
    def width(self) -> float:
        """How little is known of the knee: the steering bounds' ratio (inf: none passed)."""
        return math.inf if self.low is None else self.high / self.low

    @property
    def unbounded(self) -> bool:
        """Whether the knee has no lower end yet: no rate clearly passed, and the search is
        still halving for one (a likely pass steers, but bounds no ratio)."""
        return self.knee.passed is None and not self._lowest_probed()

    @property
    def turn(self) -> tuple[bool, float, float]:
        """Which search probes next, lowest first: one with no lower end yet before any
        other, then the one that has spent least on rate probes, then the widest bracket."""
        return (not self.unbounded, self.spent_s, -self.width)

    def wanted(self, remaining_s: float) -> RateProbe:
        """The next rate probe; a knee probe whose lengthening would not fit `remaining_s`
        is final as it is, and the bisection goes on from its estimate."""
        if self.requests > self.settings.requests and self._cost(self.requests) > remaining_s:
            self.requests = self.settings.requests
            self._steer()
        return RateProbe(self.rate, self.requests, self._cost(self.requests), self.repeats)

    def probe_rate(self, probe: RateProbe) -> None:
        settings, knee = self.settings, self.knee
        outcome = self.prober.at(probe.rate, probe.requests, probe.repeat)
        self.spent_s += outcome.seconds
        decided = self._add("rate", probe.rate, probe.requests, outcome)
        knee.fit = fit_knee(self._evidence(), settings.target, settings.confidence)
        if decided is Verdict.PASS:
            knee.passed = max(knee.passed or 0.0, probe.rate)
        elif decided is Verdict.FAIL:
            knee.failed = min(knee.failed or probe.rate, probe.rate)
        # a knee probe steers by its point estimate
        self.likely = outcome.attainment.share >= settings.target
        if self.repeats:  # at the knee on new requests: each probe is evidence for the fit
            self._refine()
            return
        if decided is Verdict.KNEE and probe.requests * 2 <= settings.max_requests:
            self.requests = probe.requests * 2  # lengthened first, if the budget allows
            return
        self.requests = settings.requests
        self._steer()

    def out_of_budget(self, probe: RateProbe) -> None:
        self.knee.note = (
            f"budget spent before the probe at {probe.rate:.3g} req/s (about {probe.cost_s:.0f} s)"
        )

    def _steer(self) -> None:
        """Move the steering bounds by the last probe and choose the next rate: halve until
        a rate clearly passes (a likely pass steers, but the reported bracket needs a clear
        one), then bisect from the highest likely pass."""
        knee = self.knee
        below = self.low is not None and self.rate < self.low  # halving under a likely pass
        if self.likely:
            self.low = max(self.low or 0.0, self.rate)
        elif not below:
            self.high = self.rate
        if self.unbounded:
            self.rate /= 2
            return
        if self.low is None:
            self._finish(f"no rate down to {self.rate:.3g} req/s is sustained")
            return
        resolution = 1 + self.settings.resolution
        if knee.fit is not None and knee.fit.width <= resolution:
            self._finish("")
            return
        if self.high / self.low <= resolution:
            if knee.passed is None:
                self._finish(
                    f"the probes near {self.low:.3g}-{self.high:.3g} req/s straddle the target"
                    " and no rate clearly passed: the knee is below the lowest failure"
                    " (longer probes: search.max_requests)",
                    resolved=False,
                )
            elif knee.failed is None:
                self._finish("no rate below the ceiling clearly failed: the knee is near it")
            elif knee.failed / knee.passed <= resolution:
                self._finish("")
            elif knee.fit is not None and knee.fit.width < math.inf:
                self._refine()
            else:
                self._finish(
                    f"the probes near {self.low:.3g}-{self.high:.3g} req/s straddle the target:"
                    f" the knee is known within [{knee.passed:.3g}, {knee.failed:.3g})"
                    " (longer probes: search.max_requests)",
                    resolved=False,
                )
            return
        self.rate = self._next_rate()

    def _lowest_probed(self) -> bool:
        """Whether a rate probe went as low as the search goes (`LOWEST_SHARE` of the ceiling)."""
        lowest = (self.knee.ceiling or 0.0) * LOWEST_SHARE
        return any(p.rate <= lowest for p in self.knee.probes if p.rate is not None)

    def _refine(self) -> None:
        """The next probe at the fitted knee, on requests no probe has served (the next
        workload seed), `max_requests` of them; done once the fit is within the resolution."""
        fit = self.knee.fit
        if fit is not None and fit.width <= 1 + self.settings.resolution:
            self._finish("")
            return
        if fit is not None:
            self.rate = fit.estimate
        self.requests = self.settings.max_requests
        self.repeats += 1

    def _next_rate(self) -> float:
        """The fitted knee, kept within the middle half of the bracket in log rate; the
        bracket's geometric middle while there is no fit."""
        low, high = self.low or 0.0, self.high
        middle = (low * high) ** 0.5
        fit = self.knee.fit
        if fit is None:
            return middle
        quarter = (high / low) ** 0.25
        return min(max(fit.estimate, low * quarter), high / quarter)

    def _evidence(self) -> list[RateEvidence]:
        """Every rate probe's requests (a stopped one's met is the most that could have)."""
        return [
            RateEvidence(
                p.rate, p.outcome.attainment.met, p.outcome.attainment.counted, p.outcome.stopped
            )
            for p in self.knee.probes
            if p.kind == "rate" and p.rate is not None
        ]

    def _cost(self, requests: int) -> float:
        """A probe's wall time: its requests' span at its rate, plus loading and drain. A
        probe that skips its idle spans takes about its busy time instead: each request
        alone where they rarely overlap, the span where they do."""
        each_s = 1 / self.rate
        if self.settings.skip_idle:
            each_s = min(each_s, self.alone_s)
        return requests * each_s + self.overhead_s

    def _add(self, kind: str, rate: float | None, requests: int, outcome: Outcome) -> Verdict:
        decided = verdict(outcome.attainment, self.settings.target)
        probe = Probe(kind, rate, requests, decided, outcome)
        self.knee.probes.append(probe)
        self.seen(self.knee.strategy, probe)
        return probe.verdict

    def _finish(self, note: str, resolved: bool = True) -> None:
        """Stop this strategy's search; `resolved` unless what it reports is wider than the
        resolution (steering bounds that met with no rate clearly passed)."""
        self.done = True
        self.knee.resolved = resolved
        self.knee.note = note


def find_knees(
    probers: Mapping[str, Prober],
    settings: KneeSettings,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    seen: ProbeSeen = lambda strategy, probe: None,
) -> list[Knee]:
    """Each strategy's knee, in `probers`' order, within `budget_s` shared among them; `seen`
    hears of every probe as it ends. The anchors always run; the budget governs rate probes."""
    deadline = clock() + budget_s
    searches = [KneeSearch(name, prober, settings, seen) for name, prober in probers.items()]
    for search in searches:
        search.anchor()
    while True:
        waiting = sorted((s for s in searches if not s.done), key=lambda s: s.turn)
        left_s = deadline - clock()
        wants = [(s, s.wanted(left_s)) for s in waiting]
        wants = [(s, want) for s, want in wants if not s.done]  # wanting can end a search
        if not wants:
            return [s.knee for s in searches]
        waiting = [s for s, _ in wants]
        fitting = [(s, want) for s, want in wants if want.cost_s <= left_s]
        if not fitting:
            for search, want in wants:
                search.out_of_budget(want)
            return [s.knee for s in searches]
        search, want = fitting[0]
        if not _unbounded_alone(search, waiting):
            share_s = (left_s + sum(s.spent_s for s in waiting)) / len(waiting)
            within_share = [(s, w) for s, w in fitting if s.spent_s + w.cost_s <= share_s]
            search, want = (within_share or fitting)[0]
        search.probe_rate(want)


def _unbounded_alone(search: KneeSearch, waiting: list[KneeSearch]) -> bool:
    """Whether `search` alone has no lower end: a probe that could give it one is worth more
    than narrowing any bracket, whatever its share."""
    return search.unbounded and not any(s.unbounded for s in waiting if s is not search)
