"""One strategy's knee: anchored on two probes of this machine, refined by bisection.

1. The floor probe serves requests one at a time (a closed loop of one user): if even then
   the SLO is clearly missed, no rate is sustained and the search says so.
2. The ceiling probe sends `ceiling_requests` at once: the strategy's request throughput
   there is the most it can serve, so no rate above it is sustained; it bounds the search.
3. Rate probes (Poisson arrivals) start at half the ceiling and halve until one passes, then
   bisect (geometrically) between the highest rate that passed (or likely passed) and the
   lowest that failed (or the ceiling) until the two are within `resolution` of each other.

A probe whose attainment interval straddles the target (`Verdict.KNEE`) is run again with
twice the requests, up to `max_requests`; if it still straddles, it is evidence of where the
knee lies and steers the bisection by its point estimate, but the reported bracket stays
[highest rate that clearly passed, lowest that clearly failed]. A rate probe over saturation
ends as soon as its verdict can only be a failure (`slo.stop_early`, `harness.runner.early_stop`):
its attainment is then the best case still possible, and it fails. Every probe is costed before
it runs (its requests over its rate, plus the loading and drain the anchor probes took); one
that would not fit the remaining budget is not run, and the result says the knee is
unresolved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from harness.measure.verdict import Attainment, Verdict, verdict

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
    resolved: bool = False  # the steering bounds came within the resolution
    note: str = ""
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


@dataclass(frozen=True)
class KneeSettings:
    target: float  # slo.attainment
    resolution: float  # stop when failed / passed <= 1 + resolution
    requests: int  # per rate probe
    max_requests: int  # a knee probe is lengthened up to this
    floor_requests: int
    ceiling_requests: int


class Prober(Protocol):
    """Runs the probes of one strategy (a run each; `harness.commands.search` supplies it)."""

    def floor(self, requests: int) -> Outcome:
        """`requests` served one at a time (a closed loop of one user)."""

    def ceiling(self, requests: int) -> Outcome:
        """`requests` sent all at once."""

    def at(self, rate: float, requests: int) -> Outcome:
        """`requests` arriving as a Poisson process of `rate` req/s."""


ProbeSeen = Callable[[str, Probe], None]  # (strategy, probe) as each probe ends


def find_knee(
    strategy: str,
    prober: Prober,
    settings: KneeSettings,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    seen: ProbeSeen = lambda strategy, probe: None,
) -> Knee:
    """`strategy`'s knee within `budget_s`; `seen` hears of every probe as it ends."""
    knee = Knee(strategy)

    def add(probe: Probe) -> Probe:
        knee.probes.append(probe)
        seen(strategy, probe)
        return probe

    deadline = clock() + budget_s
    floor = prober.floor(settings.floor_requests)
    floor_verdict = _verdict(floor, settings)
    add(Probe("floor", None, settings.floor_requests, floor_verdict, floor))
    if floor_verdict is Verdict.FAIL:
        knee.resolved = True
        knee.note = "one request at a time already misses the SLO: no rate is sustained"
        return knee
    top = prober.ceiling(settings.ceiling_requests)
    top_verdict = _verdict(top, settings)
    add(Probe("ceiling", None, settings.ceiling_requests, top_verdict, top))
    if not top.request_throughput:
        knee.note = "the ceiling probe served nothing"
        return knee
    knee.ceiling = top.request_throughput
    # beyond a probe's requests over its rate: loading, and the last responses' drain
    overhead_s = max(top.seconds - top.served_s, 0.0) + floor.served_s / settings.floor_requests
    low, high = None, knee.ceiling  # no rate above the ceiling is sustained
    rate = knee.ceiling / 2
    while True:
        cost = settings.requests / rate + overhead_s
        if clock() + cost > deadline:
            knee.note = f"budget spent before the probe at {rate:.3g} req/s (about {cost:.0f} s)"
            return knee
        probe = _probe_rate(prober, rate, settings, deadline, clock, overhead_s, add)
        if probe.verdict is Verdict.PASS:
            knee.passed = max(knee.passed or 0.0, rate)
        elif probe.verdict is Verdict.FAIL:
            knee.failed = min(knee.failed or rate, rate)
        # a knee probe steers by its point estimate
        likely = probe.outcome.attainment.share >= settings.target
        if probe.verdict is Verdict.PASS or (probe.verdict is Verdict.KNEE and likely):
            low = rate
        else:
            high = rate
        if low is None:
            if rate <= knee.ceiling * LOWEST_SHARE:
                knee.resolved = True
                knee.note = f"no rate down to {rate:.3g} req/s is sustained"
                return knee
            rate /= 2
            continue
        if high / low <= 1 + settings.resolution:
            knee.resolved = True
            if knee.failed is None and knee.passed is not None:
                knee.note = "no rate below the ceiling clearly failed: the knee is near it"
            return knee
        rate = (low * high) ** 0.5


def _probe_rate(
    prober: Prober,
    rate: float,
    settings: KneeSettings,
    deadline: float,
    clock: Callable[[], float],
    overhead_s: float,
    add: Callable[[Probe], Probe],
) -> Probe:
    """A rate probe, lengthened while it straddles the target and the budget allows; every
    run is evidence (added), the last one decides."""
    requests = settings.requests
    outcome = prober.at(rate, requests)
    probe = add(Probe("rate", rate, requests, _verdict(outcome, settings), outcome))
    while probe.verdict is Verdict.KNEE and requests * 2 <= settings.max_requests:
        longer = requests * 2
        if clock() + longer / rate + overhead_s > deadline:
            break
        requests = longer
        outcome = prober.at(rate, requests)
        probe = add(Probe("rate", rate, requests, _verdict(outcome, settings), outcome))
    return probe


def _verdict(outcome: Outcome, settings: KneeSettings) -> Verdict:
    return verdict(outcome.attainment, settings.target)
