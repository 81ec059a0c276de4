"""The knee search judged against knees it cannot know: its own code on synthetic strategies.

`make run` answers one question: how much more load each strategy sustains than the next, at
one SLO, on this machine. Whether its intervals hold that answer (coverage) and how narrow they
are (width) cannot be read off one real run, whose true knees nobody knows; here they are
known. Each simulated `make run` is the search's real procedure
(`strategy_search.find_knees`: anchors, rate probes placed by the policy, the shared budget;
the reference floor before and after, and the drift's widening, `widened_for_drift`) over
synthetic strategies, on a simulated clock and a machine whose speed drifts:

- A strategy's request, served at Poisson rate r, has the SLO ratio
  `base / speed * X * (1 + steepness * rho / (1 - rho))` with rho = r / (capacity * speed):
  flat at the floor's ratio while the load is light, rising as the queue forms near capacity
  (the shape the real probes show). X is log-normal (`sigma`) with a share of outliers (`tail`
  of the requests `tail_factor` times slower: static batching's long waits). Over capacity
  the queue grows through the probe: each later request waits longer, and the search sees the
  rise.
- Its true knee, at the speed of the search's start (where the SLO was scaled), is where the
  `target`-quantile of that ratio crosses 1 (solved from the mixture's quantile). Four are
  defined, as the published searches measured them (floor ratio about 0.54; knees about 1.2,
  0.6, 0.6 and 0.06 req/s for vllm, orca, orca-chunked, fastertransformer); a search compares
  `make run`'s (`search.strategies`) unless `--strategies` names others.
- The machine's speed moves linearly from 1 at the start to `1 + drift` at the budget's end
  (or the opposite way), every latency divided by it and every capacity multiplied.
- The simulator's prediction, which places each strategy's first rate probes, is its true
  knee times a log-normal error (`prediction_spread`; the published searches' predictions
  were off by up to 1.4x), its first probes at 0.7x and 1.3x of it (where its simulated
  probes decide, about), or absent.
- A probe costs what it would on the machine (its requests' span at its rate, or their
  service one at a time where the probe skips idle spans, plus loading), so the budget binds
  as it does in `make run`.

Printed per strategy and per pair of strategies: the share of searches whose interval holds
the true knee (the ratio of true knees), the median and 80th-percentile width (high / low),
the share with both ends bounded (a ratio decided two-sided), and for a pair the share whose
ratio's low end is above 1 (the faster one's lead shown, "at least Nx").

    python -m scripts.search_study [--searches 200] [--drift 0.2] [--budget-s 840] [--seed 0]
        [--strategies fastertransformer,orca,vllm]

`--scenario h100` judges the search at a GPU's speed instead, on the engine behind the
simulator's clock (`scripts.search_study_gpu`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import combinations

import numpy as np

from servelab.harness.measure.drift import Drift
from servelab.harness.run.compose import compose
from servelab.harness.search.estimator import knee_ratio
from servelab.harness.search.knee_search import SearchSettings
from servelab.harness.search.policy import Prediction, ProbePolicy
from servelab.harness.search.probe_ratios import ProbeRatios
from servelab.harness.search.probes import Outcome, ProbeSpec
from servelab.harness.search.result import StrategyResult
from servelab.harness.search.strategy_search import find_knees, widened_for_drift

# the search's settings as `make run` runs it: conf/config.yaml's, probes skipping idle spans
MAKE_RUN_CONFIG = compose(["replay.skip_idle=true", "search.slo_scale.normalized_latency_s=2"])
MAKE_RUN = SearchSettings.of(MAKE_RUN_CONFIG).policy
COMPARED = ",".join(MAKE_RUN_CONFIG.search.strategies)  # make run's strategies
PREDICTED_BELOW, PREDICTED_ABOVE = 0.7, 1.3  # a prediction's first probes, as knee shares
OVER_CAPACITY_GROWTH = 0.05  # over capacity, each later request's ratio grows by this x (rho - 1)


@dataclass(frozen=True)
class Strategy:
    """A synthetic strategy: how its requests' SLO ratios grow with the load."""

    name: str
    capacity: float  # req/s a Poisson load can approach at the start's speed
    ceiling: float  # req/s served with every request at once (batching's best)
    base: float = 0.54  # the median ratio of a request served alone
    sigma: float = 0.05  # log-normal spread of a request's ratio
    tail: float = 0.02  # share of requests that are slow outliers
    tail_factor: float = 2.5  # how much slower an outlier is
    steepness: float = 0.05  # the queue's growth near capacity
    alone_s: float = 1.4  # one request served alone, at the start's speed
    load_s: float = 3.0  # a probe's loading and drain

    @cached_property
    def _spread_sample(self) -> np.ndarray:
        """A large sample of X (the ratio over base), for its quantiles."""
        return self._spread(np.random.default_rng(12345), 400_000)

    def _spread(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.exp(self.sigma * rng.standard_normal(n))
        return np.where(rng.random(n) < self.tail, x * self.tail_factor, x)

    def true_knee(self, target: float) -> float:
        """The rate where the `target`-quantile of the ratio is 1, at the start's speed."""
        level = self.base * float(np.quantile(self._spread_sample, target))
        if level >= 1:
            return 0.0
        load = (1 / level - 1) / self.steepness  # rho / (1 - rho)
        return self.capacity * load / (1 + load)

    def ratios(self, rng: np.random.Generator, n: int, rate: float | None, speed: float) -> list:
        """The SLO ratios of `n` requests in arrival order: at Poisson `rate` (None: one at a
        time) on a machine at `speed`."""
        alone = self.base / speed * self._spread(rng, n)
        if rate is None:
            return alone.tolist()
        rho = rate / (self.capacity * speed)
        if rho < 1:
            return (alone * (1 + self.steepness * rho / (1 - rho))).tolist()
        queue = 1 + self.steepness * 20 + OVER_CAPACITY_GROWTH * (rho - 1) * np.arange(n) * 20
        return (alone * queue).tolist()


COMPARISON = (
    Strategy("fastertransformer", capacity=0.12, ceiling=1.4, base=0.54, sigma=0.08, tail=0.06,
             tail_factor=3.0, steepness=0.5, alone_s=1.4),
    Strategy("orca", capacity=0.66, ceiling=2.8),
    Strategy("orca-chunked", capacity=0.64, ceiling=3.0),
    Strategy("vllm", capacity=1.3, ceiling=3.5),
)  # fmt: skip


class Machine:
    """The simulated clock and the machine's speed along it: 1 at the start, moving linearly
    to `1 + drift` by `span_s`."""

    def __init__(self, drift: float, span_s: float) -> None:
        self.now, self.drift, self.span_s = 0.0, drift, span_s

    def __call__(self) -> float:
        return self.now

    @property
    def speed(self) -> float:
        return 1 + self.drift * min(self.now / self.span_s, 1.0)


class SyntheticProber:
    """One strategy's probes on the machine: ratios drawn at the speed of the probe's start,
    the clock moved by what the probe would take."""

    def __init__(self, strategy: Strategy, machine: Machine, rng: np.random.Generator) -> None:
        self.strategy, self.machine, self.rng = strategy, machine, rng

    skips_idle = True  # a probe takes its busy time (`make run` skips idle spans)

    def done(self) -> None:
        """Nothing to stop."""

    def run(self, spec: ProbeSpec) -> Outcome:
        s, speed = self.strategy, self.machine.speed
        alone_s = s.alone_s / speed
        if spec.kind == "ceiling":
            served_s = spec.requests / (s.ceiling * speed)
            ratios = [10.0] * spec.requests
            throughput = spec.requests / served_s
        else:
            rate = spec.rate if spec.kind == "rate" else None
            ratios = s.ratios(self.rng, spec.requests, rate, speed)[spec.warmup :]
            each_s = alone_s if rate is None else min(1 / rate, alone_s)
            served_s = spec.requests * each_s
            throughput = None
        seconds = served_s + s.load_s
        self.machine.now += seconds
        probe = ProbeRatios(spec.rate, tuple(ratios), (False,) * len(ratios))
        return Outcome(f"{s.name}/{spec.name}", probe, throughput, seconds, served_s)


@dataclass(frozen=True)
class Scenario:
    """What one simulated `make run` faces."""

    budget_s: float = 840.0
    drift: float = 0.2  # the speed's move over the budget (half the searches each way)
    prediction_spread: float | None = 0.3  # None: no prediction


def one_search(
    strategies: tuple[Strategy, ...], settings: ProbePolicy, scenario: Scenario, drift: float,
    seed: int,
) -> list[StrategyResult]:  # fmt: skip
    """A whole search with the speed moving by `drift`: the reference floor, every knee within
    the budget (its first probes around a prediction), the reference floor again, and the
    knees widened by the drift the two floors measured."""
    rng = np.random.default_rng(seed)
    spread = scenario.prediction_spread
    predicted = (
        None
        if spread is None
        else {
            s.name: s.true_knee(settings.target) * math.exp(spread * rng.normal())
            for s in strategies
        }
    )
    machine = Machine(drift, scenario.budget_s)
    reference = strategies[0]
    machine.now += settings.floor_requests * reference.alone_s + reference.load_s
    before = 1 / machine.speed
    probers = {s.name: SyntheticProber(s, machine, rng) for s in strategies}
    left_s = scenario.budget_s - machine.now

    def predict(strategy: str) -> Prediction:
        assert predicted is not None
        knee = predicted[strategy]
        return Prediction(knee, PREDICTED_BELOW * knee, PREDICTED_ABOVE * knee)

    knees = find_knees(probers, settings, left_s, machine, predict=predict if predicted else None)
    widened_for_drift(knees, Drift(before, 1 / machine.speed).factor, settings.resolution)
    return knees


def covers(low: float | None, high: float | None, truth: float) -> bool:
    """Whether [low, high] holds `truth`, an unbounded side holding everything beyond."""
    return (low is None or low <= truth) and (high is None or truth <= high)


def width(low: float | None, high: float | None) -> float:
    return math.inf if low is None or high is None or low <= 0 else high / low


@dataclass(frozen=True)
class Row:
    """Coverage and widths of one knee or one ratio over every simulated search."""

    name: str
    truth: float
    covered: float  # share of searches whose interval holds the truth
    median_width: float
    p80_width: float
    bounded: float  # share with both ends bounded
    separated: float | None = None  # a ratio: share whose low end is above 1 (a lead shown)

    def line(self) -> str:
        separated = "-" if self.separated is None else f"{self.separated:.1%}"
        return (
            f"{self.name:34s} {self.truth:8.3g} {self.covered:9.1%} {self.median_width:9.3g} "
            f"{self.p80_width:9.3g} {self.bounded:8.1%} {separated:>9s}"
        )


HEADER = (
    f"{'':34s} {'truth':>8s} {'coverage':>9s} {'median':>9s} {'p80':>9s} {'bounded':>8s} "
    f"{'separated':>9s}"
)


def row(
    name: str, truth: float, intervals: list[tuple[float | None, float | None]], ratio: bool
) -> Row:
    widths = sorted(width(low, high) for low, high in intervals)
    return Row(
        name,
        truth,
        sum(covers(low, high, truth) for low, high in intervals) / len(intervals),
        float(np.quantile(widths, 0.5, method="lower")),
        float(np.quantile(widths, 0.8, method="lower")),
        sum(w < math.inf for w in widths) / len(widths),
        sum((low or 0.0) > 1 for low, _ in intervals) / len(intervals) if ratio else None,
    )


def evaluate(
    strategies: tuple[Strategy, ...], settings: ProbePolicy, scenario: Scenario, searches: int,
    seed: int = 0,
) -> list[Row]:  # fmt: skip
    """`searches` simulated searches, half with the speed rising by the scenario's drift and
    half falling: a row per knee, then per pair (the higher true knee over the lower)."""
    runs = [
        one_search(strategies, settings, scenario, scenario.drift * (-1) ** (i + 1), seed + i)
        for i in range(searches)
    ]
    return rows_of({s.name: s.true_knee(settings.target) for s in strategies}, runs)


def rows_of(truths: dict[str, float], runs: list[list[StrategyResult]]) -> list[Row]:
    """A row per knee (each search's knees in `truths`' order), then per pair (the higher true
    knee over the lower), over every search in `runs`."""
    rows = [
        row(name, truth, [(knees[i].low, knees[i].high) for knees in runs], ratio=False)
        for i, (name, truth) in enumerate(truths.items())
    ]
    names = list(truths)
    for a, b in combinations(range(len(names)), 2):
        top, bottom = (a, b) if truths[names[a]] >= truths[names[b]] else (b, a)
        ratios = [knee_ratio(knees[top].knee, knees[bottom].knee) for knees in runs]
        truth = truths[names[top]] / truths[names[bottom]]
        name = f"{names[top]} / {names[bottom]}"
        rows.append(row(name, truth, [(q.low, q.high) for q in ratios], ratio=True))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--searches", type=int, default=None, help="simulated make runs (200; h100: 10)"
    )
    parser.add_argument("--drift", type=float, default=0.2, help="speed change over the budget")
    parser.add_argument("--budget-s", type=float, default=840.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prediction-spread", type=float, default=0.3,
        help="log-normal spread of the predicted knees around the true ones",
    )  # fmt: skip
    parser.add_argument("--no-prediction", action="store_true", help="search without one")
    parser.add_argument(
        "--scenario", choices=("cpu", "h100"), default="cpu",
        help="cpu: synthetic strategies fitted to this CPU; h100: the engine on the simulator",
    )  # fmt: skip
    parser.add_argument("--setup", default="embedded", help="h100: embedded or llama3-8b")
    parser.add_argument(
        "--strategies", default=COMPARED, help=f"the strategies compared ({COMPARED})"
    )
    parser.add_argument(
        "--span", type=float, default=None, help="search.span: a rate probe's requests alone"
    )
    parser.add_argument(
        "--warmup", type=float, default=None, help="search.warmup: its warm-up, requests alone"
    )
    args = parser.parse_args(argv)
    args.searches = args.searches or (10 if args.scenario == "h100" else 200)
    if args.scenario == "h100":
        from scripts.search_study_gpu import main as gpu_main

        gpu_main(args)
        return
    if args.searches < 1 or args.budget_s <= 0 or not -0.9 < args.drift < 9:
        parser.error("--searches >= 1, --budget-s > 0, --drift in (-0.9, 9)")
    if args.prediction_spread < 0:
        parser.error("--prediction-spread >= 0")
    spread = None if args.no_prediction else args.prediction_spread
    scenario = Scenario(args.budget_s, args.drift, spread)
    synthetic = {s.name: s for s in COMPARISON}
    names = [name for name in args.strategies.split(",") if name]
    if not names or any(name not in synthetic for name in names):
        parser.error(f"--strategies: some of {', '.join(synthetic)}")
    strategies = tuple(synthetic[name] for name in names)
    policy = replace(
        MAKE_RUN,
        span=MAKE_RUN.span if args.span is None else args.span,
        warmup=MAKE_RUN.warmup if args.warmup is None else args.warmup,
    )
    rows = evaluate(strategies, policy, scenario, args.searches, args.seed)
    predicted = "no prediction" if spread is None else f"predictions off by x e^N(0, {spread:g})"
    print(
        f"{args.searches} simulated searches, {args.budget_s:g} s each, the machine's speed "
        f"moving by {args.drift:+.0%} and {-args.drift:+.0%} over the budget (half each), "
        f"{predicted}; search.span={policy.span:g} search.warmup={policy.warmup:g}"
    )
    print(HEADER)
    print("\n".join(r.line() for r in rows))


if __name__ == "__main__":
    main()
