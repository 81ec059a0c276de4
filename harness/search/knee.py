"""Every strategy's knee: the highest Poisson rate at which the `target`-quantile of its
requests' SLO ratios stays at most 1 (`ratio_knee`), probed where its interval narrows most,
within one time budget shared by every strategy.

A strategy's search runs two anchors, then rate probes:

1. The floor probe serves requests one at a time: if even then the ratio quantile is
   certainly above 1, no rate is sustained.
2. The ceiling probe sends `ceiling_requests` at once: its throughput is the most the strategy
   serves, so it bounds every knee from above.
3. Rate probes start where a prediction says they decide (the simulator's, made once the
   anchors have run: `predict`): the highest rate its probes sustain at the search's
   confidence and the lowest they miss at it, so the first two bound the knee if the
   simulation is right; else at half the ceiling.
   After each, the knee is fitted on every rate probe and the next one goes where
   `ratio_knee.next_rate` says one more probe narrows the interval most (kept below the
   ceiling). Once probes bracket the crossing, a probe is as
   long as the interval needs: a quantile's interval narrows as the square root of its
   requests, so a probe near an earlier one is longer by (the interval's log width over the
   resolution's) squared, at most twice, up to `max_requests`; a probe where one ran before
   draws new requests (the next workload seed).
   The search ends when the interval's high / low is within `1 + resolution`.

A rate probe over saturation ends as soon as it can only miss (`slo.stop_early`): its
unserved requests are censored, known only to be above what they had waited.

The budget (`find_knees`): every strategy's anchors run first; then each rate probe goes to a
strategy whose knee has no lower end before any other (a ratio over it is unbounded), among
equals to the one that has spent least on rate probes, and none past an equal share of the
rate probes' time while another's probe fits in its own. The share binds a knee with no lower
end too: a strategy whose quantile stays uncertain at every rate it can afford (static
batching's rare long waits) would otherwise spend the whole budget on minutes-long probes at
its low rates and leave every other knee one probe wide. A probe that does not fit what is
left is not run, and the knee says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from servelab.harness.search.ratio_knee import (
    ProbeQuantile,
    ProbeRatios,
    RatioKnee,
    fit_ratio_knee,
    interval_width,
    next_rate,
    probe_quantile,
)

LOWEST_SHARE = 1 / 64  # the lowest rate probed, as a share of the ceiling
MOST_RATE_PROBES = 12  # a search not within the resolution by then ends unresolved

Kind = Literal["floor", "ceiling", "rate"]


@dataclass(frozen=True)
class ProbeSpec:
    """One probe as the search asks for it: how the requests arrive, how many, which draw."""

    kind: Kind  # floor: one at a time; ceiling: all at once; rate: Poisson at `rate`
    requests: int
    rate: float | None = None  # req/s, rate probes only
    repeat: int = 0  # > 0: the workload drawn again with the seed moved by this (new requests)

    @property
    def name(self) -> str:
        """Its run directory's name under the strategy's."""
        if self.kind != "rate":
            return self.kind
        return f"rate-{self.rate:.4g}-n{self.requests}" + (
            f"-repeat{self.repeat}" if self.repeat else ""
        )


@dataclass(frozen=True)
class Outcome:
    """What one probe's run measured: every request's SLO ratio, and what it cost."""

    run_dir: str
    ratios: ProbeRatios  # its rate is the probe's (None for the floor and ceiling)
    request_throughput: float | None
    seconds: float  # what the probe took on the search's clock
    served_s: float  # the run's own duration (first arrival to last response)
    stopped: bool = False  # ended early, over saturation: its unserved requests are censored
    idle_skipped_s: float = 0.0  # of the run's clock, skipped with nothing in flight


@dataclass(frozen=True)
class Probe:
    spec: ProbeSpec
    outcome: Outcome
    quantile: ProbeQuantile  # its requests' ratio quantile and interval


@dataclass
class Knee:
    """One strategy's sustained rate: the fitted knee and its interval."""

    strategy: str
    ceiling: float | None = None  # request throughput with every request at once
    predicted: float | None = None  # the simulator's knee, where the search had one
    found: RatioKnee | None = None  # fitted on every rate probe
    resolved: bool = False  # the interval came within the resolution
    note: str = ""
    probes: list[Probe] = field(default_factory=list)

    @property
    def estimate(self) -> float | None:
        return None if self.found is None else self.found.estimate

    @property
    def low(self) -> float | None:
        """The interval's low end: None where no probe bounds it (or none is sustained)."""
        return None if self.found is None else self.found.low

    @property
    def high(self) -> float | None:
        """The interval's high end: the ceiling where no rate probe bounds it."""
        return self.ceiling if self.found is None else self.found.high

    @property
    def width(self) -> float:
        return interval_width(self)

    @property
    def widened_by(self) -> float:
        """The speed drift's factor the interval was widened by (1 where none was fitted)."""
        return 1.0 if self.found is None else self.found.widened_by

    @property
    def rate_probes(self) -> list[Probe]:
        return [p for p in self.probes if p.spec.kind == "rate"]

    def to_json(self) -> dict:
        """The knee as `search.json` records it (`knee_of_record` reads it back)."""
        found = self.found
        return {
            "strategy": self.strategy,
            "ceiling": self.ceiling,
            "predicted": self.predicted,
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "cliff": bool(found and found.cliff),
            "below": None if found is None else found.below,
            "above": None if found is None else found.above,
            "widened_by": self.widened_by,
            "resolved": self.resolved,
            "note": self.note,
            "probes": [
                {
                    "kind": p.spec.kind,
                    "rate": p.spec.rate,
                    "requests": p.spec.requests,
                    "repeat": p.spec.repeat,
                    "run_dir": p.outcome.run_dir,
                    "quantile": _finite(p.quantile.quantile),
                    "quantile_low": p.quantile.low,
                    "quantile_high": _finite(p.quantile.high),
                    "over_capacity": p.quantile.over_capacity,
                    "met": p.outcome.ratios.met,
                    "counted": len(p.outcome.ratios.ratios),
                    "stopped": p.outcome.stopped,
                    "seconds": p.outcome.seconds,
                }
                for p in self.probes
            ],
        }


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


def knee_of_record(record: dict) -> Knee:
    """A knee as `search.json` records it, without its probes: to read a search again."""
    fields = ("estimate", "low", "high", "cliff", "below", "above")
    return Knee(
        strategy=record["strategy"],
        ceiling=record.get("ceiling"),
        predicted=record.get("predicted"),
        found=RatioKnee(
            **{key: record.get(key) for key in fields},
            probes=(),
            widened_by=record.get("widened_by") or 1.0,
        ),
        resolved=bool(record.get("resolved")),
        note=record.get("note", ""),
    )


@dataclass(frozen=True)
class KneeSettings:
    target: float  # slo.attainment: the quantile of the ratios that must be at most 1
    resolution: float  # done when the interval's high / low <= 1 + resolution
    requests: int  # a rate probe's first length
    max_requests: int  # a probe near an earlier one is lengthened up to this
    floor_requests: int
    ceiling_requests: int
    confidence: float  # of each probe's quantile interval and of the knee's
    skip_idle: bool = False  # probes skip their idle spans (`replay.skip_idle`): see `_cost`


class Prober(Protocol):
    """Runs one strategy's probes, a run each (`harness.search.probes.RunProber`)."""

    def run(self, spec: ProbeSpec) -> Outcome: ...


ProbeSeen = Callable[[str, Probe], None]  # (strategy, probe) as each probe ends


@dataclass(frozen=True)
class Prediction:
    """A strategy's knee as predicted, and the rates the first probes go to."""

    knee: float  # where the predicted ratio quantile crosses 1
    below: float  # a rate predicted sustained at the search's confidence (or the nearest tried)
    above: float  # a rate predicted missed at it (or the nearest tried)


Predict = Callable[[str], Prediction | None]  # a strategy's prediction, once its anchors ran


@dataclass(frozen=True)
class Wanted:
    """The rate probe a search wants next, and what it is expected to cost."""

    spec: ProbeSpec
    cost_s: float


class KneeSearch:
    """One strategy's search, a probe at a time: the anchors, then the rate probes it wants
    (`next`), each run by `probe_rate` when the shared budget gives it its turn."""

    def __init__(
        self,
        strategy: str,
        prober: Prober,
        settings: KneeSettings,
        seen: ProbeSeen,
        predict: Predict | None = None,
    ) -> None:
        self.knee = Knee(strategy)
        self.prober, self.settings, self.seen, self.predict = prober, settings, seen, predict
        self.done = False
        self.overhead_s = 0.0  # beyond a probe's requests over its rate: loading, drain
        self.alone_s = 0.0  # one request served alone (the floor probe's duration per request)
        self.spent_s = 0.0  # this strategy's rate probes so far, on the search's clock
        self.queued: list[float] = []  # the first rates, before any fit steers
        self.next = Wanted(ProbeSpec("rate", settings.requests, 0.0), 0.0)

    def anchor(self) -> None:
        """The floor and ceiling probes: whether any rate is sustained, and the range."""
        settings, knee = self.settings, self.knee
        floor = self._run(ProbeSpec("floor", settings.floor_requests))
        if floor.quantile.low > 1:
            self._finish("one request at a time already misses the SLO: no rate is sustained")
            return
        top = self._run(ProbeSpec("ceiling", settings.ceiling_requests)).outcome
        if not top.request_throughput:
            self._finish("the ceiling probe served nothing")
            return
        knee.ceiling = top.request_throughput
        self.alone_s = floor.outcome.served_s / settings.floor_requests
        self.overhead_s = max(top.seconds - top.served_s, 0.0) + self.alone_s
        prediction = None if self.predict is None else self.predict(knee.strategy)
        start = []
        if prediction is not None:
            knee.predicted = prediction.knee
            start = [prediction.below, prediction.above]
        self.queued = [rate for rate in start if rate < knee.ceiling] or [knee.ceiling / 2]
        self._plan(self.queued.pop(0), settings.requests)

    @property
    def unbounded(self) -> bool:
        """Whether the knee has no lower end yet (a ratio over it is unbounded below)."""
        return self.knee.low is None

    @property
    def turn(self) -> tuple[bool, float, float]:
        """Which search probes next, lowest first: one with no lower end before any other,
        then the one that has spent least on rate probes, then the widest interval."""
        return (not self.unbounded, self.spent_s, -self.knee.width)

    def probe_rate(self) -> None:
        """Run the wanted probe, fit the knee again, and plan the next one (or finish)."""
        settings, knee = self.settings, self.knee
        added = self._run(self.next.spec)
        self.spent_s += added.outcome.seconds
        if added.quantile.low > 1 or added.quantile.over_capacity:  # no need to go higher
            self.queued = [rate for rate in self.queued if rate < (added.spec.rate or 0.0)]
        knee.found = fit_ratio_knee(
            [p.outcome.ratios for p in knee.rate_probes],
            settings.target,
            settings.confidence,
            ceiling=knee.ceiling,
        )
        if self.queued:
            self._plan(self.queued.pop(0), settings.requests)
        else:
            self._steer()

    def out_of_budget(self) -> None:
        self.knee.note = (
            f"budget spent before the probe at {self.next.spec.rate:.3g} req/s "
            f"(about {self.next.cost_s:.0f} s)"
        )

    def _steer(self) -> None:
        """The next rate from the fit (`next_rate`), or the end of the search."""
        knee, found = self.knee, self.knee.found
        assert found is not None and knee.ceiling is not None  # a rate probe ran
        rates = [p.spec.rate for p in knee.rate_probes if p.spec.rate is not None]
        rate = next_rate(found)
        assert rate is not None
        if knee.width <= 1 + self.settings.resolution:
            self._finish("a cliff: the ratio jumps between adjacent probes" if found.cliff else "")
        elif len(rates) >= MOST_RATE_PROBES:
            self._finish(f"not within {self.settings.resolution:.0%} after {len(rates)} probes")
        elif rate < min(rates) and min(rates) <= knee.ceiling * LOWEST_SHARE:
            self._finish(f"no rate down to {min(rates):.3g} req/s is sustained")
        elif rate > max(rates) and max(rates) * (1 + self.settings.resolution) >= knee.ceiling:
            self._finish(f"sustained up to {max(rates):.3g} req/s, near the ceiling")
        else:
            bracketed = found.below is not None and found.above is not None
            length = self._length_near if bracketed else self.settings.requests
            self._plan(min(rate, math.sqrt(max(rates) * knee.ceiling)), length)

    def _length_near(self, rate: float) -> int:
        """The requests a probe at `rate` needs: the nearest probe's (in log rate) times (the
        knee's log width over the resolution's) squared, at most twice it, within
        [requests, max_requests]."""
        settings, knee = self.settings, self.knee
        nearest = min(knee.rate_probes, key=lambda p: abs(math.log((p.spec.rate or 1.0) / rate)))
        needed = (math.log(knee.width) / math.log(1 + settings.resolution)) ** 2
        count = round(nearest.spec.requests * min(needed, 2.0))
        return min(max(count, settings.requests), settings.max_requests)

    def _plan(self, rate: float, requests: int | Callable[[float], int]) -> None:
        """Make the next wanted probe: at `rate` (to 4 digits, as the run is named), on new
        requests where that probe ran before."""
        rate = float(f"{rate:.4g}")
        count = requests(rate) if callable(requests) else requests
        repeat = sum(p.spec.rate == rate and p.spec.requests == count for p in self.knee.probes)
        self.next = Wanted(ProbeSpec("rate", count, rate, repeat), self._cost(rate, count))

    def _cost(self, rate: float, requests: int) -> float:
        """A probe's time: its requests' span at its rate, plus loading and drain. A probe
        that skips its idle spans takes about its busy time instead: each request alone where
        they rarely overlap, the span where they do."""
        each_s = 1 / rate
        if self.settings.skip_idle:
            each_s = min(each_s, self.alone_s)
        return requests * each_s + self.overhead_s

    def _run(self, spec: ProbeSpec) -> Probe:
        outcome = self.prober.run(spec)
        settings = self.settings
        quantile = probe_quantile(outcome.ratios, settings.target, settings.confidence)
        probe = Probe(spec, outcome, quantile)
        self.knee.probes.append(probe)
        self.seen(self.knee.strategy, probe)
        return probe

    def _finish(self, note: str) -> None:
        """Stop this strategy's search; resolved when its interval is within the resolution."""
        self.done = True
        self.knee.resolved = self.knee.width <= 1 + self.settings.resolution
        self.knee.note = note


def widened_for_drift(knees: list[Knee], factor: float, resolution: float) -> None:
    """Each fitted knee's interval moved out by the machine's speed drift (`factor` >= 1) on
    each bounded side; resolved only if still within the resolution once widened."""
    for knee in knees:
        knee.found = None if knee.found is None else knee.found.widened(factor)
        knee.resolved = knee.resolved and knee.width <= 1 + resolution


def find_knees(
    probers: Mapping[str, Prober],
    settings: KneeSettings,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    seen: ProbeSeen = lambda strategy, probe: None,
    predict: Predict | None = None,
) -> list[Knee]:
    """Each strategy's knee, in `probers`' order, within `budget_s` shared among them; `seen`
    hears of every probe as it ends; `predict` places each one's first rate probes. The
    anchors (and the predictions after them) always run; the budget governs rate probes."""
    deadline = clock() + budget_s
    searches = [
        KneeSearch(name, prober, settings, seen, predict) for name, prober in probers.items()
    ]
    for search in searches:
        search.anchor()
    while waiting := sorted((s for s in searches if not s.done), key=lambda s: s.turn):
        left_s = deadline - clock()
        fitting = [s for s in waiting if s.next.cost_s <= left_s]
        if not fitting:
            for search in waiting:
                search.out_of_budget()
            break
        share_s = (left_s + sum(s.spent_s for s in waiting)) / len(waiting)
        within = [s for s in fitting if s.spent_s + s.next.cost_s <= share_s]
        (within or fitting)[0].probe_rate()
    return [s.knee for s in searches]
