"""Every strategy's knee within one time budget shared by all: each strategy's probes run as
its policy asks (`policy.ProbePolicy`), the knee fitted again after each (`estimator.fit_knee`).

Every strategy's anchors (floor and ceiling) run first, and its prediction after them; the
budget governs the rate probes, which run one at a time, to the strategy the policy picks. A
rate probe over saturation ends as soon as it can only miss (`slo.stop_early`): its unserved
requests are censored, known only to be above what they had waited.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from servelab.harness.search.estimator import fit_knee
from servelab.harness.search.policy import Done, Prediction, ProbePolicy, SearchState
from servelab.harness.search.probe_ratios import probe_quantile
from servelab.harness.search.probes import Probe, Prober, ProberGone, ProbeSpec
from servelab.harness.search.result import StrategyResult

ProbeSeen = Callable[[str, Probe], None]  # (strategy, probe) as each probe ends
Predict = Callable[[str], Prediction | None]  # a strategy's prediction, once its anchors ran


class StrategySearch:
    """One strategy's search, a probe at a time: the anchors, then the rate probe its policy
    wants next (`next`, `cost_s`), run by `probe_rate` when the shared budget gives it its
    turn. Where what serves it is gone (`ProberGone`), its search ends with the probes it ran,
    the line saying why in its note."""

    def __init__(
        self,
        strategy: str,
        prober: Prober,
        policy: ProbePolicy,
        seen: ProbeSeen,
        predict: Predict | None = None,
    ) -> None:
        self.result = StrategyResult(strategy)
        policy = replace(policy, skip_idle=policy.skip_idle and prober.skips_idle)  # its cost
        self.prober, self.policy, self.seen, self.predict = prober, policy, seen, predict
        self.prediction: Prediction | None = None
        self.done = False
        self.others_low: float | None = None
        self.next: ProbeSpec | None = None
        self.cost_s = 0.0

    @property
    def state(self) -> SearchState:
        return SearchState(self.result, self.prediction, self.others_low)

    def anchor(self) -> None:
        """The floor and ceiling probes, then the prediction; the first rate probe wanted."""
        while isinstance(wanted := self.policy.next_probe(self.state), ProbeSpec):
            if wanted.kind == "rate":
                break
            try:
                self._run(wanted)
            except ProberGone as gone:
                self._finish(f"{gone}; no knee without its {wanted.kind} probe", gone=True)
                return
        self.result.ceiling = self.state.ceiling or None
        if isinstance(wanted, Done):
            self._finish(wanted.note)
            return
        if self.predict is not None:
            self.prediction = self.predict(self.result.strategy)
            self.result.predicted = None if self.prediction is None else self.prediction.knee
        self._want()

    def probe_rate(self) -> None:
        """Run the wanted probe, fit the knee again, and want the next one (or finish)."""
        assert self.next is not None
        try:
            self._run(self.next)
        except ProberGone as gone:
            probes = len(self.result.rate_probes)
            self._finish(f"{gone}; its knee from the {probes} rate probes before", gone=True)
            return
        policy, result = self.policy, self.result
        result.fit = fit_knee(
            [p.outcome.ratios for p in result.rate_probes],
            policy.target,
            policy.confidence,
            ceiling=result.ceiling,
        )
        self._want()

    def out_of_budget(self) -> None:
        assert self.next is not None
        self.result.budget_spent = True
        self.result.note = (
            f"budget spent before the probe at {self.next.rate:.4g} req/s "  # as its run is named
            f"(about {self.cost_s:.0f} s)"
        )

    def beside(self, others_low: float | None) -> None:
        """The lowest low end of the other strategies' knees (None: one has none); its next
        probe wanted again where that changed."""
        if others_low != self.others_low and not self.done:
            self.others_low = others_low
            self._want()

    def _want(self) -> None:
        wanted = self.policy.next_probe(self.state)
        if isinstance(wanted, Done):
            self._finish(wanted.note)
        else:
            self.next, self.cost_s = wanted, self.policy.cost(self.state, wanted)

    def _run(self, spec: ProbeSpec) -> Probe:
        outcome = self.prober.run(spec)
        quantile = probe_quantile(outcome.ratios, self.policy.target, self.policy.confidence)
        probe = Probe(spec, outcome, quantile)
        self.result.probes.append(probe)
        self.seen(self.result.strategy, probe)
        return probe

    def _finish(self, note: str, gone: bool = False) -> None:
        """Stop this strategy's search; resolved when its interval is within the resolution;
        `gone` where what served it is."""
        self.done = True
        self.result.gone = gone
        self.prober.done()
        self.result.resolved = self.result.width <= 1 + self.policy.resolution
        self.result.note = note


def widened_for_drift(results: list[StrategyResult], factor: float, resolution: float) -> None:
    """Each fitted knee's interval moved out by the machine's speed drift (`factor` >= 1) on
    each bounded side; resolved only if still within the resolution once widened."""
    for result in results:
        result.fit = None if result.fit is None else result.fit.widened(factor)
        result.resolved = result.resolved and result.width <= 1 + resolution


def find_knees(
    probers: Mapping[str, Prober],
    policy: ProbePolicy,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    seen: ProbeSeen = lambda strategy, probe: None,
    predict: Predict | None = None,
) -> list[StrategyResult]:
    """Each strategy's knee, in `probers`' order, within `budget_s` shared among them; `seen`
    hears of every probe as it ends; `predict` places each one's first rate probes. The
    anchors (and the predictions after them) always run; the budget governs rate probes."""
    deadline = clock() + budget_s
    searches = [
        StrategySearch(name, prober, policy, seen, predict) for name, prober in probers.items()
    ]
    for search in searches:
        search.anchor()
    while waiting := [s for s in searches if not s.done]:
        chosen = policy.pick([(s.state, s.cost_s) for s in waiting], deadline - clock())
        if chosen is None:
            for search in waiting:
                search.out_of_budget()
            break
        waiting[chosen].probe_rate()
        for search in searches:
            lows = [other.result.low for other in searches if other is not search]
            search.beside(None if not lows or None in lows else min(lows))
    return [s.result for s in searches]
