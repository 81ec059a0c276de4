"""The knee search on made-up systems (no model runs): where it probes, what it reports, how
the strategies share the budget; and on the tiny model, a strategy slowed on purpose."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from servelab.harness.search.estimator import Knee, fit_knee
from servelab.harness.search.policy import Prediction, ProbePolicy
from servelab.harness.search.probe_ratios import ProbeRatios, probe_quantile
from servelab.harness.search.probes import Outcome, Probe, ProbeSpec
from servelab.harness.search.result import StrategyResult
from servelab.harness.search.strategy_search import StrategySearch, find_knees

SETTINGS = ProbePolicy(
    target=0.9,
    resolution=0.2,
    requests=48,
    max_requests=192,
    floor_requests=8,
    ceiling_requests=16,
    confidence=0.95,
)
Z90 = 1.2815515655446004  # the standard normal's 0.9-quantile


class System:
    """A made-up strategy: the 0.9-quantile of its SLO ratios is (rate / knee)^slope, each
    request's ratio log-normal about it; a probe costs its requests / rate; the floor's
    requests meet the SLO with half their allowance to spare (or miss it 3x, knee 0)."""

    def __init__(self, knee: float, ceiling: float, slope: float = 4.0, clock: Clock | None = None):
        self.knee, self.top, self.slope = knee, ceiling, slope
        self.clock = clock or Clock()
        self.calls: list[tuple[str, float | None, int, int]] = []

    def ratios(self, rate: float, requests: int, rng: np.random.Generator) -> np.ndarray:
        median = self.slope * math.log(rate / self.knee) - 0.3 * Z90
        return np.exp(median + 0.3 * rng.standard_normal(requests))

    def _outcome(self, rate: float | None, ratios: np.ndarray, seconds: float) -> Outcome:
        self.clock.now += seconds
        values = ProbeRatios(rate, tuple(ratios.tolist()), (False,) * ratios.size)
        return Outcome("dir", values, self.top, seconds, seconds)

    def floor(self, requests: int) -> Outcome:
        self.calls.append(("floor", None, requests, 0))
        return self._outcome(None, np.full(requests, 0.5 if self.knee else 3.0), 1.0)

    def ceiling(self, requests: int) -> Outcome:
        self.calls.append(("ceiling", None, requests, 0))
        return self._outcome(None, np.full(requests, 5.0), 2.0)

    def at(self, rate: float, requests: int, draw: int = 0) -> Outcome:
        self.calls.append(("rate", rate, requests, draw))
        rng = np.random.default_rng([round(rate * 1e4), requests, draw])
        return self._outcome(rate, self.ratios(rate, requests, rng), requests / rate)

    skips_idle = True  # as the policy says: the probes cost what `ProbePolicy.cost` makes them

    def done(self) -> None:
        """Nothing to stop."""

    def run(self, spec: ProbeSpec) -> Outcome:
        if spec.kind == "floor":
            return self.floor(spec.requests)
        if spec.kind == "ceiling":
            return self.ceiling(spec.requests)
        assert spec.rate is not None
        return self.at(spec.rate, spec.requests, spec.draw)

    def rates(self) -> list[float]:
        return [rate for kind, rate, _, _ in self.calls if kind == "rate" and rate is not None]


class Clock:
    """One clock for one or several made-up systems: each probe advances it by its cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Cliff(System):
    """Every request meets the SLO with half its allowance to spare below `knee`, every one
    misses it above, by more with each arrival (a queue growing without end): the ratio
    jumps there."""

    def ratios(self, rate: float, requests: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(requests, 0.5) if rate <= self.knee else np.linspace(1.5, 40.0, requests)


def _search(system: System, budget_s: float = 1e6, **settings: object) -> StrategyResult:
    chosen = replace(SETTINGS, **settings)  # type: ignore[arg-type]
    return find_knees({"s": system}, chosen, budget_s, clock=system.clock)[0]


def test_a_smooth_knee_is_found_within_the_resolution_and_its_interval_covers_it() -> None:
    system = System(knee=3.0, ceiling=10.0, slope=2.5)
    knee = _search(system)
    assert knee.resolved and knee.note == ""
    assert knee.low is not None and knee.high is not None
    assert knee.low <= 3.0 <= knee.high and knee.high / knee.low <= 1.2
    assert system.rates()[0] == 5.0  # no prediction: half the ceiling first
    assert len(system.rates()) <= 12


def test_a_shallow_knee_is_narrowed_by_longer_probes_near_the_earlier_ones() -> None:
    """A shallow curve: probes 48 requests long bound its quantile too loosely for 20%; a
    probe placed by the fit is longer, at most twice the nearest earlier probe (in log rate)
    and at most max_requests, and the interval still covers the knee."""
    system = System(knee=3.0, ceiling=10.0, slope=1.5)
    knee = _search(system)
    lengths = [n for kind, _, n, _ in system.calls if kind == "rate"]
    assert max(lengths) > 48 and max(lengths) <= 192
    seen: list[tuple[float, int]] = []
    for kind, rate, n, _ in system.calls:
        if kind != "rate" or rate is None:
            continue
        if n > 48:
            nearest = min(seen, key=lambda probe: abs(math.log(probe[0] / rate)))
            assert n <= 2 * nearest[1], (rate, n, seen)
        seen.append((rate, n))
    assert knee.resolved and knee.low is not None and knee.high is not None
    assert knee.low <= 3.0 <= knee.high


def test_a_cliff_is_said_and_bracketed_within_the_resolution() -> None:
    knee = _search(Cliff(knee=3.0, ceiling=10.0))
    assert knee.fit is not None and knee.fit.cliff and knee.resolved
    assert knee.low is not None and knee.high is not None
    assert knee.low <= 3.0 < knee.high and knee.high / knee.low <= 1.2
    assert "cliff" in knee.note


def test_a_slo_missed_one_request_at_a_time_sustains_no_rate() -> None:
    system = System(knee=0.0, ceiling=10.0)
    knee = _search(system)
    assert "no rate is sustained" in knee.note and knee.low is None and knee.fit is None
    assert [kind for kind, *_ in system.calls] == ["floor"]


def test_a_slo_that_never_binds_puts_the_knee_at_the_ceiling() -> None:
    system = System(knee=1e6, ceiling=10.0)
    knee = _search(system)
    assert knee.resolved and knee.estimate is None and knee.high == 10.0
    assert knee.low is not None and 10.0 / knee.low <= 1.2


def test_no_rate_down_to_a_64th_of_the_ceiling_is_sustained() -> None:
    system = System(knee=0.01, ceiling=10.0)
    knee = _search(system)
    assert system.rates() == [float(f"{10.0 / 2**k:.4g}") for k in range(1, 7)]
    assert not knee.resolved and "no rate down to 0.156 req/s is sustained" in knee.note


def test_a_prediction_places_the_first_probes_where_it_says_they_decide() -> None:
    system = System(knee=3.0, ceiling=10.0)
    prediction = {"s": Prediction(2.5, 1.75, 3.25)}.get
    found = find_knees({"s": system}, SETTINGS, 1e6, system.clock, predict=prediction)[0]
    assert system.rates()[:2] == [1.75, 3.25] and found.predicted == 2.5
    assert found.resolved and found.low is not None and found.high is not None
    assert found.low <= 3.0 <= found.high


def test_a_simulated_knee_is_bisected_and_its_first_probes_go_where_they_decide() -> None:
    """On a made-up strategy as the simulation would run it: the point quantile's crossing
    found to the bisection's precision, and the nearest rates either side whose probes decide
    at the search's confidence (one step nearer, they do not)."""
    from servelab.harness.search.policy import STEP_OUT
    from servelab.harness.search.predict import simulated_knee

    def quantile(system: System, rate: float):
        return probe_quantile(system.at(rate, 48).ratios, 0.9, 0.95)

    system = System(knee=3.0, ceiling=10.0)
    predicted = simulated_knee(system, SETTINGS)
    assert predicted is not None and abs(math.log(predicted.knee / 3.0)) < math.log(1.1)
    assert predicted.below < predicted.knee < predicted.above
    assert quantile(system, predicted.below).high <= 1 < quantile(system, predicted.above).low
    assert quantile(system, predicted.below * STEP_OUT).high > 1
    assert quantile(system, predicted.above / STEP_OUT).low <= 1
    assert simulated_knee(System(knee=0.01, ceiling=10.0), SETTINGS) is None


def test_a_first_probe_certainly_over_the_knee_drops_the_higher_ones() -> None:
    system = System(knee=1.0, ceiling=10.0)
    prediction = {"s": Prediction(4.0, 2.8, 5.2)}.get
    find_knees({"s": system}, SETTINGS, 1e6, system.clock, predict=prediction)
    assert system.rates()[:2] == [2.8, 1.4]  # 5.2 not run; halving from 2.8


def test_a_probe_that_does_not_fit_the_budget_is_not_run() -> None:
    system = System(knee=3.0, ceiling=10.0)
    knee = _search(system, budget_s=20.0)  # floor 1 s, ceiling 2 s, 5 req/s: 9.6 s, then 2.5
    assert not knee.resolved and "budget spent before the probe at" in knee.note
    assert knee.budget_spent and system.clock.now <= 20.0


def test_only_a_search_the_budget_stopped_says_the_budget_ran_out() -> None:
    """A strategy whose ceiling served nothing ends there, whatever the budget; one stopped by
    the budget says so (what `servelab search` and the report name with "raise budget_s")."""
    clock = Clock()
    systems = {"nothing": System(3.0, 0.0, clock=clock), "s": System(3.0, 10.0, clock=clock)}
    nothing, stopped = find_knees(systems, SETTINGS, 20.0, clock)
    assert nothing.note == "the ceiling probe served nothing" and not nothing.budget_spent
    assert stopped.budget_spent and not stopped.resolved
    resolved = _search(System(knee=3.0, ceiling=10.0, slope=2.5))
    assert resolved.resolved and not resolved.budget_spent


def test_every_knee_gets_a_lower_end_before_any_bounded_one_is_narrowed() -> None:
    """Three strategies sharing a budget: every one's anchors run first, then no knee with a
    lower end is narrowed while another still has none; one whose high end falls below both
    others' low ends ends there (every ratio over it needs only that end)."""
    clock = Clock()
    systems = {n: System(k, 10.0, clock=clock) for n, k in [("a", 3.0), ("b", 1.5), ("c", 4.0)]}
    order: list[tuple[str, str]] = []
    knees = find_knees(systems, SETTINGS, 400.0, clock, lambda s, p: order.append((s, p.spec.kind)))
    assert order[:6] == [(n, kind) for n in "abc" for kind in ("floor", "ceiling")]
    rate_order = [s for s, kind in order[6:]]
    a, b, c = knees
    assert "below every other knee" in b.note and b.low is None
    assert b.high is not None and a.low is not None and c.low is not None
    assert b.high <= min(a.low, c.low) and a.low <= 3.0 <= a.high and c.low <= 4.0 <= c.high
    bounded_at = {}
    for name, knee in zip("ac", (a, c), strict=True):
        probes = knee.rate_probes
        first = next(i for i in range(len(probes)) if _low_after(knee, probes[: i + 1]))
        bounded_at[name] = [i for i, s in enumerate(rate_order) if s == name][first]
    last = max(bounded_at.values())
    for name in "ac":
        narrowing = [i for i, s in enumerate(rate_order) if s == name and i > bounded_at[name]]
        assert all(i > last for i in narrowing), (name, bounded_at, rate_order)
    assert clock.now <= 400.0


def _low_after(knee: StrategyResult, probes: list[Probe]) -> float | None:
    """The knee's low end after these of its probes."""
    found = fit_knee([p.outcome.ratios for p in probes], 0.9, 0.95, ceiling=knee.ceiling)
    return found.low


def test_a_knee_far_below_its_ceiling_does_not_starve_the_others() -> None:
    """ "a" misses at every rate down to a 64th of its ceiling, each halving twice the cost of
    the last; "b" and "c" still get a lower end in a budget that "a" alone would spend."""
    clock = Clock()
    systems = {n: System(k, 10.0, clock=clock) for n, k in [("a", 0.01), ("b", 3.0), ("c", 4.0)]}
    a, b, c = find_knees(systems, SETTINGS, 200.0, clock)
    assert a.low is None and b.low is not None and c.low is not None
    assert clock.now <= 200.0


def test_a_knee_below_every_other_ends_at_its_high_end() -> None:
    """ "slow" passes nothing down to a 32nd of its ceiling, each halving twice the cost of the
    last; once its first probe puts its high end below "b"'s low end it ends, its ratio to "b"
    one-sided, and "b" gets the budget and ends resolved."""
    clock = Clock()
    systems = {
        "slow": System(0.02, 1.0, clock=clock),
        "b": System(3.0, 10.0, slope=2.0, clock=clock),
    }
    order: list[tuple[str, float | None]] = []
    slow, b = find_knees(
        systems, SETTINGS, 1000.0, clock, lambda s, p: order.append((s, p.spec.rate))
    )
    rates = [(s, rate) for s, rate in order if rate is not None]
    assert rates[0] == ("slow", 0.5)  # no lower end, listed first
    assert [s for s, _ in rates].count("slow") == 1
    assert slow.low is None and slow.high == 0.5 and "below every other knee" in slow.note
    assert b.resolved and b.low is not None and b.low > 0.5
    assert clock.now <= 1000.0


def test_a_probe_line_says_what_ran_and_what_it_showed() -> None:
    from servelab.commands.search import probe_line

    stopped_ratios = ProbeRatios(0.58, (0.5,) * 10 + (3.0,) * 38, (False,) * 10 + (True,) * 38)
    stopped = Outcome("d", stopped_ratios, 0.9, 41.2, 40.0, stopped=True)
    line = probe_line(
        "vllm",
        Probe(ProbeSpec("rate", 48, 0.58), stopped, probe_quantile(stopped_ratios, 0.9, 0.95)),
    )
    assert line == (
        "  vllm: 0.58 req/s, 48 requests: ratio q >= 3 [3, inf], rising: over capacity, "
        "10/48 met the SLO (stopped early) (41 s)"
    )
    top_ratios = ProbeRatios(None, (2.0,) * 16, (False,) * 16)
    top = Outcome("d", top_ratios, 1.16, 16.0, 14.0)
    line = probe_line(
        "vllm", Probe(ProbeSpec("ceiling", 16), top, probe_quantile(top_ratios, 0.9, 0.95))
    )
    assert line == (
        "  vllm: all at once, 16 requests: ratio q 2 [2, inf], 0/16 met the SLO, "
        "1.16 req/s served (16 s)"
    )
    spread = np.random.default_rng(0).permutation(np.linspace(0.1, 1.0, 48))  # no trend
    waited_ratios = ProbeRatios(0.0507, tuple(spread.tolist()), (False,) * 48)
    waited = Outcome("d", waited_ratios, 0.05, 96.3, 950.0, idle_skipped_s=861.52)
    quantile = probe_quantile(waited_ratios, 0.9, 0.95)
    line = probe_line("fastertransformer", Probe(ProbeSpec("rate", 48, 0.0507), waited, quantile))
    assert line == (
        "  fastertransformer: 0.0507 req/s, 48 requests: ratio q 0.91 [0.828, 1], 48/48 met "
        "the SLO (96 s, 862 s idle skipped)"
    )


def test_a_strategy_slowed_on_purpose_moves_its_knee_down_by_the_factor(tmp_path) -> None:
    """The same search on the tiny model with every step delayed by d, then by 2d and every
    SLO limit doubled: the whole system runs twice as slow (the delay dwarfs the tiny model's
    own step), so its knee should about halve: the two intervals hold a ratio near 2. Static
    batching, whose waits grow with the load well before its throughput ceiling."""
    from servelab.harness.run.compose import compose
    from servelab.harness.run.run import run
    from servelab.harness.search.estimator import knee_ratio
    from servelab.harness.search.knee_search import search

    def knee_at(delay: float) -> StrategyResult:
        overrides = [
            "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false",
            "workload=random", "workload.input_len.dist=fixed", "workload.input_len.value=8",
            "workload.output_len.value=6", "engine.max_batch_size=8",
            f"+engine.test_step_delay_s={delay}", f"slo.e2e_s={16 * delay}",
            "+slo.attainment=0.75", "search.strategies=[fastertransformer]",
            "search.predict=false",
            "search.requests=32", "search.max_requests=64", "search.floor_requests=4",
            "search.ceiling_requests=32",
            "search.resolution=0.3",
            "search.budget_s=200", f"search.out_dir={tmp_path / str(delay)}",
        ]  # fmt: skip
        return search(overrides, compose, lambda cfg, d: run(cfg, d, progress=False)).knees[0]

    fast, slow = knee_at(0.04), knee_at(0.08)
    ratio = knee_ratio(fast.knee, slow.knee)  # the tiny model's own step time keeps it under 2
    assert ratio.low is not None and ratio.high is not None
    assert ratio.low <= 2.2 and ratio.high >= 1.6, (ratio.low, ratio.high)
    assert fast.resolved and slow.resolved
    centres = [math.sqrt(k.low * k.high) for k in (fast, slow) if k.low and k.high]
    assert centres[0] / centres[1] == pytest.approx(2.0, rel=0.3)
    for knee, delay in ((fast, 0.04), (slow, 0.08)):  # as search.json records it
        recorded = json.loads((tmp_path / str(delay) / "search.json").read_text())["knees"][0]
        assert (recorded["low"], recorded["high"]) == pytest.approx((knee.low, knee.high))
        assert [p["run_dir"] for p in recorded["probes"]] == [
            p.outcome.run_dir for p in knee.probes
        ]
        draws = [(p["draws"], p["counted"]) for p in recorded["probes"] if p["kind"] == "rate"]
        assert draws and all(0 < d <= counted for d, counted in draws)


def test_scaled_limits_are_multiples_of_the_reference_floor(tmp_path) -> None:
    """`search.slo_scale`: one floor run of the first strategy, then every probe of every
    strategy runs under limits that are those multiples of it (one prompt length: TTFT's
    line is its median, with no per-token part; giving one too is refused, `test_shared_slo`).
    The multiples are wide: the tiny model's floor takes milliseconds, which a busy machine
    doubles."""
    import json

    from omegaconf import OmegaConf

    from servelab.harness.run.compose import compose
    from servelab.harness.run.run import run
    from servelab.harness.search.knee_search import search

    overrides = [
        "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
        "workload.input_len.dist=fixed", "workload.input_len.value=8",
        "workload.output_len.value=6", "search.strategies=[fastertransformer,vllm]",
        "search.predict=false",
        "search.slo_scale.ttft_s=40", "search.slo_scale.normalized_latency_s=20",
        "search.floor_requests=3",
        "search.ceiling_requests=4",
        "search.budget_s=0.01", f"search.out_dir={tmp_path}",
    ]  # fmt: skip
    said: list[str] = []
    search(overrides, compose, lambda cfg, d: run(cfg, d, progress=False), say=said.append)
    reference = json.loads(
        (tmp_path / "fastertransformer/reference-floor/summary.json").read_text()
    )
    ttft = 40 * reference["ttft"]["p50"]
    normalized = 20 * reference["normalized_latency"]["p50"]
    out = "\n".join(said)
    assert said[0].startswith("device: ") and "fp32 (set)" in said[0]  # said first
    assert "SLO scaled from fastertransformer's requests one at a time" in out
    assert "machine speed: one request at a time, median TPOT" in out
    recorded = json.loads((tmp_path / "search.json").read_text())["drift"]
    end = json.loads((tmp_path / "fastertransformer/reference-floor-end/summary.json").read_text())
    assert recorded["after_s"] == end["tpot"]["p50"]
    assert recorded["before_s"] == reference["tpot"]["p50"]
    for probe in ("fastertransformer/floor", "fastertransformer/ceiling", "vllm/floor"):
        slo = OmegaConf.load(tmp_path / probe / "config.yaml").slo
        assert (slo.ttft_s, slo.normalized_latency_s) == pytest.approx((ttft, normalized)), probe
        assert slo.ttft_per_prompt_token_s is None, probe


def test_a_scaled_limit_must_name_a_limit() -> None:
    from servelab.base.errors import ConfigError
    from servelab.harness.run.compose import compose
    from servelab.harness.search.knee_search import SearchSettings

    with pytest.raises(ConfigError, match=r"search\.slo_scale\.ttft: not a limit"):
        SearchSettings.of(compose(["+search.slo_scale.ttft=4"]))


def test_a_probe_too_short_to_bound_the_quantile_is_refused_before_any_run() -> None:
    """The 0.9-quantile of 35 requests has no upper bound at 95% (1 - 0.9^35 < 0.975): no
    probe that short could show a rate sustained."""
    from servelab.base.errors import ConfigError
    from servelab.harness.run.compose import compose
    from servelab.harness.search.knee_search import SearchSettings

    with pytest.raises(ConfigError, match=r"search\.requests: 35 requests .* at least 36"):
        SearchSettings.of(compose(["slo.ttft_s=1", "search.requests=35"]))
    assert SearchSettings.of(compose(["slo.ttft_s=1", "search.requests=36"])).policy.requests == 36


def test_each_draw_of_a_probe_is_the_workload_with_its_seed_moved_in_its_own_directory(
    tmp_path: Path,
) -> None:
    """The prober behind `servelab search`: a probe's draw is a new run on other requests
    (workload seed + draw, its own directory), never an earlier probe's run reused; its
    requests come back as their SLO ratios."""
    from servelab.harness.run.compose import compose
    from servelab.harness.search.probes import RunProber, SimulatedClock

    seen: list[tuple[int, str, str, object]] = []

    def record(cfg, run_dir: Path) -> dict:
        arrival = cfg.workload.arrival
        seen.append((int(cfg.workload.seed), run_dir.name, arrival.process, arrival.rate))
        run_dir.mkdir(parents=True)
        line = {"id": "a", "prompt_len": 4, "output_len": 2, "t_scheduled": 0.0,
                "token_times": [0.5, 0.6], "output_ids": [1, 2], "finish_reason": "length",
                "t_done": 0.6}  # fmt: skip
        (run_dir / "requests.jsonl").write_text(json.dumps(line) + "\n")
        return {"status": "complete", "duration_s": 1.0, "request_throughput": 1.0}

    cfg = compose(["slo.ttft_s=1", "strategy=vllm"])
    simulated = SimulatedClock()  # over simulated runs the budget counts simulated seconds
    prober = RunProber(cfg, tmp_path / "vllm", 0.95, record, simulated)
    first = prober.run(ProbeSpec("rate", 4, 0.5))
    prober.run(ProbeSpec("rate", 4, 0.5, draw=2))
    prober.run(ProbeSpec("floor", 3))
    assert seen == [
        (0, "rate-0.5-n4", "poisson", 0.5),
        (2, "rate-0.5-n4-draw2", "poisson", 0.5),
        (0, "floor", "closed_loop", cfg.workload.arrival.rate),
    ]
    assert cfg.workload.arrival.process == "offline" and cfg.slo.stop_early is None  # untouched
    assert first.seconds == 1.0 and simulated() == 3.0
    assert first.ratios == ProbeRatios(0.5, (0.5,), (False,))


def test_a_probe_that_skips_its_idle_spans_is_costed_at_its_busy_time() -> None:
    """The floor served 8 requests in 1 s: 0.125 s each alone. At half the ceiling (5 req/s,
    0.2 s apart) a probe's 48 requests span 9.6 s; skipping the idle between them, about
    48 x 0.125 = 6 s. Both add the drain of one request alone (the ceiling loaded nothing)."""

    def first_cost(settings: ProbePolicy) -> float:
        search = StrategySearch("s", System(knee=3.0, ceiling=10.0), settings, lambda s, p: None)
        search.anchor()
        return search.cost_s

    assert first_cost(SETTINGS) == pytest.approx(48 * 0.2 + 0.125)
    assert first_cost(replace(SETTINGS, skip_idle=True)) == pytest.approx(48 * 0.125 + 0.125)


def test_a_predicted_search_profiles_once_and_starts_its_probes_around_the_prediction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`search.predict` on the tiny model: one step profile for both strategies (they serve
    the same model), each strategy's model calibrated on the search's real runs when its
    anchors have run, its knee simulated under the same SLO, and its first rate probe at
    the rate below its predicted knee where a simulated probe decided (below the ceiling; run,
    or named as the probe the budget had no room for). The step errors leave out the runs a
    model was calibrated on."""
    from servelab.harness.measure.rundir import read_steps
    from servelab.harness.run.compose import compose
    from servelab.harness.run.run import run
    from servelab.harness.run.simulate.cost_model import StepCostModel, measured_steps
    from servelab.harness.run.simulate.step_errors import search_step_errors
    from servelab.harness.search import predict
    from servelab.harness.search.knee_search import search

    calibrated_on: dict[str, list[str]] = {}

    def profiling(cfg, out_dir: Path, runs) -> Path:
        calibrated_on[str(cfg.strategy.name)] = [f"{r.parent.name}/{r.name}" for r in runs]
        return profiled(cfg, out_dir, runs)

    profiled = predict.profiled
    monkeypatch.setattr(predict, "profiled", profiling)

    overrides = [
        "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
        "workload.input_len.dist=fixed", "workload.input_len.value=8",
        "workload.output_len.value=6", "search.strategies=[fastertransformer,vllm]",
        "slo.e2e_s=0.5", "search.floor_requests=3", "search.ceiling_requests=8",
        "search.budget_s=20", f"search.out_dir={tmp_path}",
    ]  # fmt: skip
    result = search(overrides, compose, lambda cfg, d: run(cfg, d, progress=False))
    assert calibrated_on == {
        "fastertransformer": ["fastertransformer/ceiling", "fastertransformer/floor"],
        "vllm": ["fastertransformer/ceiling", "fastertransformer/floor", "vllm/ceiling",
                 "vllm/floor"],
    }  # fmt: skip
    assert capsys.readouterr().out.count("profiling this machine's steps") == 1
    models = result.record["cost_models"]
    for knee in result.knees:
        model = StepCostModel.load(Path(models[knee.strategy]))
        assert len(model.calibrated_on) == len(calibrated_on[knee.strategy])
        assert set(model.kind_scale) == {"prefill", "decode", "mixed"}
        assert knee.predicted is not None and knee.predicted > 0 and knee.ceiling is not None
        assert (tmp_path / "predicted" / knee.strategy / "ceiling" / "summary.json").is_file()
        if knee.rate_probes:  # it ran; else the budget was spent before it, and it says so
            first = knee.rate_probes[0].spec.rate
        else:
            first = float(knee.note.split("before the probe at ")[1].split(" req/s")[0])
        simulated = tmp_path / "predicted" / knee.strategy / f"rate-{first:.4g}-n48"
        halfway = first == pytest.approx(knee.ceiling / 2, rel=5e-3)  # none below the ceiling
        assert halfway or (first < knee.predicted and simulated.is_dir())
    recorded = json.loads((tmp_path / "search.json").read_text())
    assert [k["predicted"] for k in recorded["knees"]] == [k.predicted for k in result.knees]
    checked = {e.strategy: e.kinds[-1].errors.steps for e in search_step_errors(tmp_path)}
    for knee in result.knees:  # held out: the rate probes alone
        runs = [read_steps(Path(p.outcome.run_dir)) for p in knee.rate_probes]
        assert checked.get(knee.strategy, 0) == len(measured_steps(runs))


def test_the_prediction_is_set_beside_what_was_measured() -> None:
    from servelab.reports.search_report import predicted_text

    def measured(low: float | None, high: float | None) -> StrategyResult:
        return StrategyResult("s", predicted=1.12, fit=Knee(None, low, high, True, ()))

    inside = "1.12 (inside the measured interval)"
    assert predicted_text(measured(1.09, 1.31)) == inside
    assert predicted_text(measured(None, 1.2)) == inside
    assert predicted_text(measured(None, 0.56)) == "1.12 (the measured interval ends 50% below it)"
    assert predicted_text(measured(1.4, None)) == "1.12 (the measured interval starts 25% above it)"
    assert predicted_text(StrategyResult("s")) == "-"


def test_the_probes_that_shared_the_machine_are_named(tmp_path: Path) -> None:
    from servelab.harness.search.knee_search import flagged_probes

    for name, codes in [("vllm/rate-1", ["busy_machine"]), ("orca/rate-2", ["send_lag"]),
                        ("predicted/vllm/rate-3", ["busy_machine"])]:  # fmt: skip
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "summary.json").write_text(json.dumps({"flag_codes": codes}))
    assert flagged_probes(tmp_path, "busy_machine") == ["vllm/rate-1"]  # not simulated ones
    assert flagged_probes(tmp_path, "send_lag") == ["orca/rate-2"]


def test_a_probe_spans_enough_service_times_and_leaves_its_warm_up_out() -> None:
    """The floor served 8 requests in 1 s: 0.125 s each alone. With `span` 200 such times
    (25 s), the first probe at 5 req/s counts 125 requests, not the 48 the precision asks, and
    with `warmup` 40 (5 s) its first 25 arrivals are a warm-up on top; the probe's config
    leaves them out of the metrics, and its cost counts them."""
    from servelab.harness.run.compose import compose
    from servelab.harness.search.probes import probe_config

    policy = replace(SETTINGS, span=200.0, warmup=40.0)
    search = StrategySearch("s", System(knee=3.0, ceiling=10.0), policy, lambda s, p: None)
    search.anchor()
    assert search.next == ProbeSpec("rate", 150, 5.0, 0, 25, "span")
    assert search.cost_s == pytest.approx(150 * 0.2 + 0.125)
    probe = probe_config(compose(["slo.ttft_s=1"]), search.next, 0.95)
    assert probe.workload.warmup.requests == 25 and probe.workload.num_requests == 150
    short = replace(SETTINGS, span=8.0, warmup=0.0)  # 1 s at 5 req/s: the precision's 48
    search = StrategySearch("s", System(knee=3.0, ceiling=10.0), short, lambda s, p: None)
    search.anchor()
    assert search.next == ProbeSpec("rate", 48, 5.0, 0, 0, "precision")


def test_a_probe_after_one_whose_misses_came_in_runs_asks_for_as_many_draws() -> None:
    """A probe whose misses came in one run of 12 (a burst in one queue) stands for fewer
    draws than its 240 requests; the next probe near it is longer by its requests per draw,
    up to `max_requests`, and on a draw of its own."""
    from servelab.harness.search.policy import SearchState
    from servelab.harness.search.probes import Probe

    def probe(rate: float, ratios: np.ndarray, draw: int) -> Probe:
        values = ProbeRatios(rate, tuple(ratios.tolist()), (False,) * ratios.size)
        outcome = Outcome("dir", values, None, 10.0, 10.0)
        return Probe(
            ProbeSpec("rate", ratios.size, rate, draw), outcome, probe_quantile(values, 0.9, 0.95)
        )

    system = System(knee=3.0, ceiling=10.0)
    search = StrategySearch("s", system, SETTINGS, lambda s, p: None)
    search.anchor()
    burst = np.where((np.arange(240) >= 100) & (np.arange(240) < 124), 3.0, 0.5)
    apart = np.where(np.arange(240) % 10 == 0, 3.0, 0.5)
    for ratios, longer in ((burst, True), (apart, False)):
        result = search.result
        result.probes = result.probes[:2] + [probe(2.0, ratios, 0)]
        quantile = result.probes[-1].quantile
        assert (quantile.dependence > 4) == longer
        spec = SETTINGS._spec(SearchState(result), 2.2, lambda rate: 48)
        assert spec.draw == 1
        assert spec.requests == (min(math.ceil(48 * quantile.dependence), 192) if longer else 48)


def test_a_negative_span_is_refused_before_any_run() -> None:
    from servelab.base.errors import ConfigError
    from servelab.harness.run.compose import compose
    from servelab.harness.search.knee_search import SearchSettings

    with pytest.raises(ConfigError, match=r"search\.warmup: -1 must be a number >= 0"):
        compose(["slo.ttft_s=1", "search.warmup=-1"])
    assert SearchSettings.of(compose(["slo.ttft_s=1", "search.span=30"])).policy.span == 30
